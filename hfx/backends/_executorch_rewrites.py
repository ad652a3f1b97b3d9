"""Rewrites of the edge graph that let XNNPACK take more of it: the rewrites ``lower_to_pte`` runs (``XNNPACK_REWRITES``).

XNNPACK's partitioner refuses some nodes of a graph with a dynamic dim that it
could run in another, equivalent form, and every refused node between two
delegated ones splits the graph: the refused node runs in ExecuTorch's portable
kernels and each split adds a delegate call. On a decoder LLM lowered for the
LLM runner (``decompose(internal_cache_length=...)``, one dynamic ``sequence``)
this took each layer's RMSNorms and its query, key and value reshapes out of
XNNPACK (executorch 1.5.1, ``partition/config/generic_node_configs.py``):

* ``view_copy`` whose target shape holds a symbolic size ("Symbolic reshape is
  not supported"), though XNNPACK infers one ``-1``;
* ``mean.dim``, which XNNPACK runs only as a global average pool over the last
  two dims of a 4D tensor ("mean.dim only supports averaging 4D tensors").

A rewrite (``PteRewrite``) changes an edge-dialect ``torch.fx.GraphModule`` in
place and returns how many places it rewrote; ``lower_to_pte(rewrites=...)``
runs them after ExecuTorch's edge conversion and before partitioning, and the
program records the counts of those that fired in ``PteProgram.rewrites``. Each
is exact (the same values, a reshape, the same mean over a reshaped tensor or
the same maximum), leaves a graph without its pattern as it is, and can be left
out on its own. Being exact, a rewrite left in place after XNNPACK takes the
original form costs nothing but its pass; delete ``views_infer_their_symbolic_dim``
when XNNPACK's ``view_copy`` config accepts a symbolic size, ``row_means_as_pooling``
when its ``mean.dim`` config accepts any reduced dims. The third,
``max_dims_xnnpack_serializes``, works around XNNPACK's ``max.dim`` errors rather than
its refusals: without it such a graph fails or computes wrong values (its docstring).
Nothing here imports executorch at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# A rewrite: changes the edge graph module in place, returns the number of places it rewrote.
PteRewrite = Callable[[Any], int]


def _with_one_inferred_dim(shape: Sequence[Any]) -> list[int] | None:
    """``shape`` with its one symbolic size as ``-1``; ``None`` when it has none or several.

    >>> _with_one_inferred_dim([1, "s", 9, 64]), _with_one_inferred_dim([1, 9]), _with_one_inferred_dim(["b", "s"])
    ([1, -1, 9, 64], None, None)
    """
    symbolic = [i for i, size in enumerate(shape) if not isinstance(size, int)]
    if len(symbolic) != 1:
        return None
    return [-1 if i == symbolic[0] else int(size) for i, size in enumerate(shape)]


def views_infer_their_symbolic_dim(graph_module: Any, /) -> int:
    """Give each ``view_copy`` with one symbolic size in its output ``-1`` there and ints elsewhere.

    The output's sizes come from the node's own metadata, so a shape written
    ``(*input_shape, -1, head_dim)`` over a symbolic ``input_shape`` becomes
    ``[1, -1, 9, 64]``: the same view, which XNNPACK takes.
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    count = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target != exir_ops.edge.aten.view_copy.default:
            continue
        if all(isinstance(size, int) for size in node.args[1]):
            continue
        shape = _with_one_inferred_dim(list(node.meta["val"].shape))
        if shape is not None:
            node.args = (node.args[0], shape)
            count += 1
    return count


def row_means_as_pooling(graph_module: Any, /) -> int:
    """Rewrite ``mean(x, [-1], keepdim=True)`` as the same mean over ``x`` viewed ``[1, -1, last, 1]``.

    XNNPACK averages a 4D tensor over its last two dims (a global average pool);
    the view puts the last dim there. Only where the output has at most one
    symbolic size (the view back needs one ``-1``) and the last dim is static.
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    view, mean = exir_ops.edge.aten.view_copy.default, exir_ops.edge.aten.mean.dim
    graph = graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != mean or node.kwargs.get("dtype") is not None:
            continue
        source, value = node.args[0], node.args[0].meta["val"]
        keepdim = len(node.args) > 2 and bool(node.args[2])
        last = value.shape[-1] if value.dim() else None
        if not value.dim() or not keepdim or [d % value.dim() for d in node.args[1]] != [value.dim() - 1]:
            continue
        back = _with_one_inferred_dim(list(node.meta["val"].shape)) or (
            [int(s) for s in node.meta["val"].shape] if all(isinstance(s, int) for s in node.meta["val"].shape) else None)
        if not isinstance(last, int) or back is None:
            continue
        with graph.inserting_before(node):
            square = graph.call_function(view, (source, [1, -1, last, 1]))
            square.meta["val"] = value.reshape(1, -1, last, 1)
            pooled = graph.call_function(mean, (square, [2, 3], True))
            pooled.meta["val"] = square.meta["val"].mean(dim=[2, 3], keepdim=True)
            result = graph.call_function(view, (pooled, back))
            result.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        count += 1
    return count


def max_dims_xnnpack_serializes(graph_module: Any, /) -> int:
    """Write ``max.dim`` over a 4D tensor in a form XNNPACK serializes right, or keep it from XNNPACK.

    XNNPACK's partitioner takes ``max.dim`` over any dim of a 4D tensor
    (``MaxDimConfig``) when only its values are used, but its serializer
    (``operators/op_max_dim.py``) takes only a dim written ``2`` or ``3``: a row
    maximum written ``dim=-1`` (HunYuan-V4's eager attention before its softmax)
    failed the whole lowering ("amax.default only supports dim == 2 or dim == 3").
    Written ``3``, a maximum over a derived dynamic size came out wrong: the
    row maximum of attention scores with a sink column concatenated (``width +
    1``, HunYuan-V4's and GPT-OSS's sinks) was 0.8 off eager's, at the capture's
    sizes too (measured, executorch 1.5.1; over an input's own dynamic dim it was
    right). So a static dim is written from the front (still delegated) and a
    maximum over a dynamic dim becomes ``amax`` (ExecuTorch's portable kernel).
    Unlike the rewrites above, leaving this one out fails such a graph or its
    values; delete it when XNNPACK serializes negative dims and derived sizes.
    """
    import operator

    from executorch.exir.dialects._ops import ops as exir_ops

    count = 0
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != exir_ops.edge.aten.max.dim:
            continue
        value = node.args[0].meta["val"]
        values_only = all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)
        if value.dim() != 4 or not values_only:
            continue
        dim, keepdim = node.args[1] % 4, len(node.args) > 2 and bool(node.args[2])
        if isinstance(value.shape[dim], int):
            if node.args[1] != dim:
                node.args = (node.args[0], dim, *node.args[2:])
                count += 1
            continue
        with graph.inserting_before(node):
            maximum = graph.call_function(exir_ops.edge.aten.amax.default, (node.args[0], [dim], keepdim))
            maximum.meta["val"] = value.amax(dim=dim, keepdim=keepdim)
        for user in list(node.users):
            user.replace_all_uses_with(maximum)
            graph.erase_node(user)
        graph.erase_node(node)
        count += 1
    return count


def as_edge_passes(rewrites: Sequence[PteRewrite], counts: dict[str, int]) -> list[Callable[[Any], Any]]:
    """``rewrites`` as ExecuTorch transform passes; each adds the places it rewrote to ``counts`` by its name."""
    from executorch.exir.pass_base import PassResult

    def edge_pass(rewrite: PteRewrite) -> Callable[[Any], Any]:
        def run(graph_module: Any) -> Any:
            count = rewrite(graph_module)
            if count:
                counts[rewrite.__name__] = counts.get(rewrite.__name__, 0) + count
                graph_module.graph.lint()
                graph_module.recompile()
            return PassResult(graph_module, bool(count))

        return run

    return [edge_pass(rewrite) for rewrite in rewrites]


# The rewrites ``lower_to_pte`` runs by default, in order. Read, extend or replace:
# ``lower_to_pte(rewrites=(*XNNPACK_REWRITES, my_rewrite))``; ``()`` runs none.
XNNPACK_REWRITES: tuple[PteRewrite, ...] = (views_infer_their_symbolic_dim, row_means_as_pooling,
                                          max_dims_xnnpack_serializes)
