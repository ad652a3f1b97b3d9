"""``patch_sdpa_decomposition_layout``: ExecuTorch decomposes SDPA into the layout torch.export traced.

GPT-2's ``Conv1D`` views the attention output (``x.view(-1, x.size(-1))``).
At export that tensor is contiguous and ``transpose(1, 2).contiguous()`` leaves
no node; torch's decomposition of CPU flash attention lays its output out as
(L, N, H, E) instead, and the view failed inside ``to_edge``. The tiny module
below has that pattern; one lowering of it (10-20 s) checks parity, the rest
runs torch's decomposition only.
"""

from __future__ import annotations

import pytest
import torch
from transformers.pytorch_utils import Conv1D

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import _executorch  # noqa: E402
from hfx.backends._sdpa_layout import (  # noqa: E402
    flash_attention_for_cpu_like_query,
    laid_out_like,
    patch_sdpa_decomposition_layout,
)
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE  # noqa: E402

_FLASH_FOR_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_HIDDEN, _HEADS = 32, 4


class _Conv1DAttention(torch.nn.Module):
    """GPT-2 attention in small: fused ``c_attn`` split into heads, SDPA with a padding mask, ``Conv1D`` out."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = Conv1D(3 * _HIDDEN, _HIDDEN)
        self.c_proj = Conv1D(_HIDDEN, _HIDDEN)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        shape = (*inputs_embeds.shape[:-1], -1, _HIDDEN // _HEADS)
        q, k, v = (t.view(shape).transpose(1, 2) for t in self.c_attn(inputs_embeds).split(_HIDDEN, dim=2))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask[:, None, None, :] > 0)
        return self.c_proj(out.transpose(1, 2).contiguous().reshape(*inputs_embeds.shape[:-1], -1))


def _inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, : sequence // 3] = 0
    return {"inputs_embeds": torch.randn(batch, sequence, _HIDDEN), "attention_mask": mask}


@pytest.fixture(scope="module")
def attention():
    """The small model and its export at the usual capture shape."""
    torch.manual_seed(0)
    model = _Conv1DAttention().eval()
    return model, hfx.export(hfx.capture(_inputs(**CAPTURE_SHAPE), model))


def _edge_decomposed(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` decomposed with ExecuTorch's edge table, as ``to_edge`` does first."""
    from executorch.exir.tracer import _default_decomposition_table

    return program.run_decompositions(_default_decomposition_table())


def _queries() -> dict[str, torch.Tensor]:
    """Queries laid out as Hugging Face attention, ``nn.MultiheadAttention`` and a contiguous tensor lay them out."""
    fused = torch.randn(2, 7, 3 * _HIDDEN)
    return {
        "hugging_face": fused[..., :_HIDDEN].reshape(2, 7, _HEADS, -1).transpose(1, 2),
        "multihead_attention": torch.randn(7, 2 * _HEADS, 8).transpose(0, 1).reshape(2, _HEADS, 7, 8),
        "contiguous": torch.randn(2, _HEADS, 7, 8),
    }


# --- output -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hugging_face", "multihead_attention", "contiguous"])
def test_the_decomposition_lays_out_its_output_as_the_kernel_does(layout):
    query = _queries()[layout]
    want = _FLASH_FOR_CPU(query, query, query)[0]
    got = flash_attention_for_cpu_like_query(query, query, query)[0]
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_laid_out_like_keeps_the_values():
    tensor, like = torch.randn(2, 4, 7, 8), torch.empty(2, 7, 4, 8).transpose(1, 2)
    out = laid_out_like(tensor, like)
    assert out.stride() == like.stride()
    assert torch.equal(out, tensor)


def test_edge_decomposition_keeps_the_traced_layout(attention):
    _, exported = attention
    with patch_sdpa_decomposition_layout():
        decomposed = _edge_decomposed(exported.program)
    targets = {node.target for node in decomposed.graph.nodes}
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in targets


def test_a_conv1d_attention_lowers_and_matches_eager_on_new_shapes(attention):
    model, exported = attention
    torch.manual_seed(1)
    report = verify(model, _inputs(**NEW_SHAPE), _executorch.lower_to_pte(exported))
    assert report.max_abs <= 1e-5, str(report)


# --- the input left unchanged ------------------------------------------------------------------


def test_decomposing_leaves_the_program_and_the_table_unchanged(attention):
    from torch._decomp import decomposition_table

    _, exported = attention
    graph, original = str(exported.program.graph), decomposition_table[_FLASH_FOR_CPU]
    with patch_sdpa_decomposition_layout():
        _edge_decomposed(exported.program)
    assert str(exported.program.graph) == graph
    assert decomposition_table[_FLASH_FOR_CPU] is original


def test_lower_to_pte_enters_the_patch():
    assert patch_sdpa_decomposition_layout in _executorch.LOWERING_PATCHES


# --- the failure the fix removes ----------------------------------------------------------------


def test_without_the_patch_the_edge_decomposition_still_cannot_view(attention):
    """Canary: when this fails, torch's decomposition keeps the kernel's layout and the patch can go."""
    _, exported = attention
    with pytest.raises(ValueError, match="Cannot view a tensor with shape"):
        _edge_decomposed(exported.program)
