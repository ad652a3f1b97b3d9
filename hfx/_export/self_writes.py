"""Writes of a buffer's own unchanged value back into it, taken out of the graph.

Model pattern: a forward that re-assigns a buffer to itself cast to the device
and dtype it already has, ``self.pos_encoding = self.pos_encoding.to(device=...,
dtype=...)`` (CTRL, transformers 5.22-5.24). ``torch.export`` records the
assignment as an in-place write, ``copy_(buffer, buffer.to(...))``, so the
buffer becomes state. The write changes nothing, but a runtime that keeps
written buffers as state does not keep their values: ExecuTorch "assumes buffers
that are mutated in the graph have a meaningless initial state" (its emitter's
warning) and ran CTRL on a zeroed positional table. Without the write the
buffer is a constant again, on every runtime.
"""

from __future__ import annotations

import torch

# ops that return their input's values unchanged when dtype and shape stay (a same-dtype `.to()` is one)
_VALUE_PRESERVING = frozenset({
    "aten::to", "aten::_to_copy", "aten::clone", "aten::alias", "aten::detach", "aten::contiguous",
    "aten::lift_fresh_copy",
})


def _source_buffer(value: torch.fx.Node, like: torch.Tensor) -> torch.fx.Node | None:
    """The placeholder ``value`` copies unchanged (through ``.to()``, ``clone`` ...), or ``None``."""
    while value.op == "call_function":
        val = value.meta.get("val")
        name = getattr(getattr(value.target, "_schema", None), "name", None)
        if name not in _VALUE_PRESERVING or not isinstance(val, torch.Tensor) or val.dtype != like.dtype \
                or val.device != like.device or val.shape != like.shape or not value.args:
            return None
        value = value.args[0]
        if not isinstance(value, torch.fx.Node):
            return None
    return value if value.op == "placeholder" else None


def _writes(node: torch.fx.Node) -> bool:
    """Whether ``node`` writes one of its arguments in place."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def self_writes(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The ``copy_`` nodes of ``program`` that write a buffer's own value back into it and are its only writes."""
    buffers = set(program.graph_signature.inputs_to_buffers)
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default or node.users:
            continue
        target, source = node.args[0], node.args[1]
        if not isinstance(target, torch.fx.Node) or target.op != "placeholder" or target.name not in buffers \
                or not isinstance(source, torch.fx.Node) or not isinstance(target.meta.get("val"), torch.Tensor):
            continue
        alone = not any(_writes(user) for user in target.users if user is not node)
        if alone and _source_buffer(source, target.meta["val"]) is target:
            found.append(node)
    return found


def without_self_writes(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without the writes of ``self_writes``: the buffers they wrote are constants again.

    The graph is changed in place (the program is hfx's own, fresh from torch.export).
    """
    found = self_writes(program)
    for node in found:
        program.graph.erase_node(node)
    if found:
        program.graph_module.recompile()
    return program
