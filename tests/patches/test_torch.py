"""patch_sdpa_fully_masked_rows: zeros for padded rows, exactly like eager (its contract: test_contract.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hfx.patches import patch_sdpa_fully_masked_rows


def _qkv_mask():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, False]]).view(1, 1, 3, 3)
    return q, k, v, mask


def test_padded_rows_are_zeros_and_the_others_eager():
    q, k, v, mask = _qkv_mask()
    eager = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with patch_sdpa_fully_masked_rows():
        patched = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(patched[:, :, 0], torch.zeros_like(patched[:, :, 0]))
    torch.testing.assert_close(patched, eager)


def test_float_masks_pass_through_unchanged():
    q, k, v, mask = _qkv_mask()
    additive = torch.zeros(mask.shape).masked_fill(~mask, -1e9)
    with patch_sdpa_fully_masked_rows():
        patched = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(patched, F.scaled_dot_product_attention(q, k, v, attn_mask=additive))
