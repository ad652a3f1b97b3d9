"""patch_dense_global_attention: Longformer / LED local + global attention with shapes that do not follow the mask."""

from __future__ import annotations

import pytest
import torch
import transformers

import hfx
from hfx.patches import dense_global_attention_forward, patch_dense_global_attention
from tests.tolerances import FP32_ONE_BLOCK


def _attention(kind: str) -> torch.nn.Module:
    """One random self-attention layer of ``kind`` with a window of 2 tokens each side."""
    torch.manual_seed(0)
    if kind == "longformer":
        from transformers.models.longformer import modeling_longformer as module
        config = transformers.LongformerConfig(hidden_size=16, num_attention_heads=2, attention_window=[4])
        return module.LongformerSelfAttention(config, layer_id=0).eval()
    from transformers.models.led import modeling_led as module
    config = transformers.LEDConfig(d_model=16, encoder_attention_heads=2, attention_window=[4])
    return module.LEDEncoderSelfAttention(config, layer_id=0).eval()


def _mask(batch_rows: list[tuple[list[int], list[int]]], length: int) -> torch.Tensor:
    """Longformer's encoder mask: 0 local, -10000 padding, +10000 global; one ``(global, padded)`` pair per row."""
    mask = torch.zeros(len(batch_rows), length)
    for row, (global_tokens, padded) in enumerate(batch_rows):
        mask[row, padded] = -10000.0
        mask[row, global_tokens] = 10000.0
    return mask


@pytest.mark.parametrize("kind", ["longformer", "led"])
@pytest.mark.parametrize("rows", [
    [([], [10, 11]), ([], [])],  # window only, with and without padding
    [([0, 5], []), ([3], [11]), ([], [9, 10, 11])],  # global tokens, a different count per row
], ids=["window-only", "global"])
def test_dense_form_equals_transformers_sparse_attention(kind, rows):
    attention = _attention(kind)
    mask = _mask(rows, 12)
    hidden = torch.randn(len(rows), 12, 16, generator=torch.Generator().manual_seed(1))
    masked, global_ = mask < 0, mask > 0
    with torch.no_grad():
        want = attention(hidden, attention_mask=mask, is_index_masked=masked, is_index_global_attn=global_,
                         is_global_attn=bool(global_.any()))[0]
        got = dense_global_attention_forward(attention, hidden, mask, masked, global_)[0]
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_eager_calls_keep_transformers_forward_and_the_class_is_restored():
    attention = _attention("longformer")
    before = vars(type(attention))["forward"]
    with patch_dense_global_attention(attention):
        assert vars(type(attention))["forward"] is not before
        assert vars(type(attention))["forward"].__wrapped__ is before
    assert vars(type(attention))["forward"] is before


def test_global_attention_mask_exports_and_matches_eager_for_other_global_tokens():
    torch.manual_seed(0)
    config = transformers.LongformerConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=32, attention_window=16, max_position_embeddings=64)
    model = transformers.LongformerModel(config).eval()

    def inputs(batch: int, length: int, global_tokens: list[int]) -> dict[str, torch.Tensor]:
        ids = torch.randint(3, 64, (batch, length), generator=torch.Generator().manual_seed(length))
        global_mask = torch.zeros(batch, length, dtype=torch.long)
        global_mask[0, global_tokens] = 1  # the other rows have none
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "global_attention_mask": global_mask}

    exported = hfx.export(hfx.capture(inputs(2, 7, [0]))(model))
    report = hfx.verify(model, inputs(3, 13, [2, 9, 12]), exported)  # 13 tokens, 8 each side: the window matters
    assert report.passed, report
