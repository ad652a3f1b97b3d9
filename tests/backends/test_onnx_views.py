"""lower_to_onnx on SDPA whose mask is built from a parameter (T5's relative position bias).

torch.export drops the no-op ``.transpose(1, 2).contiguous()`` after CPU SDPA's
flash kernel; torch.onnx's fake re-run with grad enabled takes the math kernel
instead, and the ``view`` after it failed ("Cannot view a tensor with shape ...").
``_onnx._grad_mode_of_export`` lowers under ``no_grad``, as ``export`` traced.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

pytest.importorskip("onnxruntime")

import hfx  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import _onnx  # noqa: E402
from hfx.backends._onnx import OnnxProgram, lower_to_onnx  # noqa: E402
from hfx.patches import swap_attr  # noqa: E402
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, new_inputs  # noqa: E402


class _BiasedAttention(torch.nn.Module):
    """T5 attention in small: a float mask plus a learned bias into SDPA, then ``transpose(1, 2).contiguous()``."""

    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.position_bias = torch.nn.Parameter(torch.randn(heads, 1, 1))

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        shape = (*inputs_embeds.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(inputs_embeds).view(shape).transpose(1, 2) for proj in (self.q, self.k, self.v))
        padding = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding + self.position_bias)
        return self.o(out.transpose(1, 2).contiguous().reshape(*inputs_embeds.shape[:-1], -1))


def _biased_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, : sequence // 3] = 0
    return {"inputs_embeds": torch.randn(batch, sequence, 32), "attention_mask": mask}


@pytest.fixture(scope="module")
def biased():
    """The small model and its export, captured at the usual shape."""
    torch.manual_seed(0)
    model = _BiasedAttention().eval()
    return model, hfx.export(hfx.capture(_biased_inputs(**CAPTURE_SHAPE), model))


# --- output -----------------------------------------------------------------------------------


def test_t5_encoder_lowers_and_matches_eager_on_new_shapes(generative):
    model, parts = generative("t5")
    program = lower_to_onnx(parts["encoder"])
    report = verify(model.get_encoder(), new_inputs("t5"), program)
    assert report.passed, str(report)
    assert report.max_abs <= 1e-4, str(report)


def test_biased_sdpa_lowers_and_matches_eager_on_new_shapes(biased):
    model, exported = biased
    torch.manual_seed(1)
    report = verify(model, _biased_inputs(**NEW_SHAPE), lower_to_onnx(exported))
    assert report.max_abs <= 1e-5, str(report)


# --- the input and the process left unchanged --------------------------------------------------


def test_exported_and_grad_mode_are_unchanged_by_lowering(biased):
    _, exported = biased
    graph = str(exported.program.graph)
    assert torch.is_grad_enabled()
    assert isinstance(lower_to_onnx(exported), OnnxProgram)
    assert torch.is_grad_enabled()
    assert str(exported.program.graph) == graph


# --- the failure the fix removes ----------------------------------------------------------------


def test_without_no_grad_torch_onnx_still_cannot_view(biased):
    """Canary: when this fails, torch.onnx keeps the traced strides and ``_grad_mode_of_export`` can go."""
    _, exported = biased
    with swap_attr(_onnx, "_grad_mode_of_export", contextlib.nullcontext):
        with pytest.raises(hfx.LoweringError, match="Cannot view a tensor with shape"):
            lower_to_onnx(exported)
