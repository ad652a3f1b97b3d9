"""Concatenations of empty tensors, rewritten for the runtimes that mishandle them (OpenVINO, ExecuTorch).

Shared by ``OV_GRAPH_FIXES`` and ``lower_to_pte``; nothing here imports a runtime.
"""

from __future__ import annotations

from typing import Any

from hfx.backends._size_arithmetic import sym_node


def empty_cats_as_zeros(graph: Any, /) -> int:
    """Make each ``aten.cat`` whose operands have a size-0 dim other than the cat's a ``zeros`` of its shape;
    return how many.

    Model pattern: a cache layer that keeps an empty tensor beside the one it fills (Mistral Large 4's
    and DeepSeek-V3-style latent-attention layers keep ``values`` of shape ``[batch, 1, past, 0]``)
    and appends to it with ``torch.cat(..., dim=-2)``: the result holds no element but grows along
    the cat's dim. OpenVINO 2026.4.1's ``RemoveConcatZeroDimInput`` drops every Concat operand with
    a static size-0 dim whatever the axis; the step's empty values are computed (their 0 is known at
    conversion, the past input's shape is set after it), so they vanished and the returned past was
    one position short (generation: "axis 2 ... is 13 but 14"). A ``zeros`` of the cat's shape (sizes read from the
    operands, the cat's dim their sum) is the same empty tensor. Delete when that pass only drops
    operands empty along the concat axis.

    ExecuTorch 1.5.1's ``PruneEmptyTensorsPass`` makes such a cat (every operand empty) a ``full`` whose size
    list holds the cat's symbolic sizes themselves, which its emitter refuses ("Unsupported type encountered
    in int list": Mistral Large 4 and GLM-5-Next's language models). The ``zeros`` reads them from nodes.
    Delete that use when the pass writes its sizes as nodes.
    """
    import operator

    import torch

    aten = torch.ops.aten
    rewritten = 0
    for node in [n for n in graph.nodes if n.target is aten.cat.default]:
        value = node.meta.get("val")
        operands = [v for v in node.args[0] if not is_legacy_empty(v)]
        rank = len(getattr(value, "shape", ()))
        if not rank or not operands:
            continue
        dim = cat_dim(node) % rank
        if not any(isinstance(size, int) and size == 0 for d, size in enumerate(value.shape) if d != dim):
            continue
        with graph.inserting_before(node):

            def size_of(operand: Any, d: int) -> Any:
                size = operand.meta["val"].shape[d]
                if isinstance(size, int):
                    return size
                found = graph.call_function(aten.sym_size.int, (operand, d))
                found.meta["val"] = size
                return found

            shape: list[Any] = []
            for d in range(rank):
                if d != dim:
                    shape.append(size_of(operands[0], d))
                    continue
                total = size_of(operands[0], d)
                for operand in operands[1:]:
                    total = sym_node(graph, operator.add, total, size_of(operand, d))
                shape.append(total)
            zeros = graph.call_function(aten.zeros.default, (shape,), {"dtype": value.dtype, "device": value.device})
        zeros.meta = dict(node.meta)
        node.replace_all_uses_with(zeros)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def cat_dim(node: Any) -> int:
    """The dim an ``aten.cat`` node concatenates along, as written (it may be negative)."""
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)


def is_legacy_empty(value: Any) -> bool:
    """Whether ``value`` is a node of shape ``[0]``, which ``torch.cat`` skips."""
    shape = getattr(getattr(value, "meta", {}).get("val"), "shape", None)
    return shape is not None and len(shape) == 1 and isinstance(shape[0], int) and shape[0] == 0
