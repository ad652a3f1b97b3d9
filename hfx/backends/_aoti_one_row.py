"""One-row matmuls in Inductor's own kernel: what makes a batch-1 decode step of an AOTInductor program fast
where ATen's BLAS call is slow.

A batch-1 decode step multiplies one row by each weight. AOTInductor calls ATen's
``mm``/``addmm`` (MKL on x86) for every matmul, and on some CPUs that call reads
a weight at half the speed memory gives: measured on an AMD EPYC with AVX-512, a
``[1, 576] x [576, 1536]`` ``mm`` takes 1.8x the time ``weight.sum()`` takes to
read the same bytes, so SmolLM's decode step ran at 0.88x eager's time, where an
Intel Xeon's all-ATen program read the weights at 1.06x the bandwidth floor. A matmul of one row is a
reduction: ``(row * weight).sum(-1)``, a kernel Inductor generates itself that
streams each weight once. The row count of a decode graph is a symbol (batch
times new tokens), so ``OneRowMatmuls`` (an Inductor post-grad pass) puts each
matmul of a weight behind a ``torch.cond`` on it: one row runs the reduction,
more rows (a prompt, a batch) run ATen's call as before. Both branches read the
same weight, so nothing is packed or copied. The matmuls that take the same rows
(a layer's q, k and v) share one cond: each cond is C++ that AOTInductor inlines
and compiles, so fewer conds compile faster (SmolLM's 211 matmuls in 121 conds).

``aten_one_row_slowdown`` measures whether the problem is present on this machine:
ATen's one-row matmul time over the time to read the same weights. ``lower_to_aoti``
takes the reduction where that is over ``SLOW_ONE_ROW`` (``one_row_matmuls="auto"``).
Delete when ATen's one-row matmul reads weights at memory speed on every CPU.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

# ATen's one-row matmul at this many times the time to read its weights is slow enough to be worth the
# reduction (measured: 1.5-2.1x on an AMD EPYC with AVX-512 for SmolLM's shapes; on an Intel Xeon, whose
# all-ATen program decoded at 1.06x the bandwidth floor, the ratio is expected near 1 but not yet measured).
SLOW_ONE_ROW = 1.3
# The weights the probe reads: enough bytes to leave the caches (a probe in cache measures call overhead).
PROBE_BYTES = 64 * 2**20
CHOICES = ("auto", "inductor", "aten")


def probe_weights(constants: Iterable[Any], *, limit: int = PROBE_BYTES) -> list[Any]:
    """The 2-D floating-point tensors of ``constants`` (distinct) up to ``limit`` bytes, one of each shape in
    turn as a decode step meets them, tables of over a quarter of ``limit`` (an embedding) only when the rest
    falls short; none when all of them hold fewer bytes than ``limit``: weights that fit in the caches say
    nothing about memory speed.

    >>> import torch
    >>> weights = [torch.ones(4096, 1024), torch.ones(1024, 512), torch.ones(1024, 512), torch.ones(3),
    ...            torch.ones(512, 1024), torch.ones(512, 1024), torch.ones(1024, 1024, dtype=torch.int8)]
    >>> [tuple(w.shape) for w in probe_weights(weights, limit=8 * 2**20)]
    [(1024, 512), (512, 1024), (1024, 512), (512, 1024)]
    >>> [tuple(w.shape) for w in probe_weights(weights, limit=12 * 2**20)][-1]
    (4096, 1024)
    >>> probe_weights(weights, limit=2**30)
    []
    """
    by_shape: dict[tuple[int, ...], list[Any]] = {}
    seen: set[int] = set()
    for tensor in constants:
        if tensor.dim() == 2 and tensor.is_floating_point() and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            by_shape.setdefault(tuple(tensor.shape), []).append(tensor)
    turns = [tensor for turn in itertools.zip_longest(*by_shape.values()) for tensor in turn if tensor is not None]
    small = [tensor for tensor in turns if _bytes(tensor) * 4 <= limit]
    chosen, total = [], 0
    for tensor in small + [tensor for tensor in turns if _bytes(tensor) * 4 > limit]:
        chosen.append(tensor)
        total += _bytes(tensor)
        if total >= limit:
            return chosen
    return []


def _bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def aten_one_row_slowdown(weights: Sequence[Any], *, rounds: int = 5) -> float:
    """ATen's one-row matmul over ``weights`` (``mm(row, weight.T)``, as a decode step calls it) divided by the
    time ``weight.sum()`` takes to read the same bytes: the median of ``rounds``, on torch's current threads."""
    import torch

    rows = {w.shape[1]: torch.ones(1, w.shape[1], dtype=w.dtype) for w in weights}

    def seconds(work: Any) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for weight in weights:
                work(weight)
        return time.perf_counter() - start

    def matmul(weight: Any) -> Any:
        return torch.mm(rows[weight.shape[1]], weight.t())

    seconds(matmul), seconds(torch.sum)  # warm: page faults of mapped weights, MKL's first call
    ratios = sorted(seconds(matmul) / seconds(torch.sum) for _ in range(rounds))
    return ratios[len(ratios) // 2]


def check_choice(choice: Any) -> str:
    """``choice`` when it is one of ``CHOICES``."""
    if choice not in CHOICES:
        msg = f"lower_to_aoti: one_row_matmuls must be one of {', '.join(map(repr, CHOICES))}, got {choice!r}"
        raise ValueError(msg)
    return choice


def chosen_kernel(choice: str, slowdown: float | None) -> str:
    """``"inductor"`` or ``"aten"``: ``choice`` itself unless ``"auto"``, which takes Inductor's reduction where
    ATen's one-row matmul is at least ``SLOW_ONE_ROW`` times slower than reading its weights (``slowdown``;
    ``None``: not measured, too few weights to leave the caches).

    >>> chosen_kernel("auto", 1.8), chosen_kernel("auto", 1.05), chosen_kernel("auto", None), chosen_kernel("aten", 3.0)
    ('inductor', 'aten', 'aten', 'aten')
    """
    if choice != "auto":
        return choice
    return "inductor" if slowdown is not None and slowdown >= SLOW_ONE_ROW else "aten"


@attrs.frozen(kw_only=True, eq=False)
class _WeightMatmul:
    """An ``mm``/``addmm`` node of the post-grad graph whose right operand is a 2-D weight (``get_attr``) or its
    transpose (``permute(weight, [1, 0])``, as a ``Linear`` lowers): ``rows @ weight[.T] (+ bias)``."""

    node: Any
    rows: Any
    weight: Any
    transposed: bool
    bias: Any = None

    @property
    def operands(self) -> tuple[Any, ...]:
        return (self.weight,) if self.bias is None else (self.weight, self.bias)


def _weight_matmul(node: Any) -> _WeightMatmul | None:
    """``node`` as a ``_WeightMatmul`` when it is one whose row count is a symbol of the inputs' sizes; else None."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
        return None
    bias = node.args[0] if node.target == aten.addmm.default else None
    rows, right = node.args[-2:]
    transposed = (right.op == "call_function" and right.target == aten.permute.default
                  and list(right.args[1]) == [1, 0])
    weight = right.args[0] if transposed else right
    if weight.op != "get_attr" or getattr(weight.meta.get("val"), "ndim", 0) != 2:
        return None
    count = rows.meta["val"].shape[0]
    if isinstance(count, int):  # a number of rows: nothing to choose at run time
        return None
    if free_unbacked_symbols(count):
        # a count computed from data (Idefics3's real images): never a decode step, and Inductor gives a cond's
        # outputs new data-dependent sizes whose bounds AOTInductor cannot print (16 x (2^63 - 2))
        return None
    return _WeightMatmul(node=node, rows=rows, weight=weight, transposed=transposed, bias=bias)


def _branch(matmuls: Sequence[_WeightMatmul], *, one_row: bool) -> Any:
    """The graph of one branch over ``(rows, *each matmul's operands)``, returning each matmul's result: the
    reductions for one row, else ATen's matmuls."""
    import torch

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    rows = graph.placeholder("rows")
    outputs = []
    for index, matmul in enumerate(matmuls):
        weight = graph.placeholder(f"weight_{index}")
        bias = None if matmul.bias is None else graph.placeholder(f"bias_{index}")
        if one_row:
            # weight [n, k]: out[m, n] = sum_k rows[m, k] * weight[n, k]; weight [k, n]: sum over its dim 0
            column = graph.call_function(aten.unsqueeze.default, (rows, 1 if matmul.transposed else 2))
            product = graph.call_function(aten.mul.Tensor, (column, weight))
            out = graph.call_function(aten.sum.dim_IntList, (product, [-1 if matmul.transposed else 1]))
            if bias is not None:
                out = graph.call_function(aten.add.Tensor, (out, bias))
        else:
            right = graph.call_function(aten.permute.default, (weight, [1, 0])) if matmul.transposed else weight
            out = (graph.call_function(aten.mm.default, (rows, right)) if bias is None
                   else graph.call_function(aten.addmm.default, (bias, rows, right)))
        outputs.append(out)
    graph.output(tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _with_values(module: Any, values: Sequence[Any]) -> Any:
    """``module`` with each node's ``meta["val"]`` (Inductor lowers a branch from them), run on ``values``."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(module, detect_fake_mode(values)).propagate_dont_convert_inputs(*values)
    return module


def _groups(graph: Any) -> list[list[_WeightMatmul]]:
    """The weight matmuls of ``graph`` that take the same rows (a layer's q, k and v; its gate and up: each takes
    its own reshape of the same tensor) as one group, in graph order; one with an operand made after the group's
    first matmul (an ``addmm`` whose bias is another matmul's result) goes alone."""
    import torch

    def same_rows(rows: Any) -> Any:
        if rows.op == "call_function" and rows.target in (torch.ops.aten.reshape.default, torch.ops.aten.view.default):
            return rows.args[0], str(tuple(rows.meta["val"].shape))
        return rows

    position = {node: index for index, node in enumerate(graph.nodes)}
    by_rows: dict[Any, list[_WeightMatmul]] = {}
    alone = []
    for node in graph.nodes:
        matmul = _weight_matmul(node)
        if matmul is None:
            continue
        group = by_rows.setdefault(same_rows(matmul.rows), [])
        if group and any(position[operand] >= position[group[0].node] for operand in matmul.operands):
            alone.append([matmul])
        else:
            group.append(matmul)
    return sorted([*by_rows.values(), *alone], key=lambda group: position[group[0].node])


def rewrite_one_row_matmuls(graph: Any) -> int:
    """Put the ``mm``/``addmm`` nodes of weights in ``graph`` (Inductor's post-grad graph, changed in place) behind
    a ``torch.cond`` on their row count, a symbol, one cond for the matmuls that take the same rows: one row runs
    reductions Inductor generates, more run the matmuls as before. Returns how many matmuls it rewrote."""
    import torch

    module, count = graph.owning_module, 0
    for index, found in enumerate(_groups(graph)):
        # read again: a group's rows or bias may be the result of a matmul rewritten before it
        group = [_weight_matmul(matmul.node) for matmul in found]
        rows, first = group[0].rows, group[0].node
        operands = (rows, *(operand for matmul in group for operand in matmul.operands))
        values = [operand.meta["val"] for operand in operands]
        names = []
        for one_row in (True, False):
            name = f"hfx_one_row_{'reduce' if one_row else 'matmul'}_{index}"
            module.add_submodule(name, _with_values(_branch(group, one_row=one_row), values))
            names.append(name)
        row_count = rows.meta["val"].shape[0]
        with graph.inserting_before(first):
            size = graph.call_function(torch.ops.aten.sym_size.int, (rows, 0))
            size.meta["val"] = row_count
            one = graph.call_function(operator.eq, (size, 1))
            one.meta["val"] = row_count == 1
            branches = graph.call_function(torch.ops.higher_order.cond,
                                           (one, *(graph.get_attr(name) for name in names), operands))
            branches.meta["val"] = tuple(matmul.node.meta["val"] for matmul in group)
            for position, matmul in enumerate(group):
                out = graph.call_function(operator.getitem, (branches, position))
                out.meta = dict(matmul.node.meta)
                matmul.node.replace_all_uses_with(out)
        for matmul in group:
            graph.erase_node(matmul.node)
        count += len(group)
    graph.eliminate_dead_code()  # the transposes the matmuls took
    return count


def one_row_matmuls_pass() -> Any:
    """The Inductor post-grad pass (``post_grad_custom_post_pass``) that runs ``rewrite_one_row_matmuls``."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class OneRowMatmuls(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            rewrite_one_row_matmuls(graph)

        def uuid(self) -> Any:  # Inductor's cache key: this file's code
            return get_hash_for_files((__file__,))

    return OneRowMatmuls()
