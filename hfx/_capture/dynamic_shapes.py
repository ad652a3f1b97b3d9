"""``infer_dynamic_shapes``: named dynamic axes shared across inputs, and their bounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from toolz import curry

from hfx._kept_positions import KEPT_DIM, KEPT_INPUT
from hfx._lift import per_component
from hfx._pytree import owned_tensors
from hfx._records import Capture, DynamicShapes

# Input name -> {axis: dim name}. Axes may be negative (counted from the end).
_AXIS_RULES: tuple[tuple[frozenset[str], Mapping[int, str]], ...] = (
    (
        frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "labels",
                   "special_tokens_mask", "cache_position", "global_attention_mask", "langs"}),
        {0: "batch", 1: "sequence"},
    ),
    (
        frozenset({"decoder_input_ids", "decoder_attention_mask", "decoder_position_ids", "decoder_inputs_embeds"}),
        {0: "batch", 1: "decoder_sequence"},
    ),
    # Qwen3-VL's deepstack: the prompt's visual token positions, and each level's rows for them
    (frozenset({"visual_pos_masks"}), {0: "batch", 1: "sequence"}),
    (frozenset({"deepstack_visual_embeds"}), {0: "visual_tokens"}),
    # InstructBLIP's instruction, tokenized again for its Q-Former: its own length
    (frozenset({"qformer_input_ids", "qformer_attention_mask"}), {0: "batch", 1: "qformer_sequence"}),
    (frozenset({"pixel_values", "pixel_mask"}), {0: "batch", -2: "height", -1: "width"}),
    (frozenset({"input_values"}), {0: "batch", -1: "audio_length"}),
    (frozenset({"input_features"}), {0: "batch", -1: "frames"}),
    # a multi-token decode's positions whose logits it returns (hfx._kept_positions)
    (frozenset({KEPT_INPUT}), {0: KEPT_DIM}),
)


def _cache_rule(name: str, owners: tuple[type, ...]) -> Mapping[int, str]:
    """Axes of a tensor held by a cache: keys/values grow along the past, static layers do not."""
    layer = owners[-1].__name__
    if ".cross_attention_cache." in name:
        return {0: "batch", 2: "sequence"}  # cross-attention keys span the encoder's tokens
    if name.rsplit(".", 1)[-1] in ("keys", "values") and "Static" not in layer:
        return {0: "batch", 2: "past_sequence"}
    if name.rsplit(".", 1)[-1] == "indexer_keys" and "Static" not in layer:
        # DeepSeek sparse attention's indexer keeps its own keys, [batch, past, dim], as long as the past
        return {0: "batch", 1: "past_sequence"}
    return {0: "batch"}


# Config fields that give the feature count of one frame of ``input_features`` (mel bins, stacked features).
_FEATURE_COUNTS = ("num_mel_bins", "feature_size", "input_feat_per_channel", "feature_projection_input_dim", "n_mels")


def _config_ints(config: Any, names: tuple[str, ...]) -> set[int]:
    """The int values of ``names`` in ``config`` and in its sub-configs (a speech encoder's ``encoder_config``)."""
    found: set[int] = set()
    for value in (getattr(config, name, None) for name in names):
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    for value in vars(config).values() if hasattr(config, "__dict__") else ():
        if hasattr(value, "model_type") and hasattr(value, "to_dict"):
            found |= _config_ints(value, names)
    return found


def feature_frames_axis(model: torch.nn.Module | None, shape: tuple[int, ...]) -> int:
    """Which axis of 3D ``input_features`` counts frames: -1 for Whisper's ``[batch, bins, frames]``, 1 where
    the model's config gives the last axis's size as its feature count (Speech2Text, Parakeet, Wav2Vec2-BERT,
    SeamlessM4T: ``[batch, frames, features]``).

    Example:
        >>> import transformers
        >>> model = transformers.Speech2TextModel(transformers.Speech2TextConfig(
        ...     input_feat_per_channel=8, d_model=8, encoder_layers=1, decoder_layers=1,
        ...     encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8,
        ...     conv_channels=8, vocab_size=16))
        >>> feature_frames_axis(model, (2, 72, 8)), feature_frames_axis(None, (2, 72, 8))
        (1, -1)
    """
    # a wrapper (decompose's encoder with the cross-attention cache) has no config: its first submodule that has one
    config = next((m.config for m in model.modules() if hasattr(m, "config")), None) if model is not None else None
    counts = _config_ints(config, _FEATURE_COUNTS)
    return 1 if len(shape) == 3 and shape[-1] in counts and shape[1] not in counts else -1


def _rule_for(name: str, owners: tuple[type, ...] = (), ndim: int = 2, aliases: Mapping[str, str] | None = None) -> Mapping[int, str] | None:
    if owners:
        return _cache_rule(name, owners)
    top = name.split(".", 1)[0]
    top = (aliases or {}).get(top, top)
    if top in ("attention_mask", "decoder_attention_mask") and ndim == 4:
        # A 4D mask (static caches): batch, heads, query, key; the key axis spans the static cache.
        return {0: "batch", 2: "sequence" if top == "attention_mask" else "decoder_sequence"}
    if top == "position_ids" and ndim == 3:  # multimodal rotary positions (Qwen2-VL): [sections, batch, sequence]
        return {1: "batch", 2: "sequence"}
    if top in ("encoder_outputs", "encoder_hidden_states"):
        return {0: "batch", 1: "sequence"}
    if top == "mm_encoder_outputs":  # features encoded before forward: per image, or all images' tokens in a row
        modality = name.split(".")[1] if "." in name else "media"
        return {0: f"{modality}_count"} if ndim >= 3 else {0: f"{modality}_tokens"}
    return next((rule for names, rule in _AXIS_RULES if top in names), None)


# (input, dim) -> the name an axis gets when its size differs from the dim's: a decode step's mask
# spans the past and the new tokens.
_CONFLICT_NAMES: Mapping[tuple[str, str], str] = {("attention_mask", "sequence"): "total_sequence"}
# Inputs whose sizes define the dims, named first so the others are compared against them.
_PRIMARY = ("input_ids", "decoder_input_ids", "inputs_embeds", "pixel_values", "input_features", "input_values")


_KNOWN = frozenset().union(*(names for names, _ in _AXIS_RULES))


def main_input_aliases(model: torch.nn.Module | None, kwargs: Mapping[str, Any]) -> dict[str, str]:
    """``{input: the known input whose axes it has}`` for a model whose main input has another name.

    Perceiver's models take their tokens or pixels as ``inputs`` (``main_input_name``): an
    integer matrix is read as ``input_ids``, a float tensor of 4, 3 or 2 dims as
    ``pixel_values``, ``input_features`` or ``input_values``.

    Example:
        >>> import torch
        >>> model = torch.nn.Identity()
        >>> model.main_input_name = "inputs"
        >>> main_input_aliases(model, {"inputs": torch.ones(2, 5, dtype=torch.long)})
        {'inputs': 'input_ids'}
    """
    main = getattr(model, "main_input_name", None)
    tensor = kwargs.get(main) if isinstance(main, str) and main not in _KNOWN else None
    if not isinstance(tensor, torch.Tensor):
        return {}
    if not tensor.is_floating_point():
        known = "input_ids" if tensor.ndim == 2 else None
    else:
        known = {4: "pixel_values", 3: "input_features", 2: "input_values"}.get(tensor.ndim)
    return {main: known} if known else {}


def _default_bounds(model: torch.nn.Module | None) -> dict[str, tuple[int, int | None]]:
    """Bounds a dim gets when the caller sets none: the model's own position limit for sequences."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    limit = int(limit) if isinstance(limit, int) and limit > 1 else None
    sequence = (1, limit)
    return {
        "sequence": sequence,
        "decoder_sequence": sequence,
        "total_sequence": sequence,
        KEPT_DIM: sequence,
        "past_sequence": (1, limit - 1 if limit else None),  # a step adds at least one token to the past
    }


@curry
@per_component
def infer_dynamic_shapes(
    capture: Capture,
    /,
    *,
    bounds: Mapping[str, tuple[int, int | None]] | None = None,
) -> DynamicShapes:
    """Name the dynamic axes of the captured inputs: batch, sequence, past_sequence, height, width ...

    Inputs that share an axis share one name (``input_ids`` and
    ``attention_mask`` share ``batch`` and ``sequence``), so the export has few
    symbols and the ONNX graph carries readable axis names. Cache keys and
    values grow along ``past_sequence`` (a static cache's do not); a decode
    step's mask spans ``total_sequence``. Axis 0 of any other tensor whose size
    is the batch size is ``batch``; other axes stay static.

    Args:
        capture: a ``Capture`` (or ``Components``).
        bounds: ``{dim name: (min, max)}`` overriding the defaults (max ``None`` = unbounded), and the
            bounds a decomposed capture carries.

    Returns:
        A ``DynamicShapes`` record (``Components`` of them for ``Components``).
        ``infer_dynamic_shapes(bounds={...})`` alone is a stage ``Capture -> DynamicShapes``.

    Raises:
        TypeError: ``bounds`` is not a mapping.
        ValueError: a bound is not ``(min, max)`` with ints ``0 <= min <= max``.

    Example:
        >>> import torch
        >>> from hfx import capture
        >>> ids = torch.ones(2, 5, dtype=torch.long)
        >>> ds = infer_dynamic_shapes(capture({"input": ids}, torch.nn.Identity()))
        >>> dict(ds.axes["input"])
        {0: 'batch'}
        >>> dict(infer_dynamic_shapes(bounds={"batch": (1, 8)})(capture({"input": ids}, torch.nn.Identity())).bounds)
        {'batch': (1, 8)}
    """
    bounds = _checked_bounds(bounds)
    if capture.dynamic_shapes is not None:  # decompose's shapes: the bounds given override theirs
        carried = capture.dynamic_shapes
        if not bounds:
            return carried
        return DynamicShapes(axes=carried.axes, bounds={d: bounds.get(d, b) for d, b in carried.bounds.items()})
    tensors = owned_tensors(capture.kwargs)
    aliases = main_input_aliases(capture.source, capture.kwargs)
    ordered = sorted(tensors, key=lambda item: aliases.get(top := item[0].split(".", 1)[0], top) not in _PRIMARY)
    batch = next((t.shape[0] for n, t, o in ordered if _rule_for(n, o, t.ndim, aliases) and t.ndim), None)
    if batch is None and tensors and tensors[0][1].ndim:
        batch = tensors[0][1].shape[0]
    hints: dict[str, int] = {}
    axes: dict[str, dict[int, str]] = {}
    for name, tensor, owners in ordered:
        rule = _rule_for(name, owners, tensor.ndim, aliases) or ({0: "batch"} if tensor.ndim and tensor.shape[0] == batch else {})
        if rule.get(-1) == "frames":
            rule = {0: "batch", feature_frames_axis(capture.source, tuple(tensor.shape)): "frames"}
        per_axis: dict[int, str] = {}
        for axis, dim in rule.items():
            if not -tensor.ndim <= axis < tensor.ndim or (tensor.shape[axis] == 0 and dim != "past_sequence"):
                continue
            size = int(tensor.shape[axis])
            if hints.setdefault(dim, size) != size:
                dim = _CONFLICT_NAMES.get((name, dim), f"{dim}_{name.replace('.', '_')}")
                hints.setdefault(dim, size)
            per_axis[axis % tensor.ndim] = dim
        axes[name] = per_axis
    axes = {name: axes[name] for name, _, _ in tensors}
    used = {dim for per_axis in axes.values() for dim in per_axis.values()}
    all_bounds = {**_default_bounds(capture.source), **bounds}
    return DynamicShapes(axes=axes, bounds={d: tuple(all_bounds.get(d, (1, None))) for d in sorted(used)})


def dim_sizes(kwargs: Mapping[str, Any], shapes: DynamicShapes) -> dict[str, int]:
    """The size each dim of ``shapes`` has in ``kwargs`` (the first tensor that has it; caches walked by attribute).

    Example:
        >>> import torch
        >>> dim_sizes({"input": torch.ones(2, 5)}, DynamicShapes(axes={"input": {0: "batch"}}, bounds={}))
        {'batch': 2}
    """
    sizes: dict[str, int] = {}
    for name, tensor, _ in owned_tensors(kwargs):
        for axis, dim in shapes.axes.get(name, {}).items():
            if -tensor.ndim <= axis < tensor.ndim:
                sizes.setdefault(dim, int(tensor.shape[axis]))
    return sizes


def _checked_bounds(bounds: Any) -> dict[str, tuple[int, int | None]]:
    """``bounds`` as a dict, refused unless it maps dim names to ``(min, max)`` with ``0 <= min <= max`` (max may be None)."""
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        msg = (f"infer_dynamic_shapes: bounds must be a mapping {{dim name: (min, max)}}, got {type(bounds).__name__}; "
               "per-component bounds go through hfx.by_component({name: hfx.export(bounds=...)})")
        raise TypeError(msg)
    checked = {}
    for name, value in bounds.items():
        lo, hi = value if isinstance(value, (tuple, list)) and len(value) == 2 else (None, None)
        ints = isinstance(lo, int) and not isinstance(lo, bool) and (hi is None or isinstance(hi, int) and not isinstance(hi, bool))
        if not isinstance(name, str) or not ints or lo < 0 or (hi is not None and hi < lo):
            msg = (f"infer_dynamic_shapes: bounds[{name!r}] must be (min, max) with ints 0 <= min <= max "
                   f"(max None for no bound), got {value!r}")
            raise ValueError(msg)
        checked[name] = (lo, hi)
    return checked


def declared_shapes(capture: Capture, axes: Mapping[str, Mapping[int, str]]) -> DynamicShapes:
    """``axes`` as ``DynamicShapes``, with the default bounds of each dim name (for inputs no rule names).

    Example:
        >>> import torch
        >>> from hfx import capture
        >>> head = capture({"input": torch.ones(2, 1, 4)}, torch.nn.Linear(4, 8))
        >>> declared_shapes(head, {"input": {0: "batch", 1: "sequence"}}).bounds["batch"]
        (1, None)
    """
    used = {dim for per_axis in axes.values() for dim in per_axis.values()}
    defaults = _default_bounds(capture.source)
    return DynamicShapes(axes={k: dict(v) for k, v in axes.items()}, bounds={d: defaults.get(d, (1, None)) for d in sorted(used)})


