"""``XNNPACK_REWRITES``: each rewrite alone on an edge graph, and ``lower_to_pte(rewrites=...)`` end to end.

The module is what a decoder layer gives XNNPACK to refuse over a dynamic ``sequence``: a reshape written with
the symbolic size and an RMSNorm-style mean over the last dim. Lowering it costs about a second.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx.backends import XNNPACK_REWRITES  # noqa: E402
from hfx.backends._executorch_rewrites import (  # noqa: E402
    max_dims_xnnpack_serializes,
    row_means_as_pooling,
    views_infer_their_symbolic_dim,
)
from tests.tolerances import FP32_ONE_BLOCK  # noqa: E402


class NormAndHeads(torch.nn.Module):
    """``x [1, s, 8]`` -> the mean of squares over the last dim (kept), times ``x`` viewed as 2 heads of 4."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (x * scale).view(1, x.shape[1], 2, 4) * 2.0


def _capture() -> hfx.Capture:
    """One sequence of 5 (batch 1, as the LLM runner's program), the sequence axis dynamic up to 32."""
    shapes = hfx.DynamicShapes(axes={"x": {1: "sequence"}}, bounds={"sequence": (1, 32)})
    return hfx.capture({"x": torch.randn(1, 5, 8)}, NormAndHeads(), dynamic_shapes=shapes)


def _edge_graph() -> torch.fx.GraphModule:
    """The module's edge graph (no partitioning), as the rewrites see it inside ``lower_to_pte``."""
    from executorch.exir import to_edge

    exported = hfx.export(_capture())
    return to_edge(exported.program).exported_program().graph_module


def _targets(graph_module: torch.fx.GraphModule) -> list[str]:
    return [str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"]


def test_views_infer_their_symbolic_dim_writes_minus_one_where_the_size_was_symbolic():
    graph_module = _edge_graph()
    views = [n for n in graph_module.graph.nodes if "view_copy" in str(n.target)]
    assert any(not all(isinstance(size, int) for size in n.args[1]) for n in views)
    assert views_infer_their_symbolic_dim(graph_module) == 1
    assert [n.args[1] for n in views] == [[1, -1, 2, 4]]
    assert views_infer_their_symbolic_dim(graph_module) == 0  # nothing left to rewrite


def test_row_means_as_pooling_averages_a_4d_view_over_its_last_two_dims():
    graph_module = _edge_graph()
    assert row_means_as_pooling(graph_module) == 1
    graph_module.graph.lint()
    means = [n for n in graph_module.graph.nodes if "mean" in str(n.target)]
    assert [(n.args[0].meta["val"].dim(), n.args[1], n.args[2]) for n in means] == [(4, [2, 3], True)]
    assert row_means_as_pooling(graph_module) == 0  # a 4D mean over [2, 3] is what XNNPACK takes already


def test_lowering_with_the_rewrites_keeps_parity_and_moves_the_ops_into_xnnpack():
    exported = hfx.export(_capture())
    before = str(exported.program.graph)
    plain, rewritten = hfx.lower_to_pte(exported, rewrites=()), hfx.lower_to_pte(exported)
    assert dict(plain.rewrites) == {} and dict(rewritten.rewrites) == {
        "views_infer_their_symbolic_dim": 1, "row_means_as_pooling": 1}
    assert {"aten::mean", "executorch_prim::et_view"} <= set(plain.operators)
    assert not {"aten::mean", "executorch_prim::et_view"} & set(rewritten.operators)
    x = torch.randn(1, 11, 8)  # another length than the capture's
    torch.testing.assert_close(rewritten(x=x), NormAndHeads()(x), atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)
    assert str(exported.program.graph) == before  # the Exported is not changed


def test_the_rewrites_are_a_tuple_of_callables():
    assert XNNPACK_REWRITES == (views_infer_their_symbolic_dim, row_means_as_pooling, max_dims_xnnpack_serializes)
    with pytest.raises(TypeError, match="lower_to_pte: rewrites"):
        hfx.lower_to_pte(_capture(), rewrites=[1])


class RowMaximum(torch.nn.Module):
    """``x [b, 2, s, w]`` minus its row maximum over the last dim, written ``dim=-1`` (an eager softmax's first step)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.max(dim=-1, keepdim=True).values


class SinkSoftmax(torch.nn.Module):
    """Attention sinks as HunYuan-V4 and GPT-OSS write them: a column per head concatenated to the scores, the row
    maximum subtracted, a softmax, the column dropped. The maximum is over ``width + 1``, a derived dynamic size."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.sinks, self.dim = torch.nn.Parameter(torch.randn(2)), dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(x.shape[0], -1, x.shape[-2], -1)
        combined = torch.cat([x, sinks], dim=-1)
        combined = combined - combined.max(dim=self.dim, keepdim=True).values
        return torch.softmax(combined, dim=-1)[..., :-1]


def _row_max_export(module: torch.nn.Module, *, dynamic_width: bool) -> hfx.Exported:
    axes = {0: "batch", 2: "sequence", **({3: "width"} if dynamic_width else {})}
    bounds = {"batch": (1, 4), "sequence": (1, 16), **({"width": (2, 16)} if dynamic_width else {})}
    shapes = hfx.DynamicShapes(axes={"x": axes}, bounds=bounds)
    return hfx.export(hfx.capture({"x": torch.randn(2, 2, 5, 6)}, module, dynamic_shapes=shapes))


def test_a_row_maximum_over_a_static_last_dim_stays_in_xnnpack_written_from_the_front():
    program = hfx.lower_to_pte(_row_max_export(RowMaximum(), dynamic_width=False))
    assert dict(program.rewrites)["max_dims_xnnpack_serializes"] == 1 and "aten::amax" not in program.operators
    for size in ((3, 2, 9, 6), (1, 2, 2, 6)):
        x = torch.randn(*size)
        torch.testing.assert_close(program(x=x), RowMaximum()(x), atol=0, rtol=0)


def test_a_row_maximum_over_a_derived_dynamic_dim_runs_as_amax_with_eagers_values():
    torch.manual_seed(0)
    module = SinkSoftmax()
    program = hfx.lower_to_pte(_row_max_export(module, dynamic_width=True))
    assert dict(program.rewrites)["max_dims_xnnpack_serializes"] == 1 and "aten::amax" in program.operators
    for size in ((2, 2, 5, 6), (3, 2, 9, 11), (1, 2, 2, 3)):
        x = torch.randn(*size)
        torch.testing.assert_close(program(x=x), module(x), atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)


_WITHOUT_MAX_DIMS = tuple(r for r in XNNPACK_REWRITES if r is not max_dims_xnnpack_serializes)


def test_without_the_rewrite_a_row_maximum_written_minus_one_still_fails():
    """Canary, and the option honoured: when this lowers, XNNPACK serializes dim -1 and that branch can go."""
    with pytest.raises(hfx.LoweringError, match="amax.default only supports dim == 2 or dim == 3"):
        hfx.lower_to_pte(_row_max_export(RowMaximum(), dynamic_width=False), rewrites=_WITHOUT_MAX_DIMS)


def test_without_the_rewrite_xnnpack_still_gets_a_maximum_over_a_derived_dynamic_dim_wrong():
    """Canary: when XNNPACK's maximum over ``width + 1`` is right, the amax branch can go."""
    torch.manual_seed(0)
    module = SinkSoftmax(dim=3)  # written from the front, which XNNPACK serializes
    program = hfx.lower_to_pte(_row_max_export(module, dynamic_width=True), rewrites=_WITHOUT_MAX_DIMS)
    x = torch.randn(2, 2, 5, 6)  # even at the capture's sizes
    assert (program(x=x) - module(x)).abs().max() > 0.1
