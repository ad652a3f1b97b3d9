"""How close a quantized program's logits are to eager fp32."""

from __future__ import annotations

import torch


def cosine(expected: torch.Tensor, got: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened."""
    return torch.nn.functional.cosine_similarity(expected.flatten().double(), got.flatten().double(), dim=0).item()


def top1_agreement(expected: torch.Tensor, got: torch.Tensor) -> float:
    """Share of positions whose argmax over the last axis agrees."""
    return (expected.argmax(-1) == got.argmax(-1)).double().mean().item()
