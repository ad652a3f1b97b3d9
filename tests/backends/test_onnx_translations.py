"""hfx's ONNX translations of ATen ops torchlib lacks: ``erfinv`` (Gemma 3n's activation sparsity threshold) and
``searchsorted`` (Grounding DINO)."""

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
