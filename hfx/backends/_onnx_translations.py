"""ONNX translations of the ATen ops torchlib (onnxscript 0.7) has none for: ``onnx_translations()``.

``lower_to_onnx`` passes them to ``torch.onnx.export`` as its ``custom_translation_table``.
Each is added only while torchlib's registry lacks the op, so a torchlib that gains
it steps in by itself.

``erfinv``: ONNX has no inverse error function and torchlib no translation ("No
ONNX function found for prims.erf_inv"). Gemma 3n's MLP computes the threshold
of its activation sparsity with ``torch.distributions.Normal(0, 1).icdf(...)``
(``Gemma3nTextMLP._gaussian_topk``, transformers 5.22-5.24), which is
``erfinv``, traced into the graph. The translation is
``hfx.backends._decompositions.giles_erfinv`` (Giles' single-precision
approximation, ExecuTorch's decomposition of the op) over ONNX ops; within a few
float32 ulps of torch's (tests/backends/test_onnx_translations.py). Delete when
torchlib translates it.

``searchsorted``: torchlib has no translation either ("No ONNX function found for
aten.searchsorted.Tensor"). Grounding DINO and MM Grounding DINO bucket positions with it
(transformers 5.22-5.24). The translation counts, for each value, the sorted entries below
it (``right``: not above it) with one broadcast comparison and a sum: the same indices, at
``values x sorted`` comparisons. A ``sorter`` is refused. Delete when torchlib translates it.

``cummax`` and ``cummin``: no translation either; Grounding DINO takes the running maximum and
(over the flipped text) minimum of its special tokens' positions. Each position's maximum is the maximum over a ``length x length``
prefix mask (the first element fills the rest, so no dtype's lowest value is needed), its index
the last position of the prefix that holds it, as torch returns ties. Along the last dim only.
The minimum is the same with ``ReduceMin``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from hfx.backends._decompositions import giles_erfinv


def erfinv(x: Any) -> Any:
    """ONNX ops computing ``torch.erfinv(x)`` for a floating ``x`` (traced by torch.onnx's exporter)."""
    return giles_erfinv(x, _onnx_ops())


def _onnx_ops() -> Any:
    """ONNX's ops (opset 18) under the names ``giles_erfinv`` calls."""
    from onnxscript import opset18 as op

    return types.SimpleNamespace(add=op.Add, mul=op.Mul, sub=op.Sub, neg=op.Neg, log=op.Log, sqrt=op.Sqrt, abs=op.Abs,
                                 less=op.Less, equal=op.Equal, where=op.Where, const=op.CastLike)


def searchsorted(sorted_sequence: Any, values: Any, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: Any = None) -> Any:
    """ONNX ops computing ``torch.searchsorted(sorted_sequence, values, ...)`` (traced by torch.onnx's exporter)."""
    from onnx import TensorProto
    from onnxscript import opset18 as op

    if sorter is not None:
        msg = "hfx's ONNX translation of searchsorted takes no sorter: sort the sequence before the call"
        raise NotImplementedError(msg)
    entries = op.Unsqueeze(sorted_sequence, op.Constant(value_ints=[-2]))  # [..., 1, N]
    asked = op.Unsqueeze(values, op.Constant(value_ints=[-1]))  # [..., M, 1]
    before = op.LessOrEqual(entries, asked) if right or side == "right" else op.Less(entries, asked)
    count = op.ReduceSum(op.Cast(before, to=TensorProto.INT64), op.Constant(value_ints=[-1]), keepdims=0)
    return op.Cast(count, to=TensorProto.INT32) if out_int32 else count


def _running_extreme(x: Any, dim: int, name: str, reduce: Callable[..., Any]) -> tuple[Any, Any]:
    """ONNX ops computing ``torch.<name>(x, dim)`` (cummax, cummin) along the last dim: ``(values, indices)``."""
    from onnxscript import opset18 as op

    rank = len(x.shape) if x.shape is not None else None
    if rank is None or dim not in (-1, rank - 1):
        msg = f"hfx's ONNX translation of {name} takes the last dim of a tensor of known rank, got dim {dim} of rank {rank}"
        raise NotImplementedError(msg)
    length = op.Shape(x, start=-1)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(length), op.Constant(value_int=1))  # [L]
    prefix = op.LessOrEqual(op.Unsqueeze(positions, op.Constant(value_ints=[0])),
                            op.Unsqueeze(positions, op.Constant(value_ints=[1])))  # [i, j]: j <= i
    first = op.Gather(x, op.Constant(value_int=0), axis=-1)  # in every prefix, so a neutral filler
    rows = op.Unsqueeze(x, op.Constant(value_ints=[-2]))  # [..., 1, j]
    filled = op.Where(prefix, rows, op.Unsqueeze(first, op.Constant(value_ints=[-1, -2])))
    values = reduce(filled, op.Constant(value_ints=[-1]), keepdims=0)
    holds = op.And(prefix, op.Equal(rows, op.Unsqueeze(values, op.Constant(value_ints=[-1]))))
    indices = op.ReduceMax(op.Where(holds, positions, op.Constant(value_int=-1)), op.Constant(value_ints=[-1]),
                           keepdims=0)
    return values, indices


def cummax(x: Any, dim: int) -> tuple[Any, Any]:
    """ONNX ops computing ``torch.cummax(x, dim)`` along the last dim: ``(values, indices)``."""
    from onnxscript import opset18 as op

    return _running_extreme(x, dim, "cummax", op.ReduceMax)


def cummin(x: Any, dim: int) -> tuple[Any, Any]:
    """ONNX ops computing ``torch.cummin(x, dim)`` along the last dim: ``(values, indices)``."""
    from onnxscript import opset18 as op

    return _running_extreme(x, dim, "cummin", op.ReduceMin)


# ATen op -> (torchlib's name for it, hfx's translation)
_TRANSLATIONS = {torch.ops.aten.erfinv.default: ("aten::erfinv", erfinv),
                 torch.ops.aten.searchsorted.Tensor: ("aten::searchsorted.Tensor", searchsorted),
                 torch.ops.aten.cummax.default: ("aten::cummax", cummax),
                 torch.ops.aten.cummin.default: ("aten::cummin", cummin)}


def onnx_translations() -> dict[Any, Any]:
    """``{ATen op: translation}`` for the ops of this module that torchlib's registry lacks."""
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401 - fills the registry
    from onnxscript.function_libs.torch_lib.registration import default_registry

    return {op: translation for op, (name, translation) in _TRANSLATIONS.items() if name not in default_registry}
