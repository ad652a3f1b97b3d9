"""hfx's decompositions of ops a runtime lacks: ``dense_scatter_reduce`` equals the op, and the runtimes without it
(OpenVINO's frontend, ExecuTorch's kernels) lower a segment reduction as TAPAS writes it; ExecuTorch lowers
``erfinv`` (Gemma 3n) as ``giles_erfinv``; ``cummax``, ``cummin`` and ``searchsorted`` (Grounding DINO) lower to
both."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import hfx
from hfx.backends import _decompositions
from hfx.backends._decompositions import (
    counting_searchsorted,
    dense_scatter_reduce,
    frame_wise_convolution,
    prefix_cummax,
    prefix_cummin,
)

# (self shape, dim, index length along dim)
_CASES = [((5,), 0, 7), ((3, 6), 1, 4), ((6, 3), 0, 9), ((2, 3, 5), 1, 2), ((2, 3, 5), -1, 8)]


@pytest.mark.parametrize(("reduce", "include_self"), itertools.product(["sum", "mean", "prod", "amax", "amin"], [True, False]))
def test_dense_scatter_reduce_equals_the_op(reduce, include_self):
    generator = torch.Generator().manual_seed(0)
    for shape, dim, length in _CASES:
        out = torch.randn(shape, generator=generator)
        index_shape = list(shape)
        index_shape[dim] = length
        index = torch.randint(0, shape[dim], index_shape, generator=generator)  # some positions named twice, some never
        src = torch.randn(index_shape, generator=generator)
        want = out.scatter_reduce(dim, index, src, reduce, include_self=include_self)
        # float32 sums and products over at most 9 terms of unit scale: a few ulps apart from the op's order.
        torch.testing.assert_close(dense_scatter_reduce(out, dim, index, src, reduce, include_self=include_self), want,
                                   rtol=1e-5, atol=1e-6)


def test_dense_scatter_reduce_leaves_what_it_does_not_cover_to_the_op():
    ints = torch.zeros(3, dtype=torch.long)
    assert dense_scatter_reduce(ints, 0, torch.tensor([0]), torch.tensor([1]), "sum") is NotImplemented
    narrower = torch.zeros(3, 4)  # an index narrower than self in a dim other than dim
    assert dense_scatter_reduce(narrower, 0, torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2), "sum") is NotImplemented


class SegmentMin(torch.nn.Module):
    """The first position of each segment, as TAPAS's ``reduce_min`` of its position ids per table cell
    (``scatter_reduce`` with ``include_self=False``); a segment no token is in keeps 0."""

    def forward(self, position_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(8)
        return out.scatter_reduce(0, token_type_ids.reshape(-1), position_ids.reshape(-1).float(), reduce="amin",
                                  include_self=False)


def _inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    return {"position_ids": torch.randint(0, 50, (batch, sequence), generator=generator),
            "token_type_ids": torch.randint(0, 8, (batch, sequence), generator=generator)}


@pytest.mark.parametrize(("runtime", "package"), [("lower_to_ov", "openvino"), ("lower_to_pte", "executorch")])
def test_a_segment_reduction_lowers_and_matches_eager_at_new_shapes(runtime, package):
    pytest.importorskip(package)
    model = SegmentMin()
    program = getattr(hfx, runtime)(hfx.export(hfx.capture(_inputs(2, 6), model)))
    for batch, sequence in ((3, 11), (1, 4)):
        assert hfx.verify(model, _inputs(batch, sequence), program).passed


def test_the_runtimes_still_lack_the_op():
    """Canary: when one fails, that runtime converts or runs ``scatter_reduce.two`` and its entry steps aside."""
    op = torch.ops.aten.scatter_reduce.two
    if pytest.importorskip("openvino"):
        assert op in _decompositions.openvino_decompositions()
    if pytest.importorskip("executorch"):
        assert op in _decompositions.executorch_decompositions()
        assert torch.ops.aten.erfinv.default in _decompositions.executorch_decompositions()



class Threshold(torch.nn.Module):
    """``erfinv`` of the inputs, as Gemma 3n's ``Normal(0, 1).icdf`` computes its sparsity threshold."""

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return 1.4142135 * torch.erfinv(2 * input_values - 1)


def erfinv_program(lower) -> Any:
    """``Threshold`` captured at batch 2 x 16 and lowered by ``lower``."""
    inputs = {"input_values": torch.rand(2, 16, generator=torch.Generator().manual_seed(0))}
    return lower(hfx.export(hfx.capture(inputs, Threshold())))


def assert_erfinv_matches_torch(program, length: int) -> None:
    """``program`` (of ``Threshold``) gives torch's values at batch 3 x ``length`` points, and its ends (+-inf, NaN)."""
    inside = torch.linspace(1e-6, 1 - 1e-6, length)[None].expand(3, -1).contiguous()
    # Giles' approximation: within 3.7e-7 relative of the exact value (his bound; 2.8e-7 measured over 100k points),
    # torch's float32 erfinv a few ulps from it; near 0 the value is 0.886 x, so the absolute floor is one ulp of 1.
    torch.testing.assert_close(program(input_values=inside), Threshold()(inside), rtol=1e-6, atol=1.2e-7)
    ends = program(input_values=torch.tensor([[0.0, 1.0, -0.5, 1.5]]))
    assert ends[0, 0] == -torch.inf and ends[0, 1] == torch.inf and ends[0, 2:].isnan().all()  # as torch.erfinv


def test_erfinv_lowers_to_executorch_and_matches_eager_at_new_shapes():
    pytest.importorskip("executorch")
    assert_erfinv_matches_torch(erfinv_program(hfx.lower_to_pte), 500)  # within the .pte's planned 512


@pytest.mark.parametrize("shape", [(9,), (3, 9), (2, 4, 6)])
def test_prefix_extremes_equal_torchs_values_and_tie_indices(shape):
    generator = torch.Generator().manual_seed(len(shape))
    for x in (torch.randint(0, 4, shape, generator=generator), torch.randn(shape, generator=generator)):  # ties, none
        for dim in range(-len(shape), len(shape)):
            for ours, torchs in ((prefix_cummax, torch.cummax), (prefix_cummin, torch.cummin)):
                values, indices = ours(x, dim)
                assert torch.equal(values, torchs(x, dim).values) and torch.equal(indices, torchs(x, dim).indices)


def test_counting_searchsorted_equals_the_op():
    generator = torch.Generator().manual_seed(0)
    edges = torch.sort(torch.randint(0, 20, (2, 8), generator=generator), -1).values
    values = torch.randint(-2, 22, (2, 5), generator=generator)
    for right, out_int32 in itertools.product([False, True], [False, True]):
        got = counting_searchsorted(edges, values, right=right, out_int32=out_int32)
        want = torch.searchsorted(edges, values, right=right, out_int32=out_int32)
        assert torch.equal(got, want) and got.dtype == want.dtype
    assert counting_searchsorted(edges, values, sorter=torch.zeros(2, 8, dtype=torch.long)) is NotImplemented


class SpecialTokenSpans(torch.nn.Module):
    """Grounding DINO's text masks (``generate_masks_with_special_tokens_and_transfer_map``): the running maximum
    of the special tokens' positions, the running minimum over the flipped text, and a bucket per position."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        special = torch.where(input_ids % 5 == 0, positions, torch.zeros_like(positions))
        previous = torch.cummax(special, dim=1).values
        following = torch.cummin(torch.where(special > 0, special, input_ids.shape[1]).flip(1), dim=1).values.flip(1)
        buckets = torch.searchsorted(torch.tensor([2.0, 4.0, 8.0]), positions.float().contiguous())
        return previous + following + buckets


@pytest.mark.parametrize(("runtime", "package"), [("lower_to_ov", "openvino"), ("lower_to_pte", "executorch")])
def test_running_extremes_and_a_search_lower_and_match_eager_at_new_shapes(runtime, package):
    pytest.importorskip(package)
    model = SpecialTokenSpans()
    ids = lambda batch, sequence: {"input_ids": torch.randint(1, 30, (batch, sequence),  # noqa: E731
                                                              generator=torch.Generator().manual_seed(sequence))}
    program = getattr(hfx, runtime)(hfx.export(hfx.capture(ids(2, 7), model)))
    for batch, sequence in ((3, 11), (1, 4)):
        assert hfx.verify(model, ids(batch, sequence), program).passed


def test_the_runtimes_still_lack_the_search_and_running_extremes():
    """Canary: when one fails, that runtime converts or runs the op and its entry steps aside."""
    ops = {torch.ops.aten.cummax.default, torch.ops.aten.cummin.default, torch.ops.aten.searchsorted.Tensor}
    if pytest.importorskip("openvino"):
        assert ops <= set(_decompositions.openvino_decompositions())
    if pytest.importorskip("executorch"):
        assert ops <= set(_decompositions.executorch_decompositions())


# (stride, padding, dilation, groups, bias) of 3-D convolutions: tubelets (stride = kernel), overlapping and padded
# frames, dilated frames, grouped channels
_CONV3D_CASES = [((2, 4, 4), (0, 0, 0), (1, 1, 1), 1, True), ((1, 1, 1), (1, 1, 1), (1, 1, 1), 1, False),
                 ((2, 1, 2), (2, 0, 1), (2, 1, 1), 2, True)]


@pytest.mark.parametrize(("stride", "padding", "dilation", "groups", "bias"), _CONV3D_CASES)
def test_frame_wise_convolution_equals_a_3d_convolution(stride, padding, dilation, groups, bias):
    generator = torch.Generator().manual_seed(groups)
    x = torch.randn(2, 4, 7, 8, 8, generator=generator)
    weight = torch.randn(6, 4 // groups, 3, 4, 4, generator=generator)
    b = torch.randn(6, generator=generator) if bias else None
    want = torch.nn.functional.conv3d(x, weight, b, stride, padding, dilation, groups)
    got = frame_wise_convolution(x, weight, b, list(stride), list(padding), list(dilation), False, [0, 0, 0], groups)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_frame_wise_convolution_leaves_other_convolutions_to_the_op():
    x, weight = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    assert frame_wise_convolution(x, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1) is NotImplemented
    video, kernel = torch.randn(1, 2, 3, 6, 6), torch.randn(2, 3, 1, 3, 3)
    assert frame_wise_convolution(video, kernel, None, [1, 1, 1], [0] * 3, [1] * 3, True, [0] * 3, 1) is NotImplemented


class Tubelets(torch.nn.Module):
    """VideoMAE's patch embedding: ``[batch, frames, channels, height, width]`` into tubelets of 2 frames x 8 x 8
    pixels by a 3-D convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.projection = torch.nn.Conv3d(3, 8, kernel_size=(2, 8, 8), stride=(2, 8, 8))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.projection(pixel_values.permute(0, 2, 1, 3, 4)).flatten(2).transpose(1, 2)


def _video(batch: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch, 4, 3, 16, 16, generator=torch.Generator().manual_seed(batch))}


def test_a_tubelet_embedding_lowers_to_executorch_and_matches_eager_at_a_new_batch():
    pytest.importorskip("executorch")
    model = Tubelets()
    program = hfx.lower_to_pte(hfx.export(hfx.capture(_video(2), model)))
    assert hfx.verify(model, _video(3), program).passed


def test_executorch_still_refuses_a_3d_convolution(monkeypatch):
    """Canary: when this fails, ExecuTorch runs a 3-D convolution and ``frame_wise_convolution`` can go."""
    pytest.importorskip("executorch")
    as_it_is = lambda *args: NotImplemented  # noqa: E731 - the entry, stepping aside
    as_it_is.applies_to = lambda node: False
    monkeypatch.setattr(_decompositions, "frame_wise_convolution", as_it_is)
    program = hfx.lower_to_pte(hfx.export(hfx.capture(_video(2), Tubelets())))
    with pytest.raises(hfx.LoweringError, match="InvalidArgument"):
        program(**_video(2))
