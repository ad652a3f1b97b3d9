"""Vision-tower inputs computed from ``grid_thw`` outside the graph (Qwen2-VL-style packed images).

Towers that take every image's patches packed in one sequence (Qwen2-VL,
Qwen2.5-VL, GLM-4V …) derive their rotary position ids and the images'
boundaries (``cu_seqlens``) from ``grid_thw`` with Python loops and
``repeat_interleave``, which a graph cannot hold for any image size. The
getters in ``transformers.vision_utils`` return a precomputed value when the
caller passes it in ``kwargs``; ``decompose`` records what each getter
computed, so the encoder graph takes those values as inputs, and
``generate`` computes them for new images with the same getters.

A graph of the whole forward takes them as the model's own forward does:
prefixed with the modality (``image_cu_seqlens``; transformers'
``accepts_precomputed_kwargs``), next to the M-RoPE ``position_ids``;
``vision_inputs`` computes all of them from the processor's inputs.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from toolz import curry

from hfx._errors import argument_error

# getter -> the keyword arguments its results are passed back under; ``None`` when a result is not an input.
_GETTERS: Mapping[str, tuple[str | None, ...]] = {
    "get_vision_position_ids": ("position_ids",),
    "get_vision_attention_seqlens": ("cu_seqlens", None),  # max_seqlen: only flash attention reads it
    "get_vision_window_index": ("window_index", "cu_window_seqlens"),  # Qwen2.5-VL's windowed layers
    # Qwen3-VL, Qwen3.5: the learned position table resampled to each image's grid, as per-patch taps
    "get_vision_interpolation_indices_and_weights": ("interp_indices", "interp_weights"),
}
# The interpolation getter's arguments after ``grid_thw``, in order (transformers 5.22-5.24).
_INTERPOLATION_OPTIONS = ("num_grid_per_side", "mode", "align_corners", "spatial_merge_size", "padding")


@contextlib.contextmanager
def recording_vision_inputs(tower: torch.nn.Module, found: dict[str, dict[str, Any]]) -> Iterator[None]:
    """Within the block, record ``{getter: {"options": …, "values": {kwarg: tensor}}}`` for ``tower``'s first images.

    The getters are swapped in the tower's modeling module only (a reversible patch).
    """
    from hfx.patches import swap_attr

    namespace = sys.modules[type(tower).__module__]
    with contextlib.ExitStack() as stack:
        for name in _GETTERS:
            original = vars(namespace).get(name)
            if callable(original):
                stack.enter_context(swap_attr(namespace, name, _recording(name, original, found)))
        yield


def _recording(name: str, original: Any, found: dict[str, dict[str, Any]]) -> Any:
    def getter(grid_thw: torch.Tensor, *args: Any, kwargs: dict | None = None, **options: Any) -> Any:
        result = original(grid_thw, *args, kwargs=kwargs, **options)
        if name not in found:
            results = result if isinstance(result, tuple) else (result,)
            values = {key: value for key, value in zip(_GETTERS[name], results) if key and isinstance(value, torch.Tensor)}
            found[name] = {"options": _options(name, args, options), "values": values}
        return result

    return getter


def _options(name: str, args: tuple[Any, ...], options: Mapping[str, Any]) -> dict[str, Any]:
    """The getter's arguments besides ``grid_thw``, as JSON (a config argument is not kept: the getter reads no value from it here)."""
    if name == "get_vision_position_ids":
        merge = args[0] if args else options.get("spatial_merge_size")
        merge = merge.tolist() if isinstance(merge, torch.Tensor) else int(merge)
        return {"spatial_merge_size": merge, "include_temporal": bool(options.get("include_temporal", args[1] if len(args) > 1 else False))}
    if name == "get_vision_window_index":
        keys = ("spatial_merge_size", "window_size", "patch_size")
        return {key: int(options[key]) if key in options else int(args[index]) for index, key in enumerate(keys)}
    if name == "get_vision_interpolation_indices_and_weights":
        given = {**dict(zip(_INTERPOLATION_OPTIONS, args)), **options}
        return {key: value for key, value in given.items() if key in _INTERPOLATION_OPTIONS}
    return {"merge_temporal": bool(options.get("merge_temporal", args[1] if len(args) > 1 else False))}


def computed_vision_inputs(recorded: Mapping[str, Mapping[str, Any]], grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs of the getters ``recorded`` names (``{getter: its options}``), computed for new images from their ``grid_thw``.

    Example:
        >>> recorded = {"get_vision_attention_seqlens": {"merge_temporal": False}}
        >>> computed_vision_inputs(recorded, torch.tensor([[1, 4, 4], [1, 2, 2]]))["cu_seqlens"].tolist()
        [0, 16, 20]
    """
    from transformers import vision_utils

    computed: dict[str, torch.Tensor] = {}
    for name, recorded_options in recorded.items():
        options = dict(recorded_options)
        if name == "get_vision_position_ids":
            merge = options.pop("spatial_merge_size")
            merge = torch.tensor(merge) if isinstance(merge, list) else merge
            computed["position_ids"] = vision_utils.get_vision_position_ids(grid_thw, merge, **options)
        elif name == "get_vision_window_index":
            computed["window_index"], computed["cu_window_seqlens"] = vision_utils.get_vision_window_index(grid_thw, **options)
        elif name == "get_vision_interpolation_indices_and_weights":
            computed["interp_indices"], computed["interp_weights"] = (
                vision_utils.get_vision_interpolation_indices_and_weights(grid_thw, **options))
        else:
            computed["cu_seqlens"] = vision_utils.get_vision_cu_seqlens(grid_thw, **options)
    return computed


def tower_getters(module: torch.nn.Module) -> tuple[str, ...]:
    """The ``transformers.vision_utils`` getters ``module``'s own forward calls (none: not a packed-image tower)."""
    forward = vars(type(module)).get("forward")
    namespace = vars(sys.modules[type(module).__module__])
    if forward is None or not any(callable(namespace.get(name)) for name in _GETTERS):
        return ()
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return ()
    return tuple(name for name in _GETTERS if f"{name}(" in source and callable(namespace.get(name)))


class _TowerLayerCall(Exception):  # noqa: N818 - control flow, not an error
    """Raised by the first layer a tower calls once its getters have run (see ``tower_inputs``)."""


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _TowerLayerCall


def tower_inputs(tower: torch.nn.Module, pixel_values: torch.Tensor | None, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """What ``tower``'s vision getters compute for images of ``grid_thw``: ``{keyword: tensor}``.

    The tower's forward runs on a view whose child modules stop it at the
    first call, so its getters run as they do in the model (same options)
    and none of its layers does; ``tower`` itself is not changed.
    """
    view = copy.copy(tower)  # a shallow view: its own child table, every child a stop
    view._modules = {}  # noqa: SLF001
    for name in tower._modules:  # noqa: SLF001
        vars(view)[name] = _stop
    found: dict[str, dict[str, Any]] = {}
    with recording_vision_inputs(tower, found), torch.no_grad(), contextlib.suppress(_TowerLayerCall):
        view.forward(torch.empty(0) if pixel_values is None else pixel_values, grid_thw=grid_thw)
    return {key: value for entry in found.values() for key, value in entry["values"].items()}


def takes_precomputed(method: Any) -> bool:
    """Whether a ``get_<modality>_features`` passes ``<modality>_``-prefixed keywords on to its tower (``accepts_precomputed_kwargs``)."""
    while method is not None:
        if "accepts_precomputed_kwargs" in getattr(getattr(method, "__code__", None), "co_qualname", ""):
            return True
        method = getattr(method, "__wrapped__", None)
    return False


# modality -> the processor's pixel input of that modality
_PIXELS = {"image": "pixel_values", "video": "pixel_values_videos"}


def _packed_modalities(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{modality: tower}`` of the model's packed-image towers whose feature method takes precomputed inputs."""
    from hfx._capture.multimodal import feature_methods, modality_tower

    base = getattr(model, "base_model", model)
    found = {}
    for modality, method in feature_methods(model).items():
        tower = modality_tower(model, modality)
        if tower is not None and tower_getters(tower) and takes_precomputed(vars(type(base)).get(method)):
            found[modality] = tower
    return found


def _getter_results(tower: torch.nn.Module) -> tuple[str, ...]:
    """The keywords under which ``tower`` takes its getters' results precomputed (``cu_seqlens``, ``position_ids`` …)."""
    return tuple(key for getter in tower_getters(tower) for key in _GETTERS[getter] if key)


def _grid_key(model: torch.nn.Module, inputs: Mapping[str, Any]) -> str | None:
    """``"grid_thw"`` when ``model`` is itself a packed-image tower (a vision model exported alone, as GLM-Image's)
    and ``inputs`` hold its grid; else ``None``."""
    return "grid_thw" if isinstance(inputs.get("grid_thw"), torch.Tensor) and _getter_results(model) else None


def precomputed_input_names(model: torch.nn.Module) -> frozenset[str]:
    """The ``<modality>_<getter result>`` keywords ``model.forward`` passes to its packed-image towers; a tower's
    own (``cu_seqlens`` …) when ``model`` is one.

    Example:
        >>> precomputed_input_names(torch.nn.Linear(1, 1))
        frozenset()
    """
    own = _getter_results(model)
    if own:
        return frozenset(own)
    return frozenset(
        f"{modality}_{key}"
        for modality, tower in _packed_modalities(model).items()
        for getter in tower_getters(tower)
        for key in _GETTERS[getter]
        if key
    )


@curry
def vision_inputs(model: torch.nn.Module, inputs: Mapping[str, Any], /) -> dict[str, torch.Tensor]:
    """The inputs a whole-forward graph of a packed-image model takes besides the processor's, computed from them.

    Qwen2-VL-style models compute, in Python, the M-RoPE ``position_ids``
    (``get_rope_index``) and each tower's patch positions and image (or
    window) boundaries from the grids: data-dependent work a graph cannot
    hold for any image count and size. Computed here, outside the graph, they
    go in as inputs under the names the model's forward takes them
    (``image_position_ids``, ``image_cu_seqlens`` and, for Qwen2.5-VL,
    ``image_window_index`` / ``image_cu_window_seqlens``; for Qwen3-VL and Qwen3.5 the position table's
    resampling taps ``image_interp_indices`` / ``image_interp_weights``), and the eager model
    gives the same outputs with or without them.

    Args:
        model: the model (a weightless ``meta`` copy works: only its config and code are read).
        inputs: the processor's inputs: ``input_ids``, ``attention_mask``,
            ``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw`` (or the video ones).

    Returns:
        The extra keyword arguments; empty for a model without packed-image
        towers or inputs without grids. For a tower alone (``model`` is one and
        ``inputs`` hold ``grid_thw``) its own keywords, unprefixed (``cu_seqlens`` …). ``position_ids`` is left out when
        ``inputs`` already hold it. ``vision_inputs(model)`` alone is a stage ``inputs -> dict``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``inputs`` not a mapping (the arguments swapped).

    Example:
        >>> from hfx import zoo
        >>> model, inputs = zoo.build("qwen2_vl"), zoo.inputs("qwen2_vl")
        >>> sorted(vision_inputs(model, inputs))
        ['image_cu_seqlens', 'image_position_ids', 'position_ids']
        >>> program = hfx.export(hfx.capture({**inputs, **vision_inputs(model, inputs)}, model))  # doctest: +SKIP
    """
    from hfx._capture.positions import has_media_grids, multimodal_positions

    if not isinstance(model, torch.nn.Module):
        raise argument_error("vision_inputs(model, inputs)", "model", "a torch.nn.Module", model)
    if not isinstance(inputs, Mapping):
        raise argument_error("vision_inputs(model, inputs)", "inputs", "a mapping of the processor's inputs", inputs)
    if _grid_key(model, inputs):  # the tower alone: its own keywords, unprefixed
        return tower_inputs(model, inputs.get("pixel_values", inputs.get("hidden_states")), inputs["grid_thw"])
    computed: dict[str, torch.Tensor] = {}
    for modality, tower in _packed_modalities(model).items():
        grid = inputs.get(f"{modality}_grid_thw")
        if grid is not None:
            found = tower_inputs(tower, inputs.get(_PIXELS[modality]), grid)
            computed.update({f"{modality}_{key}": value for key, value in found.items()})
    base = getattr(model, "base_model", model)
    if "position_ids" not in inputs and hasattr(base, "get_rope_index") and has_media_grids(inputs):
        computed["position_ids"] = multimodal_positions(base, inputs)
    return computed


def _packed_axis(key: str, modality: str) -> str:
    """The dim name of axis 0 of a packed-image input, as ``decompose`` names the tower's (``image_patches`` …)."""
    if key.startswith("cu_"):  # boundaries: of the images, or of Qwen2.5-VL's windows
        return f"{modality}_{key.removeprefix('cu_').replace('seqlens', 'boundaries')}"
    if key == "grid_thw":
        return f"{modality}_count"
    return f"{modality}_patches" if key in ("position_ids", "interp_indices", "interp_weights") else f"{modality}_{key}"


def packed_input_axes(model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, dict[int, str]]:
    """``{input: {0: dim}}`` for the packed-image inputs of a whole-forward call; empty when there are none.

    The packed pixels and the tower inputs ``vision_inputs`` computes follow
    the images (patches, images, boundaries), not the batch; the token types
    follow the prompt.
    """
    if _grid_key(model, inputs):  # the tower alone (its inputs unprefixed): patches, images, boundaries
        given = [key for key in ("grid_thw", *_getter_results(model)) if isinstance(inputs.get(key), torch.Tensor)]
        if given == ["grid_thw"]:
            return {}
        pixels = {k: {0: "image_patches"} for k in ("pixel_values", "hidden_states")
                  if isinstance(inputs.get(k), torch.Tensor) and inputs[k].ndim == 2}
        return {**pixels, **{key: {0: _packed_axis(key, "image")} for key in given}}
    axes: dict[str, dict[int, str]] = {}
    for modality in _packed_modalities(model):
        names = {f"{modality}_{key}": key for key in ("grid_thw", *(k for r in _GETTERS.values() for k in r if k))}
        given = {name: key for name, key in names.items() if isinstance(inputs.get(name), torch.Tensor)}
        if not any(key != "grid_thw" for key in given.values()):
            continue  # no precomputed input: the model computes them, the graph cannot hold any image count
        axes.update({name: {0: _packed_axis(key, modality)} for name, key in given.items()})
        pixels = inputs.get(_PIXELS[modality])
        if isinstance(pixels, torch.Tensor) and pixels.ndim == 2:
            axes[_PIXELS[modality]] = {0: f"{modality}_patches"}
    types = inputs.get("mm_token_type_ids")
    if axes and isinstance(types, torch.Tensor) and types.ndim == 2:
        axes["mm_token_type_ids"] = {0: "batch", 1: "sequence"}
    return axes
