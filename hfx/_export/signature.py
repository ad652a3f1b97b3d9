"""``flatten_signature``: give the traced forward one named parameter per graph input."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import attrs
import torch
from toolz import curry
from torch.utils import _pytree as pytree

from hfx._lift import per_component
from hfx._pytree import is_cache
from hfx._records import Capture
from hfx._upstream import cache_argument


def has_tensor(value: Any) -> bool:
    """Whether any pytree leaf of ``value`` is a tensor."""
    return any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value))


def is_graph_input(value: Any) -> bool:
    """Tensors, containers of them and caches (even an empty one, which the graph fills) are graph inputs."""
    return has_tensor(value) or is_cache(value)


def _default_constants(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Constants a forward export implies: no KV cache unless the caller passes one."""
    if "use_cache" in inspect.signature(model.forward).parameters and "use_cache" not in kwargs and cache_argument(kwargs) is None:
        return {"use_cache": False}
    return {}


def without_updated_inputs(output: Any, given: set[int]) -> Any:
    """``output`` without the caches whose tensors are all inputs (``given`` ids) updated in place (a static cache).

    Returning them would make torch.export treat the in-place writes as new
    outputs; without them the writes are input mutations, which each runtime
    applies to the caller's tensors (and ONNX Runtime to bound buffers).
    """
    if not isinstance(output, Mapping):
        return output

    def updated_in_place(value: Any) -> bool:
        leaves = _tensors_of(value)
        return is_cache(value) and bool(leaves) and all(id(leaf) in given for leaf in leaves)

    dropped = [key for key, value in output.items() if updated_in_place(value)]
    if not dropped:
        return output
    return type(output)(**{key: value for key, value in output.items() if key not in dropped})


def _tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor held by ``value``, walking object attributes (caches need not be pytree nodes here)."""
    from hfx._pytree import owned_tensors

    return [tensor for _, tensor, _ in owned_tensors({"value": value})]


def flat_view(model: torch.nn.Module, names: tuple[str, ...], constants: Mapping[str, Any]) -> torch.nn.Module:
    """A shallow view of ``model`` whose ``forward(*names)`` calls ``model.forward(**inputs, **constants)``.

    The view shares parameters, buffers and submodules with ``model`` (so the
    graph's weight names are the model's own) but has its own ``__dict__``:
    ``model`` itself is not touched.
    """
    signature = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
    )
    fixed = dict(constants)

    def flat_forward(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        given = {id(tensor) for tensor in _tensors_of(bound.arguments)}  # before forward swaps cache tensors
        # model.forward read at call time: a patch that swaps the model's own class's forward takes effect
        return without_updated_inputs(model.forward(**bound.arguments, **fixed), given)

    flat_forward.__signature__ = signature  # type: ignore[attr-defined]
    view = copy.copy(model)
    object.__setattr__(view, "forward", flat_forward)
    return view


@curry
@per_component
def flatten_signature(capture: Capture, /) -> Capture:
    """Split the captured kwargs into graph inputs (anything holding a tensor) and baked-in constants.

    Models whose forward takes ``**kwargs`` export with dynamic shapes keyed by
    the flat parameter names. Forward exports of models with a KV cache default
    to ``use_cache=False``; pass ``use_cache=True`` (or ``decompose``) for caches.

    Args:
        capture: a ``Capture`` (or ``Components`` of them); returned unchanged when already flat.

    Returns:
        A new ``Capture`` whose ``module`` is a flat view of the model, ``kwargs``
        the graph inputs and ``constants`` the rest (``Components`` of them for ``Components``).

    Example:
        >>> import torch
        >>> from hfx import capture
        >>> c = flatten_signature(capture({"input": torch.ones(1, 2)}, torch.nn.Linear(2, 2)))
        >>> c.is_flat, list(c.kwargs), dict(c.constants)
        (True, ['input'], {})
    """
    if capture.is_flat:
        return capture
    graph_inputs = {k: v for k, v in capture.kwargs.items() if is_graph_input(v)}
    constants = {k: v for k, v in capture.kwargs.items() if not is_graph_input(v)}
    constants = {**_default_constants(capture.source, capture.kwargs), **constants}
    module = flat_view(capture.source, tuple(graph_inputs), constants)
    return attrs.evolve(capture, module=module, kwargs=graph_inputs, constants=constants, is_flat=True)
