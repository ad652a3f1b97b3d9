"""``capture``: pair a model with the exact keyword arguments it is exported with."""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Mapping
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._capture.vision_inputs import packed_input_axes, precomputed_input_names
from hfx._errors import InputError, describe
from hfx._records import Capture, DynamicShapes

# Keyword arguments that transformers' forward wrappers accept without naming them in the signature.
_WRAPPER_KWARGS = frozenset({"return_dict", "output_attentions", "output_hidden_states", "use_cache"})


def accepted_inputs(model: torch.nn.Module) -> frozenset[str] | None:
    """Return the keyword arguments ``model.forward`` accepts, or ``None`` when it takes any.

    Besides its declared ones, a packed-image model's forward takes its
    towers' precomputed inputs (``image_cu_seqlens`` …, see ``hfx.vision_inputs``).
    """
    params = inspect.signature(model.forward).parameters.values()
    names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            typed = _typed_kwargs(p.annotation)
            if typed is None:
                return None
            names |= typed | _WRAPPER_KWARGS | precomputed_input_names(model)
    return frozenset(names)


def _typed_kwargs(annotation: Any) -> frozenset[str] | None:
    """Keys of ``**kwargs: Unpack[SomeTypedDict]``; ``None`` for an untyped ``**kwargs``."""
    if typing.get_origin(annotation) is not typing.Unpack:
        return None
    (typed_dict,) = typing.get_args(annotation)
    keys: set[str] = set()
    for klass in getattr(typed_dict, "__mro__", (typed_dict,)):
        keys.update(getattr(klass, "__annotations__", {}))
    return frozenset(keys) if keys else None


def check_inputs(model: torch.nn.Module, inputs: Mapping[str, Any], *, stage: str, name: str) -> None:
    """Raise ``InputError`` naming every key of ``inputs`` that ``model.forward`` does not take."""
    accepted = accepted_inputs(model)
    unknown = sorted(set(inputs) - accepted) if accepted is not None else []
    if unknown:
        what = f"forward() does not take input(s) {unknown}."
        todo = f"Remove them or rename them to one of {sorted(accepted)}."
        raise InputError(describe(stage, model, name, what, todo))


@curry
def capture(
    inputs: Mapping[str, Any],
    model: torch.nn.Module,
    /,
    *,
    dynamic_shapes: DynamicShapes | None = None,
    name: str = "model",
) -> Capture:
    """Capture ``model`` with a private copy of ``inputs``, the keyword arguments of its forward.

    Args:
        inputs: keyword arguments for ``model.forward`` (a dict or a tokenizer's ``BatchEncoding``).
        model: the model to export; it is not modified.
        dynamic_shapes: named dynamic axes to use instead of ``infer_dynamic_shapes``. Without them,
            inputs that hold a packed-image model's precomputed tower inputs (``hfx.vision_inputs``)
            get the inferred axes plus those of the packed inputs (``image_patches``, ``image_count``,
            ``image_boundaries`` …), so one graph takes any number and size of images.
        name: the component name used in errors and in saved files.

    Returns:
        A frozen ``Capture``. ``capture(inputs)`` alone is a stage ``model -> Capture``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``inputs`` is not a mapping.
        InputError: an input the model's forward does not take.

    Example:
        >>> import torch
        >>> c = capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
        >>> sorted(c.kwargs)
        ['input']
    """
    if not isinstance(model, torch.nn.Module):
        msg = f"capture: model must be a torch.nn.Module, got {type(model).__name__}"
        raise TypeError(msg)
    if not isinstance(inputs, Mapping):
        msg = f"capture: inputs must be a mapping of forward() keyword arguments, got {type(inputs).__name__}"
        raise TypeError(msg)
    check_inputs(model, inputs, stage="capture", name=name)
    captured = Capture(module=model, source=model, kwargs=copy.deepcopy(dict(inputs)), name=name)
    if dynamic_shapes is None:
        dynamic_shapes = _packed_image_shapes(captured)
    return attrs.evolve(captured, dynamic_shapes=dynamic_shapes)


def _packed_image_shapes(captured: Capture) -> DynamicShapes | None:
    """The inferred shapes with the packed-image inputs' axes named (patches, images, boundaries); ``None`` without them.

    No name rule tells a packed model's ``pixel_values`` (``[patches, features]``)
    or its towers' precomputed inputs apart from per-prompt tensors.
    """
    from hfx._capture.dynamic_shapes import declared_shapes, infer_dynamic_shapes

    packed = packed_input_axes(captured.source, captured.kwargs)
    if not packed:
        return None
    inferred = infer_dynamic_shapes(captured)
    axes = {**inferred.axes, **packed}
    shapes = declared_shapes(captured, axes)
    # A list of boundaries holds at least two (one image, one window).
    bounds = {d: (2, None) if d.endswith("boundaries") else inferred.bounds.get(d, b) for d, b in shapes.bounds.items()}
    return attrs.evolve(shapes, bounds=bounds)
