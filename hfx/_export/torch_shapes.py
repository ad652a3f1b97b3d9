"""``DynamicShapes`` in torch.export's terms, and back: ``Dim``s per input, and the parser of torch's suggested fixes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hfx._pytree import leaf_name
from hfx._records import DynamicShapes


def to_torch(shapes: DynamicShapes, kwargs: Mapping[str, Any], auto: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The ``dynamic_shapes`` argument of ``torch.export.export`` for ``kwargs``: one ``Dim`` per name.

    torch.export wants a custom pytree node (a cache, a ``ModelOutput``) given
    as the list of its children's shapes, so nodes are walked one level at a time.
    The dims named in ``auto`` are ``Dim.AUTO`` (see ``hfx._export.guard_ranges``).
    """
    dims = {
        name: torch.export.Dim.AUTO if name in auto
        else torch.export.Dim(name, min=lo, max=hi) if hi is not None else torch.export.Dim(name, min=lo)
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
    # An axis already named by another dim (``past_sequence + 1``, from decompose) is static when that dim is.
    axes = {
        leaf: {a: derived.get(d, d) for a, d in per_axis.items() if derived_dim(d)[0] not in static}
        for leaf, per_axis in shapes.axes.items()
    }
    return DynamicShapes(axes=axes, bounds={d: b for d, b in bounds.items() if d not in static and d not in derived})
