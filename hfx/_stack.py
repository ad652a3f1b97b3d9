"""Deep call stacks in one reserved chunk of CPython's frame stack (python/cpython#142183).

CPython keeps each thread's Python frames in a stack of 16 KiB chunks. It maps a new
chunk when a call does not fit in the current one and unmaps it as soon as that call
returns, so a loop that calls across a chunk's edge maps, faults in and unmaps a chunk
on every call ("Calls across stack chunks perform badly"). torch.export, torch's
decompositions, torch.onnx, OpenVINO's frontend and ExecuTorch's passes are such loops
over every node of a graph, many frames deep: lowering a one-layer decoder graph to
ExecuTorch here took ~100k page faults and 0.8 s of system time, about 10% of the
lowering. CPython 3.14 keeps one chunk cached (gh-145789, backported to 3.13 by
gh-146123); 3.11 and 3.12 do not.

``on_a_reserved_stack(function)`` calls ``function`` from a frame that takes half of a
fresh 1 MiB chunk and leaves the other half (64k slots, thousands of frames) to the calls
below it, which then never cross a chunk's edge. The chunk is unmapped when the call
returns; calls below it (a stage that runs another) use it as they are. Where the interpreter does not thrash (``chunks_thrash()``, checked once per
process by counting page faults), ``function`` is called as it is. Delete this module
when hfx requires a CPython that caches a chunk.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

# Locals of the reserving frame: with CPython's 1000-slot margin the frame needs just over 512 KiB, so the
# chunk it gets is 1 MiB (chunk sizes double from 16 KiB) and ~66k slots stay free for the frames below it.
_RESERVED_SLOTS = 64_600

# Per thread: whether a reserved frame is already below this call (a stage that runs another, or recursion).
_INSIDE = threading.local()


def _call(work: Callable[[], Any]) -> Any:
    return work()


@functools.cache
def _reserving_call() -> Callable[[Callable[[], Any]], Any]:
    """``_call`` with ``_RESERVED_SLOTS`` unused locals added to its code (built once)."""
    names = _call.__code__.co_varnames + tuple(f"_{i}" for i in range(_RESERVED_SLOTS))
    code = _call.__code__.replace(co_varnames=names, co_nlocals=len(names))
    return types.FunctionType(code, _call.__globals__, "reserving_call")


def faults_of_calls_across_an_edge() -> int | None:
    """The process's page faults while a function is called 400 times at each depth over two chunks' worth of
    frames (None without ``resource``, on Windows): at one of those depths each call crosses a chunk's edge."""
    try:
        import resource
    except ImportError:
        return None

    def leaf() -> None:
        return None

    def at_depth(depth: int) -> None:
        if depth:
            return at_depth(depth - 1)
        for _ in range(400):
            leaf()
        return None

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for depth in range(300):  # a frame of at_depth is ~13 slots: 300 of them span two 2048-slot chunks
        at_depth(depth)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@functools.cache
def chunks_thrash() -> bool:
    """Whether this interpreter maps a fresh frame-stack chunk for each call across a chunk's edge, checked once.

    Mapping a chunk per call at the edge faults ~400 times more than a cached chunk
    (``faults_of_calls_across_an_edge``); without ``resource`` (Windows), true on CPython.

    Example:
        >>> isinstance(chunks_thrash(), bool)
        True
    """
    faults = faults_of_calls_across_an_edge()
    return sys.implementation.name == "cpython" if faults is None else faults > 300


def reserved_call(work: Callable[[], Any]) -> Any:
    """``work()``, called from a frame that reserves a fresh chunk of the frame stack (module docstring)."""
    return _reserving_call()(work)


def on_a_reserved_stack(function: _F) -> _F:
    """``function``, whose calls run in a reserved frame-stack chunk where the interpreter thrashes (module docstring).

    Example:
        >>> @on_a_reserved_stack
        ... def deep(n):
        ...     return 0 if n == 0 else 1 + deep(n - 1)
        >>> deep(300)  # each level below the first runs on the same reserved chunk
        300
    """

    @functools.wraps(function)
    def reserved(*args: Any, **kwargs: Any) -> Any:
        if getattr(_INSIDE, "reserved", False) or not chunks_thrash():
            return function(*args, **kwargs)
        _INSIDE.reserved = True
        try:
            return reserved_call(lambda: function(*args, **kwargs))
        finally:
            _INSIDE.reserved = False

    return reserved  # type: ignore[return-value]
