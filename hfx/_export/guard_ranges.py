"""The sizes a dim can take in a program whose guards pin it only to a range named dims cannot state.

LongT5 splits its sequence into blocks of 128 and pads when the length is not a
multiple (``if x.shape[dim] % block_len != 0``). Traced at 7 tokens, torch.export
records guards such as ``s % 128 != 0`` and ``ceil(s / 128) == 1``: true for 1 to
127 tokens, yet no ``Dim(min, max)`` says so, so a named dim is refused and would be
made static. ``Dim.AUTO`` accepts them and keeps them as the program's guards
(``ExportedProgram._guards_code``, Python over ``L['input'].size()[axis]``).
``guard_interval`` evaluates those guards over the dim's declared range and keeps the
largest run of sizes around the captured one where all hold: the program is the
model's there, and hfx refuses any other size (its bounds).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

_SCAN_LIMIT = 8192  # how far an unbounded dim is scanned; beyond it the guards are taken to hold as they did
# What torch's guard code calls besides operators (torch 2.14 writes ``torch.sym_max``).
_NAMESPACE = {"__builtins__": {}, "math": math, "torch": torch, "Max": max, "Min": min, "max": max, "min": min,
              "abs": abs}


class _Unreadable(Exception):  # noqa: N818 - control flow
    """A guard names something this evaluator does not provide."""


class _Sized:
    """A stand-in for a tensor in a guard: ``size()`` gives its shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._shape = shape

    def size(self) -> tuple[int, ...]:
        return self._shape


def guard_interval(
    guards: Sequence[str], kwargs: Mapping[str, Any], axes: set[tuple[str, int]], size: int,
    bounds: tuple[int, int | None],
) -> tuple[int, int | None] | None:
    """The largest ``(lo, hi)`` around ``size`` within ``bounds`` where every guard holds.

    The dim sits at ``axes`` (``(input name, axis)`` pairs) of the flat inputs ``kwargs``;
    every other axis keeps its captured size. ``hi`` is ``None`` when ``bounds`` has no
    maximum and the guards hold as far as ``_SCAN_LIMIT``. ``None`` when a guard cannot
    be evaluated or the sizes around ``size`` do not hold (the dim is pinned).

    Example:
        >>> import torch
        >>> guards = ["(L['x'].size()[1] % 128) != 0"]
        >>> guard_interval(guards, {"x": torch.ones(2, 7)}, {("x", 1)}, 7, (1, 512))
        (1, 127)
    """
    holds = _holding_at(guards, kwargs, axes)
    return None if holds is None else _widest(holds, size, bounds)


def pinned_by_guards(
    guards: Sequence[str], kwargs: Mapping[str, Any], axes: set[tuple[str, int]], size: int,
    bounds: tuple[int, int | None],
) -> bool:
    """Whether every guard holds at ``size`` and some guard fails at each size next to it within ``bounds``
    (as ``guard_interval``): the program runs at that size of the dim alone.

    Example:
        >>> import torch
        >>> guards = ["(L['x'].size()[1] % (L['x'].size()[1] // 8)) == 0", "(L['x'].size()[1] // 8) == 4"]
        >>> pinned_by_guards(guards, {"x": torch.ones(2, 32)}, {("x", 1)}, 32, (32, 39))
        True
    """
    holds = _holding_at(guards, kwargs, axes)
    try:
        return holds is not None and holds(size) and _widest(holds, size, bounds) is None
    except _Unreadable:
        return False


def _holding_at(guards: Sequence[str], kwargs: Mapping[str, Any], axes: set[tuple[str, int]]) -> Any:
    """``size -> whether every guard holds`` with the dim at ``axes`` of ``kwargs`` at that size (every other
    axis at its size in ``kwargs``); ``None`` where a guard does not parse."""
    try:
        compiled = [compile(guard, "<guard>", "eval") for guard in guards]
    except SyntaxError:
        return None

    def holds(candidate: int) -> bool:
        tensors = {name: _Sized(tuple(candidate if (name, axis) in axes else int(n) for axis, n in enumerate(t.shape)))
                   for name, t in kwargs.items() if isinstance(t, torch.Tensor)}
        return _all_hold(compiled, {"L": tensors})

    return holds


def _all_hold(codes: Sequence[Any], names: Mapping[str, Any]) -> bool:
    """Whether every compiled condition in ``codes`` is true over ``names``: ``False`` at a size they divide by
    zero at (not one the program serves); ``_Unreadable`` where one names what is not given."""
    try:
        return all(bool(eval(code, _NAMESPACE, names)) for code in codes)  # noqa: S307 - torch's guards and printer
    except ArithmeticError:
        return False
    except (NameError, AttributeError, KeyError, TypeError) as exc:
        raise _Unreadable from exc


def _widest(holds: Any, size: int, bounds: tuple[int, int | None], below: Any = None) -> tuple[int, int | None] | None:
    """The largest ``(lo, hi)`` around ``size`` within ``bounds`` where ``holds`` (``below`` under ``size``, if
    given); ``None`` where it holds at ``size`` alone (or not there), or ``holds`` raises ``_Unreadable``."""
    low, high = bounds
    below = below or holds
    try:
        if not holds(size):
            return None
        lo = size
        while lo - 1 >= low and below(lo - 1):
            lo -= 1
        limit = _scanned(bounds, size)[1]
        hi = size
        while hi + 1 <= limit and holds(hi + 1):
            hi += 1
    except _Unreadable:  # no range: the dim stays as torch fixed it
        return None
    if lo == hi:
        return None
    return lo, None if high is None and hi == limit else hi


def _assumes_not_0_or_1(condition: Any) -> bool:
    """Whether ``condition`` says a size (no remainder in it) is not 0 or not 1: an assumption of the trace."""
    from torch.utils._sympy.functions import Mod, PythonMod

    if not isinstance(condition, sympy.Ne):
        return False
    left, right = condition.args
    size, other = (right, left) if left.is_Integer else (left, right)
    return bool(other.is_Integer) and int(other) in (0, 1) and not size.atoms(Mod, PythonMod, sympy.Mod)


def condition_interval(
    conditions: Sequence[Any], symbol: Any, size: int, bounds: tuple[int, int | None],
    others: Mapping[Any, int] | None = None,
) -> tuple[int, int | None] | None:
    """The largest ``(lo, hi)`` around ``size`` within ``bounds`` where every sympy condition on ``symbol`` holds,
    the ``others`` symbols (other dims) at their traced sizes; ``None`` where the sizes next to ``size`` fail (the
    dim is pinned) or a condition cannot be evaluated.

    ``torch.export`` keeps such conditions as runtime asserts where it can neither prove
    them nor state them as a dim's range: Swin pads its feature map only when the width
    is not a multiple of 4, and traced at 64 px keeps ``Eq(Mod(width, 4), 0)``. Two kinds
    are trace-time assumptions, not the model's conditions, and refuse nothing:
    a relation between dims (``total == past + sequence``, which hfx checks itself), and,
    below ``size``, a size derived from the dim said not to be 0 or 1: torch assumes a
    size traced at 2 or more is not (ResNet's ``Ne((width - 1)//8, 0)``), and the
    graph computes the same at those sizes. A remainder is a condition
    (``Ne(Mod(width//4, 2), 1)``: Swin's odd feature map, padded).

    Example:
        >>> import sympy
        >>> from torch.utils._sympy.functions import FloorDiv, Mod
        >>> s = sympy.Symbol("s0", integer=True, positive=True)
        >>> condition_interval([sympy.Eq(Mod(s, 4), 0), s < 100], s, 8, (1, None))
        >>> condition_interval([sympy.Ne(FloorDiv(s - 1, 8), 0), s < 100], s, 32, (1, 512))
        (1, 99)
        >>> condition_interval([sympy.Ne(Mod(FloorDiv(s, 4), 2), 1)], s, 8, (1, None))
        (8, 11)
    """
    others = dict(others or {})
    own = [condition for condition in conditions
           if symbol in condition.free_symbols and condition.free_symbols <= {symbol, *others}]
    compiled = _compiled([(condition, _assumes_not_0_or_1(condition)) for condition in own])
    if compiled is None:
        return None
    fixed = {str(other): value for other, value in others.items()}

    def holding(*, inequations: bool) -> Any:
        codes = [code for code, unequal in compiled if inequations or not unequal]
        return lambda candidate: _all_hold(codes, {**fixed, str(symbol): candidate})

    return _widest(holding(inequations=True), size, bounds, below=holding(inequations=False))


def _compiled(conditions: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]] | None:
    """Each ``(sympy condition, tag)`` as ``(code object, tag)``; ``None`` where one cannot be printed as Python."""
    from torch.utils._sympy.printers import PythonPrinter

    printer = PythonPrinter()
    try:
        return [(compile(printer.doprint(condition), "<condition>", "eval"), tag) for condition, tag in conditions]
    except (SyntaxError, TypeError, NotImplementedError):
        return None


def _sample_sizes(lo: int, hi: int, size: int) -> list[int]:
    """Sizes of ``[lo, hi]`` a box check visits: both ends, the traced ``size`` and its neighbours, and a
    geometric ladder between (a condition on several dims that fails inside the box fails at one of them when
    it is monotone in each, as a clamp to a window is)."""
    points = {lo, hi, size, size - 1, size + 1, lo + 1, hi - 1}
    step = 1
    while size + step < hi or size - step > lo:
        points.update((size + step, size - step))
        step *= 2
    return sorted(p for p in points if lo <= p <= hi)


def jointly_held(
    conditions: Sequence[Any], intervals: Mapping[Any, tuple[int, int | None] | None], sizes: Mapping[Any, int],
) -> dict[Any, tuple[int, int | None] | None]:
    """``intervals`` (per dim, as ``condition_interval`` found them, the other dims at their traced ``sizes``)
    cut so that each condition on several dims holds over the box they span.

    A dim found alone may be wrong in company: Swin clamps its last stage's window where
    ``Min(rows, columns) <= 2``; each side alone may grow (the other keeps it true), both
    together may not. Where a condition fails somewhere in the box, the box of its dims is
    shrunk towards the traced sizes (above them first, then below, then both) to the largest
    where it holds; where none does, its dims are pinned (``None``).

    Example:
        >>> import sympy
        >>> h, w = sympy.symbols("h w", integer=True, positive=True)
        >>> jointly_held([sympy.Min(h, w) <= 100], {h: (1, None), w: (1, None)}, {h: 64, w: 64})
        {h: (1, 100), w: (1, 100)}
    """
    cut = dict(intervals)
    compiled = _compiled([(condition, condition.free_symbols) for condition in conditions])
    if compiled is None:
        return {**cut, **{symbol: None for condition in conditions for symbol in condition.free_symbols}}
    for code, symbols in compiled:
        dims = sorted(symbols, key=str)
        if any(cut.get(dim) is None for dim in dims):
            continue
        full = {dim: _scanned(cut[dim], sizes[dim]) for dim in dims}
        box = _largest_box(code, full, sizes)
        for dim in dims:
            if box is None or box[dim][0] == box[dim][1]:
                cut[dim] = None
            else:
                unbounded = cut[dim][1] is None and box[dim][1] == full[dim][1]
                cut[dim] = (box[dim][0], None if unbounded else box[dim][1])
    return cut


def _largest_box(code: Any, full: Mapping[Any, tuple[int, int]], sizes: Mapping[Any, int]) -> dict[Any, tuple[int, int]] | None:
    """The largest box inside ``full`` around the traced ``sizes`` where ``code`` holds: ``full`` itself, or its
    sides above the sizes shrunk by a common fraction (found by bisection), or below, or both; ``None`` where none
    holds but the traced point."""

    def box(below: float, above: float) -> dict[Any, tuple[int, int]]:
        return {dim: (sizes[dim] - math.floor(below * (sizes[dim] - lo)), sizes[dim] + math.floor(above * (hi - sizes[dim])))
                for dim, (lo, hi) in full.items()}

    def holds(below: float, above: float) -> bool:
        return _box_holds(code, box(below, above), sizes)

    if holds(1.0, 1.0):
        return dict(full)
    for shrink in (lambda t: (1.0, t), lambda t: (t, 1.0), lambda t: (t, t)):
        if not holds(*shrink(0.0)):
            continue
        good, bad = 0.0, 1.0
        for _ in range(16):
            middle = (good + bad) / 2
            good, bad = (middle, bad) if holds(*shrink(middle)) else (good, middle)
        found = box(*shrink(good))
        if any(lo < hi for lo, hi in found.values()):
            return found
    return None


def _scanned(interval: tuple[int, int | None], size: int) -> tuple[int, int]:
    """``interval`` with an open end closed at ``_SCAN_LIMIT`` (or ``size``, if larger): as far as a scan goes."""
    lo, hi = interval
    return lo, hi if hi is not None else max(_SCAN_LIMIT, size)


def _box_holds(code: Any, box: Mapping[Any, tuple[int, int]], sizes: Mapping[Any, int]) -> bool:
    names = [str(dim) for dim in box]
    ladders = [_sample_sizes(lo, hi, sizes[dim]) for dim, (lo, hi) in box.items()]
    try:
        return all(_all_hold([code], dict(zip(names, point))) for point in itertools.product(*ladders))
    except _Unreadable:
        return False
