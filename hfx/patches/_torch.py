"""Patches of torch functions, active only while a model is exported."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr


def _zero_fully_masked_rows(sdpa: Any) -> Any:
    """Wrap ``sdpa`` so a query row whose bool mask hides every key gives zeros."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if attn_mask is None or attn_mask.dtype != torch.bool:
            return sdpa(query, key, value, attn_mask, *args, **kwargs)
        attends = attn_mask.any(dim=-1, keepdim=True)
        out = sdpa(query, key, value, attn_mask | ~attends, *args, **kwargs)
        return out * attends.to(out.dtype)

    scaled_dot_product_attention.__wrapped__ = sdpa
    return scaled_dot_product_attention


@contextlib.contextmanager
def patch_sdpa_fully_masked_rows() -> Iterator[None]:
    """Make padded (fully masked) query rows of a bool-mask SDPA come out as zeros on every runtime.

    Eager torch returns 0 for a query row whose boolean mask hides every key
    (left padding). ONNX returns the mean of the values there, because
    onnxscript fills masked positions with the lowest finite float
    (microsoft/onnxscript#2654, for #2561), and OpenVINO returns NaN
    (openvinotoolkit/openvino#31630). Unmasking those rows and zeroing their
    output reproduces eager exactly. Delete once onnxscript and OpenVINO
    return zeros for fully masked rows.
    """
    import torch.nn.functional as F

    with swap_attr(F, "scaled_dot_product_attention", _zero_fully_masked_rows(F.scaled_dot_product_attention)):
        yield
