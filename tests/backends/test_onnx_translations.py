"""hfx's ONNX translations of ATen ops torchlib lacks: ``erfinv`` (Gemma 3n's activation sparsity threshold)."""

from __future__ import annotations

import math

import pytest
import torch

import hfx
from hfx.backends._onnx_translations import onnx_translations

pytest.importorskip("onnxruntime")

# Giles' single-precision erfinv is within 3.7e-7 relative of the exact value (his paper's bound, measured 2.8e-7
# here over the sweep below), torch's own float32 erfinv within a few ulps: 1e-6 relative covers both. Near 0 the
# value is 0.886 x, so the absolute floor is one float32 ulp of 1.
ERFINV_RTOL, ERFINV_ATOL = 1e-6, 1.2e-7


class Threshold(torch.nn.Module):
    """``erfinv`` of the inputs, as Gemma 3n's ``Normal(0, 1).icdf`` computes its sparsity threshold."""

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return math.sqrt(2) * torch.erfinv(2 * input_values - 1)


def _program() -> hfx.OnnxProgram:
    inputs = {"input_values": torch.rand(2, 16, generator=torch.Generator().manual_seed(0))}
    return hfx.lower_to_onnx(hfx.export(hfx.capture(inputs, Threshold())))


def test_erfinv_matches_torch_over_the_open_interval_and_its_ends():
    program = _program()
    inside = torch.linspace(1e-6, 1 - 1e-6, 20_001)[None].expand(3, -1).contiguous()  # another batch and length
    got = program(input_values=inside)
    torch.testing.assert_close(got, Threshold()(inside), rtol=ERFINV_RTOL, atol=ERFINV_ATOL)
    ends = program(input_values=torch.tensor([[0.0, 1.0, -0.5, 1.5]]))
    assert ends[0, 0] == -math.inf and ends[0, 1] == math.inf and ends[0, 2:].isnan().all()  # as torch.erfinv


def test_the_translation_is_given_while_torchlib_lacks_erfinv():
    """Canary: when this fails, torchlib translates erfinv and hfx's translation steps aside."""
    assert torch.ops.aten.erfinv.default in onnx_translations()
