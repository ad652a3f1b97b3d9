"""patch_sdpa_fully_masked_rows: zeros for padded rows, exactly like eager; patch_even_chunks: a dynamic multiple of the
chunk count stays dynamic; patch_module_to_in_forward: an unchanged cast in forward exports (their contract:
test_contract.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hfx
from hfx import patches
from hfx.patches import default_patches, patch_even_chunks, patch_sdpa_fully_masked_rows


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


class _Streams(torch.nn.Module):
    """ProphetNet's n-gram streams in small: four streams side by side on the sequence axis, chunked apart."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        streams = torch.cat([x, 2 * x, 3 * x, 4 * x], dim=1).chunk(4, dim=1)
        return streams[0] + streams[3] * streams[1]


def _streams_capture() -> hfx.Capture:
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "sequence"}}, bounds={"batch": (1, None), "sequence": (1, 64)})
    return hfx.capture({"x": torch.randn(2, 7, 3)}, _Streams(), dynamic_shapes=shapes)


def test_chunks_of_a_dynamic_multiple_keep_the_dim_dynamic_and_match_eager():
    exported = hfx.export(_streams_capture())
    assert "sequence" in exported.dynamic_shapes.names
    x = torch.randn(3, 11, 3)
    assert torch.equal(exported(x=x), _Streams()(x))


def test_without_the_chunk_patch_torch_still_refuses_a_named_sequence():
    """Canary: when this fails, torch proves chunk's piece count and the patch can go. Without the patch hfx
    keeps the dim through the guards' range (``hfx._export.guard_ranges``): ``(4*s - 1) // s == 3`` holds for
    every size."""
    sequence = torch.export.Dim("sequence", min=1, max=64)
    with pytest.raises(torch._dynamo.exc.UserError, match="Not all values of sequence"):
        torch.export.export(_Streams(), (torch.randn(2, 7, 3),), dynamic_shapes=({1: sequence},), strict=False)
    without = tuple(p for p in default_patches(_Streams()) if p is not patch_even_chunks)
    exported = hfx.export(_streams_capture(), patches=without)
    assert exported.io.bounds["sequence"] == (1, 64)
    x = torch.randn(3, 11, 3)
    assert torch.equal(exported(x=x), _Streams()(x))


def test_the_chunk_patch_leaves_other_calls_to_chunk():
    x = torch.arange(10.0).view(2, 5)
    with patch_even_chunks():
        assert [t.tolist() for t in x.chunk(2, dim=1)] == [[[0.0, 1.0, 2.0], [5.0, 6.0, 7.0]], [[3.0, 4.0], [8.0, 9.0]]]
        assert [t.shape for t in torch.chunk(x, 2)] == [torch.Size([1, 5])] * 2
    assert torch.Tensor.chunk is not None and not hasattr(torch.Tensor.chunk, "__wrapped__")


# patch_module_to_in_forward


class _CastsItsRouter(torch.nn.Module):
    """Switch Transformers' router pattern: a submodule cast to the dtype it has, inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(torch.float32)
        return self.classifier(x)


def test_a_cast_to_the_same_dtype_in_forward_fails_to_export_without_the_patch():
    # Canary: when torch.export lets Module.to swap unchanged parameters, this fails and the patch can go.
    with pytest.raises(Exception, match="Couldn't swap"):
        torch.export.export(_CastsItsRouter(), (torch.ones(2, 4),), strict=False)


def test_a_cast_to_the_same_dtype_in_forward_exports_with_the_patch_and_other_casts_still_cast():
    module = _CastsItsRouter()
    with patches.patch_module_to_in_forward():
        program = torch.export.export(module, (torch.ones(2, 4),), strict=False)
        assert module.to(torch.float32) is module
        half = torch.nn.Linear(2, 2).to(torch.float16)  # a real change is Module.to's own
        assert half.weight.dtype == torch.float16
    x = torch.randn(2, 4)
    torch.testing.assert_close(program.module()(x), module(x), rtol=0, atol=0)
