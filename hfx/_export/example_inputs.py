"""Example inputs for a program at chosen sizes: zero tensors shaped like its inputs (tracing reads only shapes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hfx._export.torch_shapes import derived_dim
from hfx._records import Exported


def example_kwargs(exported: Exported, bounds: Mapping[str, tuple[int, int | None]]) -> dict[str, Any]:
    """Zero inputs for ``exported`` at its trace sizes, each named dim clamped to ``bounds`` (tracing reads only shapes).

    A dim traced at 0 or 1 is taken at 2 when its bounds allow (torch.export
    specialises sizes 0 and 1); an unbounded maximum keeps the trace size.
    """
    program = exported.program
    sizes = {
        name: _example_size(hint, bounds[name][0], bounds[name][1] if bounds[name][1] is not None else max(hint, 2))
        for name, hint in _hints(exported).items() if name in bounds
    }
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    leaves = [
        _example(spec.shape, placeholders[user].meta.get("val"), sizes)
        for spec, user in zip(exported.io.inputs, program.graph_signature.user_inputs)
    ]
    _, kwargs = pytree.tree_unflatten(leaves, program.call_spec.in_spec)  # hfx graphs take keywords only
    return kwargs


def _hints(exported: Exported) -> dict[str, int]:
    """The trace size of each named dim, read off the user-input placeholders."""
    program = exported.program
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    hints: dict[str, int] = {}
    for spec, user in zip(exported.io.inputs, program.graph_signature.user_inputs):
        val = placeholders[user].meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for want, size in zip(spec.shape, val.shape):
            if isinstance(want, str) and isinstance(size, torch.SymInt) and size.node.hint is not None:
                hints.setdefault(want, int(size.node.hint))
    return hints


def _example_size(hint: int, lo: int, hi: int) -> int:
    # torch.export specialises a dim traced at size 0 or 1, so a dynamic dim is traced at >= 2.
    return lo if lo == hi else min(max(hint, lo, 2), hi)


def _example(shape: tuple[int | str, ...], val: Any, sizes: Mapping[str, int]) -> Any:
    """A zero tensor like the placeholder ``val``, each named dim at ``sizes[name]`` (tracing reads only shapes).

    A derived dim (``"past_sequence + 1"``) is sized from its base.
    """
    if not isinstance(val, torch.Tensor):
        return val
    return torch.zeros([_named_size(want, size, sizes) for want, size in zip(shape, val.shape)], dtype=val.dtype)


def _named_size(want: int | str, size: int | torch.SymInt, sizes: Mapping[str, int]) -> int:
    base, offset = derived_dim(want) if isinstance(want, str) else (None, 0)
    return sizes[base] + offset if base in sizes else _concrete(size)


def _concrete(size: int | torch.SymInt) -> int:
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)
