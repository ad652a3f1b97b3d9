"""Size arithmetic in an exported FX graph, rewritten so every runtime computes it as torch does.

Shared by the ONNX, OpenVINO and ExecuTorch lowerings (``ONNX_FIXES``, ``OV_GRAPH_FIXES``,
``lower_to_pte``); nothing here imports a runtime.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

# A dividend is shifted by the multiple of its divisor nearest below ``shift``, to be positive: a dividend
# down to -shift is divided right. int64 arithmetic (ONNX Runtime) takes this one.
INT64_SHIFT = 1 << 40


def is_size(value: Any) -> bool:
    """``value`` is an int or a node computing one (a SymInt)."""
    import torch

    value = value.meta.get("val") if hasattr(value, "meta") else value
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def sym_node(graph: Any, function: Callable[[Any, Any], Any], left: Any, right: Any) -> Any:
    """A ``call_function`` node of ``function(left, right)`` whose ``val`` meta is that of its operands'."""
    node = graph.call_function(function, (left, right))
    values = [v.meta.get("val") if hasattr(v, "meta") else v for v in (left, right)]
    if all(v is not None for v in values):
        node.meta["val"] = function(*values)
    return node


def size_range(size: Any) -> Any:
    """The range (a ``ValueRanges``) torch's shape environment gives the SymInt ``size``; ``None`` where it
    cannot bound its expression."""
    try:
        return size.node.shape_env.bound_sympy(size.node.expr)
    except Exception:  # a symbol the shape environment does not know: no bound  # noqa: BLE001
        return None


def _lowest(value: Any) -> Any:
    """The least value ``value`` (an int or a node computing a SymInt) can take, as torch's ranges know it;
    ``None`` where unknown."""
    import torch

    value = value.meta.get("val") if hasattr(value, "meta") else value
    if isinstance(value, int):
        return value
    if not isinstance(value, torch.SymInt):
        return None
    interval = size_range(value)
    return None if interval is None else interval.lower


def _at_least(value: Any, least: int) -> bool:
    lowest = _lowest(value)
    try:
        return lowest is not None and bool(lowest >= least)
    except TypeError:  # sympy's -oo against an int
        return False


def _shifted_dividends(graph: Any, target: Callable[[Any, Any], Any], shift: int,
                       result_of: Callable[[Any, Any, Any, Any], Any]) -> int:
    """Rewrite each ``target(a, b)`` on sizes whose dividend ``a`` may be negative and whose divisor ``b`` is positive
    as ``result_of(graph, a + b * k, b, k)``, ``k = shift // b``; returns how many were rewritten."""
    rewritten = 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is target]:
        dividend, divisor = node.args
        if not (is_size(dividend) and is_size(divisor)) or _at_least(dividend, 0) or not _at_least(divisor, 1):
            continue
        with graph.inserting_before(node):
            # shift // b and its multiple of b: both operands positive, so every runtime rounds them alike
            times = shift // divisor if isinstance(divisor, int) else sym_node(graph, operator.floordiv, shift, divisor)
            offset = divisor * times if isinstance(divisor, int) else sym_node(graph, operator.mul, divisor, times)
            result = result_of(graph, sym_node(graph, operator.add, dividend, offset), divisor, times)
        result.meta.update(node.meta)
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def floor_divisions_of_signed_sizes(graph: Any, /, *, shift: int = INT64_SHIFT) -> int:
    """Rewrite ``a // b`` on sizes whose dividend may be negative as ``(a + b * k) // b - k``, ``k = shift // b``.

    torch divides sizes with Python's floor; ONNX Runtime (``Div`` of int64, torch.onnx 2.13) and
    OpenVINO 2026.4 divide them toward zero. torch writes a ceiling as the floor of a negated size
    (``math.ceil(n / 4)`` is ``-((-n) // 4)`` in the exported graph), so a program sized an output 1
    short of eager's (Mimi's and EnCodec's last conv window, any ``ceil`` of a dynamic size). With the
    dividend shifted by a multiple of a positive divisor it is positive, where both roundings agree
    (for a dividend down to ``-shift``).
    Divisions whose dividend torch knows is never negative, or whose divisor may not be positive, are
    left as they are. Returns how many were rewritten.
    """
    return _shifted_dividends(graph, operator.floordiv, shift, lambda graph, shifted, divisor, times: sym_node(
        graph, operator.sub, sym_node(graph, operator.floordiv, shifted, divisor), times))


def remainders_of_signed_sizes(graph: Any, /, *, shift: int = INT64_SHIFT) -> int:
    """Rewrite ``a % b`` on sizes whose dividend may be negative as ``(a + b * k) % b``, ``k = shift // b``.

    torch takes Python's remainder (the divisor's sign: ``(-7) % 4 == 1``); ExecuTorch 1.5.1's
    ``executorch_prim::mod.Scalar`` takes C's (the dividend's: -3). torch writes the padding up to a
    whole block as ``(-n) % block`` (LongT5's local attention blocks, ``n + (-n) % k``): a
    ``.pte`` padded by a negative amount ("Padding values must be non-negative") or divided a size by
    the zero it made (SIGFPE). Shifted by a multiple of the positive divisor, the dividend is positive,
    where both remainders agree (down to ``-shift``); the same cases as ``floor_divisions_of_signed_sizes``
    are left as they are. Returns how many were rewritten.
    """
    return _shifted_dividends(graph, operator.mod, shift,
                              lambda graph, shifted, divisor, times: sym_node(graph, operator.mod, shifted, divisor))


def integer_powers_as_products(graph: Any, /) -> int:
    """Rewrite ``a ** k`` on a size with a small whole exponent as ``a * a * ... * a``.

    sympy writes a size times itself as a power (Swin's ``window_size * window_size`` when the window
    is clamped to a dynamic feature map: ``Min(h, w)**2``), and torch.export puts Python's
    ``operator.pow`` in the graph; ExecuTorch 1.5.1 has no primitive for it ("invalid target for
    call_function <built-in function pow>"). A product of sizes is one it runs. Exponents from 2 to
    8 are rewritten; returns how many powers were.

    Example:
        >>> import torch.fx
        >>> graph = torch.fx.Graph()
        >>> size = graph.placeholder("size")
        >>> size.meta["val"] = 5
        >>> _ = graph.output(graph.call_function(operator.pow, (size, 3)))
        >>> integer_powers_as_products(graph), [n.target.__name__ for n in graph.nodes if n.op == "call_function"]
        (1, ['mul', 'mul'])
        >>> [n.meta["val"] for n in graph.nodes if n.op == "call_function"]
        [25, 125]
    """
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not operator.pow or len(node.args) != 2:
            continue
        base, exponent = node.args
        if not (isinstance(exponent, int) and 2 <= exponent <= 8 and is_size(base)):
            continue
        with graph.inserting_before(node):
            product = base
            for _ in range(exponent - 1):
                product = sym_node(graph, operator.mul, product, base)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        count += 1
    return count
