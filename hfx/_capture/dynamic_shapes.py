"""``infer_dynamic_shapes``: named dynamic axes shared across inputs, and their bounds."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hfx._lift import per_component
from hfx._records import Capture, DynamicShapes

# Input name -> {axis: dim name}. Axes may be negative (counted from the end).
_AXIS_RULES: tuple[tuple[frozenset[str], Mapping[int, str]], ...] = (
    (
        frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "labels",
                   "special_tokens_mask", "cache_position", "global_attention_mask"}),
        {0: "batch", 1: "sequence"},
    ),
    (
        frozenset({"decoder_input_ids", "decoder_attention_mask", "decoder_position_ids", "decoder_inputs_embeds"}),
        {0: "batch", 1: "decoder_sequence"},
    ),
    (frozenset({"pixel_values", "pixel_mask"}), {0: "batch", -2: "height", -1: "width"}),
    (frozenset({"input_values"}), {0: "batch", -1: "audio_length"}),
    (frozenset({"input_features"}), {0: "batch", -1: "frames"}),
)


def leaf_name(path: tuple[Any, ...]) -> str:
    """A dotted name for a pytree key path: ``past_key_values.layers.0.keys``."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def named_leaves(kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every pytree leaf of ``kwargs`` with its dotted name, in flattening order."""
    with_paths, _ = pytree.tree_flatten_with_path(dict(kwargs))
    return [(leaf_name(path), leaf) for path, leaf in with_paths]


def owned_tensors(kwargs: Mapping[str, Any]) -> list[tuple[str, torch.Tensor, tuple[type, ...]]]:
    """Every tensor in ``kwargs`` with its dotted name and the classes of the objects holding it.

    Named like ``named_leaves`` (``past_key_values.layers.0.keys``), but walking
    cache objects by their attributes so a rule can tell a static cache layer
    from a dynamic one.
    """
    found: list[tuple[str, torch.Tensor, tuple[type, ...]]] = []
    seen: set[int] = set()

    def walk(value: Any, name: str, owners: tuple[type, ...]) -> None:
        if id(value) in seen:  # objects may refer back to their owner
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append((name, value, owners))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{name}.{index}", owners)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{name}.{key}", owners)
        elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
            for key, item in vars(value).items():
                walk(item, f"{name}.{key}", (*owners, type(value)))

    for key, value in kwargs.items():
        walk(value, key, ())
    return found


def _cache_rule(name: str, owners: tuple[type, ...]) -> Mapping[int, str]:
    """Axes of a tensor held by a cache: keys/values grow along the past, static layers do not."""
    layer = owners[-1].__name__
    if ".cross_attention_cache." in name:
        return {0: "batch", 2: "sequence"}  # cross-attention keys span the encoder's tokens
    if name.rsplit(".", 1)[-1] in ("keys", "values") and "Static" not in layer:
        return {0: "batch", 2: "past_sequence"}
    return {0: "batch"}


def _rule_for(name: str, owners: tuple[type, ...] = (), ndim: int = 2) -> Mapping[int, str] | None:
    if owners:
        return _cache_rule(name, owners)
    top = name.split(".", 1)[0]
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
        "past_sequence": (1, limit - 1 if limit else None),  # a step adds at least one token to the past
    }


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
        bounds: ``{dim name: (min, max)}`` overriding the defaults (max ``None`` = unbounded).

    Returns:
        A ``DynamicShapes`` record.

    Example:
        >>> import torch
        >>> from hfx import capture
        >>> ids = torch.ones(2, 5, dtype=torch.long)
        >>> ds = infer_dynamic_shapes(capture({"input": ids}, torch.nn.Identity()))
        >>> dict(ds.axes["input"])
        {0: 'batch'}
    """
    if capture.dynamic_shapes is not None:
        return capture.dynamic_shapes
    tensors = owned_tensors(capture.kwargs)
    ordered = sorted(tensors, key=lambda item: item[0].split(".", 1)[0] not in _PRIMARY)
    batch = next((t.shape[0] for n, t, o in ordered if _rule_for(n, o, t.ndim) and t.ndim), None)
    if batch is None and tensors and tensors[0][1].ndim:
        batch = tensors[0][1].shape[0]
    hints: dict[str, int] = {}
    axes: dict[str, dict[int, str]] = {}
    for name, tensor, owners in ordered:
        rule = _rule_for(name, owners, tensor.ndim) or ({0: "batch"} if tensor.ndim and tensor.shape[0] == batch else {})
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
    all_bounds = {**_default_bounds(capture.source), **dict(bounds or {})}
    return DynamicShapes(axes=axes, bounds={d: tuple(all_bounds.get(d, (1, None))) for d in sorted(used)})


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


def to_torch(shapes: DynamicShapes, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``dynamic_shapes`` argument of ``torch.export.export`` for ``kwargs``: one ``Dim`` per name.

    torch.export wants a custom pytree node (a cache, a ``ModelOutput``) given
    as the list of its children's shapes, so nodes are walked one level at a time.
    """
    dims = {
        name: torch.export.Dim(name, min=lo, max=hi) if hi is not None else torch.export.Dim(name, min=lo)
        for name, (lo, hi) in shapes.bounds.items()
    }

    def dim(name: str) -> Any:
        if name in dims:
            return dims[name]
        base, offset = derived_dim(name)  # "past_sequence + 1": a size torch.export derives from another dim
        return dims[base] + offset

    def per_tensor(path: tuple[Any, ...], tensor: torch.Tensor) -> dict[int, Any] | None:
        per_axis = shapes.axes.get(leaf_name(path), {})
        return {axis: dim(name) for axis, name in per_axis.items()} or None

    return {key: _shape_tree(value, (pytree.MappingKey(key),), per_tensor) for key, value in kwargs.items()}


_OFFSET = re.compile(r"^(\w+) ([+-]) (\d+)$")


def derived_dim(name: str) -> tuple[str, int]:
    """``(base dim, offset)`` of a derived axis name (``"past_sequence + 1"``); ``(name, 0)`` for a plain one.

    A derived axis is always its base dim plus a constant (a decode step's mask
    spans the past and its one new token), named as its size prints in the
    program's specs.

    Example:
        >>> derived_dim("past_sequence + 1"), derived_dim("batch")
        (('past_sequence', 1), ('batch', 0))
    """
    match = _OFFSET.match(name)
    if match is None:
        return name, 0
    base, sign, offset = match.groups()
    return base, int(offset) if sign == "+" else -int(offset)


def _shape_tree(value: Any, path: tuple[Any, ...], per_tensor: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return per_tensor(path, value)
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None:
        return None
    if type(value) in (dict, list, tuple):
        keyed = node.flatten_with_keys_fn(value)[0]
        children = [_shape_tree(child, (*path, key), per_tensor) for key, child in keyed]
        return dict(zip(value, children)) if isinstance(value, dict) else type(value)(children)
    keyed = node.flatten_with_keys_fn(value)[0] if node.flatten_with_keys_fn else []
    return [_shape_tree(child, (*path, key), per_tensor) for key, child in keyed]


def widen_unit_axes(shapes: DynamicShapes, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Example inputs for tracing in which every dynamic axis of size 1 is repeated to size 2.

    torch.export specialises an axis whose example size is 0 or 1; tracing on
    size 2 keeps it symbolic. Only shapes matter to the trace, so repeating
    the row keeps every input consistent with the others.
    """
    with_paths, spec = pytree.tree_flatten_with_path(dict(kwargs))
    leaves = []
    for path, leaf in with_paths:
        for axis in shapes.axes.get(leaf_name(path), {}):
            if isinstance(leaf, torch.Tensor) and leaf.shape[axis] == 1:
                leaf = torch.cat([leaf, leaf], dim=axis)
        leaves.append(leaf)
    return pytree.tree_unflatten(leaves, spec)


_FIX = re.compile(r"^\s*(\w+) = (.+?)\s*$")
_DIM = re.compile(r"Dim\(\s*'(\w+)'(?:,\s*min=(\d+))?(?:,\s*max=(\d+))?\s*\)")
# "Not all values of height = L['pixel_values'].size()[2] in the specified range satisfy the generated guard
#  4 <= L['pixel_values'].size()[2] and L['pixel_values'].size()[2] <= IntInfinity()"
_GUARD = re.compile(r"Not all values of (\w+) = .*? satisfy the generated guard (\d+) <= \S+(?: and \S+ <= (\d+))?")
_DERIVED = re.compile(r"\d+\*_\w+(?:\s*[+-]\s*\d+)?")


def _guard_bounds(message: str, bounds: Mapping[str, tuple[int, int | None]]) -> dict[str, tuple[int, int | None]]:
    """The ranges torch's guards state for each dim (``4 <= height``), for a fix torch can only state as derived."""
    found: dict[str, tuple[int, int | None]] = {}
    for name, lo, hi in _GUARD.findall(message):
        if name in bounds:
            old_lo, old_hi = bounds[name]
            found[name] = (max(old_lo, int(lo)), int(hi) if hi else old_hi)
    return found


def refine(shapes: DynamicShapes, message: str) -> DynamicShapes | None:
    """Apply torch.export's "Suggested fixes" to ``shapes``; ``None`` when there is none we can apply.

    ``height = 224`` makes ``height`` static; ``sequence = Dim('sequence', max=512)``
    narrows its bounds. A derived fix (``width = 4*_width``, from a strided conv or
    patch embedding) keeps the dim dynamic with the range torch's failed guard states
    (``4 <= width``): Swin, wav2vec2 and HuBERT then export with dynamic sizes.
    A fix relating two dims (``total_sequence = past_sequence + 1``: Falcon adds an
    ALiBi bias built from the whole mask to the scores over the cached keys) names
    the axes of the first by the expression (see ``derived_dim``) and drops its bounds.
    """
    if "Suggested fixes:" not in message:
        return None
    block = message.split("Suggested fixes:", 1)[1].strip("\n").split("\n\n", 1)[0]
    static: set[str] = set()
    derived: dict[str, str] = {}
    bounds = dict(shapes.bounds)
    guarded = _guard_bounds(message, bounds)
    for line in block.splitlines():
        match = _FIX.match(line)
        if not match:
            return None
        name, expr = match.groups()
        if name.startswith("_") and name not in bounds:  # the helper Dim of a derived fix (``height = 4*_height``)
            continue
        if name not in bounds:
            return None
        dim = _DIM.fullmatch(expr)
        if expr.isdigit():
            static.add(name)
        elif dim:
            lo, hi = bounds[name]
            bounds[name] = (int(dim.group(2) or lo), int(dim.group(3)) if dim.group(3) else hi)
        elif _DERIVED.fullmatch(expr) and name in guarded:  # a derived fix: keep the dim, with the guard's range
            bounds[name] = guarded[name]
        elif (offset := _OFFSET.match(expr)) and offset.group(1) in bounds and offset.group(1) != name:
            derived[name] = expr  # ``total_sequence = past_sequence + 1``: one dim fewer, its size follows the other's
        else:
            return None
    static |= {name for name, expr in derived.items() if derived_dim(expr)[0] in static}  # follows a static dim
    axes = {
        leaf: {a: derived.get(d, d) for a, d in per_axis.items() if d not in static}
        for leaf, per_axis in shapes.axes.items()
    }
    return DynamicShapes(axes=axes, bounds={d: b for d, b in bounds.items() if d not in static and d not in derived})
