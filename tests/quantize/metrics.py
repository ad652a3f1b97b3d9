"""How close a quantized program's logits are to eager fp32, and the bound each scheme's quantization step allows.

The bounds are derived, not measured. Rounding a value to a grid of step ``s`` leaves a uniform error of rms
``s / sqrt(12)``. A scheme that spreads ``levels`` steps over the range of ``n`` roughly Gaussian values (scale 1)
has ``s = 2 * max|x| / levels`` with ``max|x| ~ sqrt(2 ln n)`` (an overestimate of the expected maximum, on the safe
side); a linear whose weights and input both carry such errors has relative output error
``eps = sqrt(eps_w**2 + eps_x**2)``, and a cosine of ``1 - eps**2 / 2``. The tiny zoo Llama (hidden 64, 2 layers)
adds such an error to its residual stream ``STAGES`` times between the embedding and the logits. Each bound allows
``margin`` times the estimated loss for what the model leaves out (heavier tails than Gaussian, norms between the
linears; calibrated schemes also clip values past the range 3 samples showed, and take 2x more). Integer kernels accumulate exactly in
int32 on every ISA once 8-bit products cannot saturate (``hfx._cpu``: VNNI, or 7-bit weights without it), so a
bound holds on AVX2, AVX-512 and AMX alike; float32 differences between ISAs are ~1e-6, far below any of them.
"""

from __future__ import annotations

import math

import torch

#: Where quantization error enters the zoo Llama's residual stream: its 2 layers' attention and MLP branches
#: (each branch's two linears in series add to the stream once) and the LM head.
STAGES = 5
#: How many times the estimated loss of cosine a bound allows (``2 * MARGIN`` for calibrated static schemes).
MARGIN = 2.0
#: Values per tensor in the checked call (zoo Llama, batch 3 x sequence 11 x hidden 64): per-tensor activation ranges.
ACTIVATIONS = 3 * 11 * 64
#: Inputs per output channel of the zoo Llama's linears (hidden 64): per-channel weight ranges.
CHANNEL = 64


def rounding_rms(levels: int, values: int) -> float:
    """Relative rms rounding error of ``values`` Gaussian numbers on a grid of ``levels`` steps over their range."""
    spread = 2 * math.sqrt(2 * math.log(values))
    return spread / levels / math.sqrt(12)


def cosine_bound(*per_linear: float, stages: int = STAGES, margin: float = MARGIN) -> float:
    """The cosine a bound accepts: ``1 - margin * stages * eps**2 / 2``, ``eps`` combining ``per_linear`` errors.

    >>> round(cosine_bound(rounding_rms(254, CHANNEL), rounding_rms(255, ACTIVATIONS)), 4)  # int8 weights + activations
    0.9994
    """
    eps2 = sum(e * e for e in per_linear)
    return 1 - margin * stages * eps2 / 2


def cosine(expected: torch.Tensor, got: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened."""
    return torch.nn.functional.cosine_similarity(expected.flatten().double(), got.flatten().double(), dim=0).item()


def top1_agreement(expected: torch.Tensor, got: torch.Tensor) -> float:
    """Share of positions whose argmax over the last axis agrees."""
    return (expected.argmax(-1) == got.argmax(-1)).double().mean().item()
