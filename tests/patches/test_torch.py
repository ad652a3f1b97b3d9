"""patch_sdpa_fully_masked_rows: zeros for padded rows, exactly like eager; restored afterwards."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from hfx import PatchError
from hfx.patches import patch_sdpa_fully_masked_rows, with_patches


def _qkv_mask():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, False]]).view(1, 1, 3, 3)
    return q, k, v, mask


def test_active_inside_and_matches_eager():
    q, k, v, mask = _qkv_mask()
    eager = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    original = F.scaled_dot_product_attention
    with patch_sdpa_fully_masked_rows():
        assert F.scaled_dot_product_attention is not original
        patched = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(patched[:, :, 0], torch.zeros_like(patched[:, :, 0]))
    torch.testing.assert_close(patched, eager)


def test_restored_after_the_block():
    original = vars(F)["scaled_dot_product_attention"]
    with patch_sdpa_fully_masked_rows():
        pass
    assert vars(F)["scaled_dot_product_attention"] is original


def test_restored_after_an_exception():
    original = vars(F)["scaled_dot_product_attention"]
    with pytest.raises(RuntimeError), patch_sdpa_fully_masked_rows():
        raise RuntimeError
    assert vars(F)["scaled_dot_product_attention"] is original


def test_unwound_when_a_later_patch_fails():
    @contextlib.contextmanager
    def broken():
        raise ValueError
        yield

    original = vars(F)["scaled_dot_product_attention"]
    with pytest.raises(PatchError), with_patches(patch_sdpa_fully_masked_rows, broken):
        pass
    assert vars(F)["scaled_dot_product_attention"] is original


def test_float_masks_pass_through_unchanged():
    q, k, v, mask = _qkv_mask()
    additive = torch.zeros(mask.shape).masked_fill(~mask, -1e9)
    with patch_sdpa_fully_masked_rows():
        patched = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(patched, F.scaled_dot_product_attention(q, k, v, attn_mask=additive))
