"""Index dtypes ExecuTorch's edge dialect requires, written into the exported graph before ``to_edge``."""

from __future__ import annotations

from typing import Any


def long_scatter_indices(graph: Any, /) -> int:
    """Cast the int32 ``index`` of each ``aten.scatter_add`` (or in-place ``scatter_add_``, which the exported
    graph keeps until ExecuTorch functionalises it) to int64, in place; return how many.

    torch's ``scatter_add`` takes an int32 index, and a model that keeps its indices in int32 passes
    one (GLM-5-Next's sparse-attention mask from its top-k: ``build_attention_mask_from_topk``,
    transformers 5.22-5.24). ExecuTorch 1.5.1's edge dialect allows only int64 there (``edge.yaml``:
    ``scatter_add``'s index is ``Long``) and refuses the program ("SpecViolationError: These
    operators are taking Tensor inputs with mismatched dtypes"). The cast keeps every index value.
    Delete when ExecuTorch's schema takes an int32 index.
    """
    import torch

    scatter_adds = (torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default)
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in scatter_adds or len(node.args) < 3:
            continue
        index = node.args[2]
        value = getattr(index, "meta", {}).get("val")
        if value is None or value.dtype != torch.int32:
            continue
        with graph.inserting_before(node):
            cast = graph.call_function(torch.ops.aten._to_copy.default, (index,), {"dtype": torch.int64})
        cast.meta = {**index.meta, "val": value.to(torch.int64)}
        node.args = (*node.args[:2], cast, *node.args[3:])
        count += 1
    return count
