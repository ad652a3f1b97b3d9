"""Patches of ExecuTorch's ahead-of-time passes that ``lower_to_pte`` enters while it builds a program.

Nothing here imports executorch at import time; each patch imports what it swaps when it is entered.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import sympy
import torch
from torch.utils._sympy import functions as symfn

from hfx.patches._core import swap_attr

# The most points of the box of dim values an upper bound is evaluated at; a larger box keeps ExecuTorch's bound.
MAX_BOUND_POINTS = 1 << 20


class _Unsupported(Exception):
    """An expression this evaluator does not know; ExecuTorch's own bound is kept for it."""


def _floor_div(a: Any, b: Any, invalid: list[Any]) -> Any:
    invalid.append(np.equal(b, 0))
    return np.floor_divide(a, np.where(np.equal(b, 0), 1, b))


def _mod(a: Any, b: Any, invalid: list[Any]) -> Any:
    invalid.append(np.equal(b, 0))
    return np.mod(a, np.where(np.equal(b, 0), 1, b))


def _reduce(function: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    return lambda *args: functools.reduce(function, args)


# sympy / torch sympy function -> numpy version over integer arrays; a divisor of 0 marks the point invalid.
_NARY: Mapping[type, Callable[..., Any]] = {
    sympy.Add: _reduce(operator.add),
    sympy.Mul: _reduce(operator.mul),
    sympy.Max: _reduce(np.maximum),
    sympy.Min: _reduce(np.minimum),
    symfn.Max: _reduce(np.maximum),
    symfn.Min: _reduce(np.minimum),
}
_DIVIDING: Mapping[type, Callable[..., Any]] = {
    symfn.FloorDiv: _floor_div,
    symfn.CleanDiv: _floor_div,
    symfn.Mod: _mod,
    symfn.PythonMod: _mod,
    sympy.Mod: _mod,
}


def _evaluated(expr: sympy.Expr, values: Mapping[sympy.Symbol, Any], invalid: list[Any]) -> Any:
    """``expr`` at every point of ``values`` (broadcasting integer arrays); raises ``_Unsupported``."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return values[expr]
    args = [_evaluated(arg, values, invalid) for arg in expr.args]
    if type(expr) in _NARY:
        return _NARY[type(expr)](*args)
    if type(expr) in _DIVIDING:
        return _DIVIDING[type(expr)](*args, invalid)
    if isinstance(expr, symfn.ModularIndexing):
        return _mod(_floor_div(args[0], args[1], invalid), args[2], invalid)
    if isinstance(expr, (sympy.Pow, symfn.PowByNatural)) and expr.args[1].is_Integer and int(expr.args[1]) >= 0:
        return args[0] ** int(expr.args[1])
    raise _Unsupported(type(expr).__name__)


def exact_upper_bound(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> int | None:
    """The largest value ``expr`` takes at integer points of ``ranges`` where no divisor is 0, or ``None``.

    ``None`` when a symbol has no finite range, the box has more than
    ``MAX_BOUND_POINTS`` points, or ``expr`` uses a function this evaluator does
    not know. Interval arithmetic (``bound_sympy``) bounds each operand on its
    own, so ``P // (P // 2)`` (which is 2 for every even ``P``) gets the bound of
    ``P``; evaluating at every point gives the exact maximum.

    Example:
        >>> p = sympy.Symbol("p", integer=True, positive=True)
        >>> from torch.utils._sympy.value_ranges import ValueRanges
        >>> exact_upper_bound(symfn.FloorDiv(2 * p, symfn.FloorDiv(2 * p, 2)), {p: ValueRanges(1, 64)})
        2
    """
    symbols = sorted(expr.free_symbols, key=str)
    spans = []
    for symbol in symbols:
        bounds = ranges.get(symbol)
        lower, upper = (getattr(bounds, "lower", None), getattr(bounds, "upper", None))
        if not (isinstance(lower, sympy.Integer) and isinstance(upper, sympy.Integer)):
            return None
        spans.append((int(lower), int(upper)))
    if math.prod(hi - lo + 1 for lo, hi in spans) > MAX_BOUND_POINTS:
        return None
    grid = np.meshgrid(*(np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in spans), indexing="ij", sparse=True)
    invalid: list[Any] = []
    try:
        values = np.broadcast_to(_evaluated(expr, dict(zip(symbols, grid)), invalid), np.broadcast_shapes(
            *(g.shape for g in grid)))
    except _Unsupported:
        return None
    valid = ~functools.reduce(np.logical_or, invalid, np.zeros(values.shape, dtype=bool))
    return int(values[valid].max()) if valid.any() else None


def _tightened(original: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap ExecuTorch's ``eval_upper_bound`` so that it returns the exact bound where one can be computed."""
    cache: dict[tuple[sympy.Expr, int], int | None] = {}

    @functools.wraps(original)
    def eval_upper_bound(maybe_symint: Any) -> int:
        if not isinstance(maybe_symint, torch.SymInt):
            return original(maybe_symint)
        node = maybe_symint.node
        key = (node.expr, id(node.shape_env))
        if key not in cache:
            cache[key] = exact_upper_bound(node.expr, node.shape_env.var_to_range)
        exact = cache[key]
        return original(maybe_symint) if exact is None else exact

    eval_upper_bound.__wrapped__ = original
    return eval_upper_bound


@contextlib.contextmanager
def patch_exact_upper_bounds() -> Iterator[None]:
    """Plan ExecuTorch's memory at the exact upper bound of each symbolic size, not an interval-arithmetic one.

    executorch 1.5.1 plans every tensor at ``eval_upper_bound`` of each dim
    (exir/sym_util.py, called by ``ConstraintBasedSymShapeEvalPass`` and the
    memory-planning allocs), which is ``bound_sympy``: interval arithmetic that
    bounds each operand on its own. Swin's window partition views a padded grid
    ``P`` as ``P // (P // 2)`` windows of 2 (always 2), whose bound is that of
    ``P``, and the planned arena of the tiny zoo Swin at batch 4 and 512 x 512
    pixels was 108 TB (``std::bad_alloc`` at load). Where the interval is
    unbounded, ``eval_upper_bound`` falls back to the size at the trace, which is
    no bound: Swin's ``(batch * (2 * 2 // 2)) // 2`` windows was planned for
    batch 2 and failed at batch 3 ("Attempted to resize a bounded tensor", 0x1,
    in ``et_view``). This evaluates each size at
    every integer point of its symbols' ranges (up to ``MAX_BOUND_POINTS``) and
    plans at the largest value, which is still an upper bound for every input
    the bounds allow. Delete when ExecuTorch bounds correlated sizes tightly.
    """
    from executorch.exir import sym_util
    from executorch.exir.passes import sym_shape_eval_pass

    tight = _tightened(vars(sym_util)["eval_upper_bound"])
    with swap_attr(sym_util, "eval_upper_bound", tight), swap_attr(sym_shape_eval_pass, "eval_upper_bound", tight):
        yield
