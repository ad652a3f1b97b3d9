"""hfx's ONNX translations of ATen ops torchlib lacks: ``erfinv`` (Gemma 3n's activation sparsity threshold) and
``searchsorted`` and ``cummax`` (Grounding DINO)."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx.backends._onnx_translations import onnx_translations
from tests.backends.test_decompositions import assert_erfinv_matches_torch, erfinv_program

pytest.importorskip("onnxruntime")


def test_erfinv_matches_torch_over_the_open_interval_and_its_ends():
    assert_erfinv_matches_torch(erfinv_program(hfx.lower_to_onnx), 20_001)


def test_the_translation_is_given_while_torchlib_lacks_erfinv():
    """Canary: when this fails, torchlib translates erfinv and hfx's translation steps aside."""
    assert torch.ops.aten.erfinv.default in onnx_translations()


class _Bucketed(torch.nn.Module):
    """``searchsorted`` as Grounding DINO calls it, with batched and shared boundaries, both sides, both dtypes."""

    def forward(self, boundaries: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.searchsorted(boundaries, values), torch.searchsorted(boundaries, values, right=True, out_int32=True),
                torch.searchsorted(boundaries[0], values, side="right"))


def test_searchsorted_gives_torchs_indices_ties_and_ends_included_at_a_new_batch():
    ties = torch.tensor([[0.1, 0.3, 0.3, 0.7], [0.2, 0.4, 0.6, 0.8]])
    program = hfx.lower_to_onnx(hfx.export(hfx.capture({"boundaries": ties, "values": torch.rand(2, 3)}, _Bucketed())))
    boundaries = torch.sort(torch.rand(3, 4, generator=torch.Generator().manual_seed(0))).values
    boundaries[:, 1] = boundaries[:, 2]  # a tie
    values = torch.cat([boundaries[:, 1:3], torch.tensor([[-1.0], [2.0], [0.5]])], dim=1)  # on entries, below, above
    for got, want in zip(program(boundaries=boundaries, values=values), _Bucketed()(boundaries, values), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_the_translation_is_given_while_torchlib_lacks_searchsorted():
    """Canary: when this fails, torchlib translates searchsorted and hfx's translation steps aside."""
    assert torch.ops.aten.searchsorted.Tensor in onnx_translations()


class _RunningMax(torch.nn.Module):
    """``cummax`` and ``cummin`` as Grounding DINO takes them (integer positions along the text), and over floats."""

    def forward(self, positions: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*torch.cummax(positions, dim=1), *torch.cummax(values, dim=-1), *torch.cummin(positions, dim=1),
                *torch.cummin(values, dim=-1))


def test_cummax_and_cummin_give_torchs_values_and_indices_ties_included_at_a_new_batch():
    positions = torch.tensor([[1, 3, 3, 2, 5, 5], [0, 0, 2, 1, 1, 7]])
    program = hfx.lower_to_onnx(hfx.export(hfx.capture({"positions": positions, "values": torch.randn(2, 3, 5)},
                                                       _RunningMax())))
    positions = torch.tensor([[4, 4, 4, 1, 9, 0], [2, 1, 2, 2, 0, 3], [0, 0, 0, 0, 0, 0]])  # ties: the last index
    values = torch.randn(3, 3, 5, generator=torch.Generator().manual_seed(0))
    for got, want in zip(program(positions=positions, values=values), _RunningMax()(positions, values), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_the_translations_are_given_while_torchlib_lacks_cummax_and_cummin():
    """Canary: when this fails, torchlib translates one of them and hfx's translation steps aside."""
    assert {torch.ops.aten.cummax.default, torch.ops.aten.cummin.default} <= set(onnx_translations())
