"""ONNX translations of the ATen ops torchlib (onnxscript 0.7) has none for: ``onnx_translations()``.

``lower_to_onnx`` passes them to ``torch.onnx.export`` as its ``custom_translation_table``.
Each is added only while torchlib's registry lacks the op, so a torchlib that gains
it steps in by itself.

``erfinv``: ONNX has no inverse error function and torchlib no translation ("No
ONNX function found for prims.erf_inv"). Gemma 3n's MLP computes the threshold
of its activation sparsity with ``torch.distributions.Normal(0, 1).icdf(...)``
(``Gemma3nTextMLP._gaussian_topk``, transformers 5.22-5.24), which is
``erfinv``, traced into the graph. The translation is Giles' single-precision
approximation (M. Giles, "Approximating the erfinv function", GPU Computing Gems,
2010): two polynomials in ``w = -log(1 - x^2)``, with ``erfinv(+-1) = +-inf`` and
NaN outside ``[-1, 1]`` as torch gives; within a few float32 ulps of torch's
(tests/backends/test_onnx_translations.py). Delete when torchlib translates it.
"""

from __future__ import annotations

from typing import Any

import torch

# The coefficients of Giles' single-precision erfinv, highest degree first: for w < 5 in (w - 2.5), else in
# (sqrt(w) - 3).
_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
            -0.00417768164, 0.246640727, 1.50140941)
_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
         0.00943887047, 1.00167406, 2.83297682)


def _polynomial(op: Any, w: Any, coefficients: tuple[float, ...]) -> Any:
    """``coefficients`` evaluated at ``w`` by Horner's rule, in ``w``'s type."""
    result = op.CastLike(coefficients[0], w)
    for coefficient in coefficients[1:]:
        result = op.Add(op.Mul(result, w), op.CastLike(coefficient, w))
    return result


def erfinv(x: Any) -> Any:
    """ONNX ops computing ``torch.erfinv(x)`` for a floating ``x`` (traced by torch.onnx's exporter)."""
    from onnxscript import opset18 as op

    one = op.CastLike(1.0, x)
    w = op.Neg(op.Log(op.Mul(op.Sub(one, x), op.Add(one, x))))
    central = _polynomial(op, op.Sub(w, op.CastLike(2.5, x)), _CENTRAL)
    tail = _polynomial(op, op.Sub(op.Sqrt(w), op.CastLike(3.0, x)), _TAIL)
    inside = op.Mul(op.Where(op.Less(w, op.CastLike(5.0, x)), central, tail), x)
    return op.Where(op.Equal(op.Abs(x), one), op.Mul(x, op.CastLike(float("inf"), x)), inside)


# ATen op -> (torchlib's name for it, hfx's translation)
_TRANSLATIONS = {torch.ops.aten.erfinv.default: ("aten::erfinv", erfinv)}


def onnx_translations() -> dict[Any, Any]:
    """``{ATen op: translation}`` for the ops of this module that torchlib's registry lacks."""
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401 - fills the registry
    from onnxscript.function_libs.torch_lib.registration import default_registry

    return {op: translation for op, (name, translation) in _TRANSLATIONS.items() if name not in default_registry}
