"""Vision-tower inputs computed from ``grid_thw`` outside the graph (Qwen2-VL-style packed images).

Towers that take every image's patches packed in one sequence (Qwen2-VL,
Qwen2.5-VL, GLM-4V …) derive their rotary position ids and the images'
boundaries (``cu_seqlens``) from ``grid_thw`` with Python loops and
``repeat_interleave``, which a graph cannot hold for any image size. The
getters in ``transformers.vision_utils`` return a precomputed value when the
caller passes it in ``kwargs``; ``decompose`` records what each getter
computed, so the encoder graph takes those values as inputs, and
``generate`` computes them for new images with the same getters.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

# getter -> the keyword arguments its results are passed back under; ``None`` when a result is not an input.
_GETTERS: Mapping[str, tuple[str | None, ...]] = {
    "get_vision_position_ids": ("position_ids",),
    "get_vision_attention_seqlens": ("cu_seqlens", None),  # max_seqlen: only flash attention reads it
    "get_vision_window_index": ("window_index", "cu_window_seqlens"),  # Qwen2.5-VL's windowed layers
}


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
    return {"merge_temporal": bool(options.get("merge_temporal", args[1] if len(args) > 1 else False))}


def computed_vision_inputs(recorded: Mapping[str, Mapping[str, Any]], grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs ``recorded`` names, computed for new images from their ``grid_thw``.

    Example:
        >>> recorded = {"get_vision_attention_seqlens": {"options": {"merge_temporal": False}}}
        >>> computed_vision_inputs(recorded, torch.tensor([[1, 4, 4], [1, 2, 2]]))["cu_seqlens"].tolist()
        [0, 16, 20]
    """
    from transformers import vision_utils

    computed: dict[str, torch.Tensor] = {}
    for name, entry in recorded.items():
        options = dict(entry["options"])
        if name == "get_vision_position_ids":
            merge = options.pop("spatial_merge_size")
            merge = torch.tensor(merge) if isinstance(merge, list) else merge
            computed["position_ids"] = vision_utils.get_vision_position_ids(grid_thw, merge, **options)
        elif name == "get_vision_window_index":
            computed["window_index"], computed["cu_window_seqlens"] = vision_utils.get_vision_window_index(grid_thw, **options)
        else:
            computed["cu_seqlens"] = vision_utils.get_vision_cu_seqlens(grid_thw, **options)
    return computed
