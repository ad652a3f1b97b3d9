"""ExecuTorch's one process-wide threadpool, sized before a ``PteProgram`` loads its method.

XNNPACK's kernels and ExecuTorch's LLM kernels run on a single threadpool per
process, made with a thread per core of the machine (not of the CPUs this
process may use). XNNPACK keeps a pointer to it in every method it loads, and
Python can only replace it (``portable_lib._unsafe_reset_threadpool``): a method
loaded before a replacement then runs on the freed pool (a segmentation fault
in hfx's generation when a call replaced it). So a program's ``threads`` sizes
the pool just before its method loads, only while no other loaded program is
alive; a program that asks for another size while one is raises ``ValueError``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from hfx.backends._common import check_threads

_LOCK = threading.Lock()
_LOADED: weakref.WeakSet[Any] = weakref.WeakSet()  # programs whose method is loaded on the current pool


def pool_threads() -> int:
    """The threads of ExecuTorch's threadpool in this process."""
    return _portable_lib()._threadpool_get_thread_count()  # noqa: SLF001 - ExecuTorch's only thread setting in Python


def loading_on_threads(program: Any, threads: int | None, load: Any, *, quiet: Any) -> Any:
    """``load()`` (a method of ``program``) with the pool at ``threads`` threads (``None``: as it is), and
    ``program`` counted among the loaded ones; ``quiet()`` keeps ExecuTorch's notice of a new pool from stderr.

    Raises:
        ValueError: ``threads`` is not a positive int or ``None``, or the pool has another size and a loaded
            program is alive (it would run on a freed pool).
    """
    if threads is not None:  # checked here: attrs runs a field's validator after the other fields' factories
        check_threads("PteProgram", threads)
    with _LOCK:
        size = pool_threads()
        if threads is not None and size != threads:
            alive = sorted(getattr(other, "name", "model") for other in _LOADED)
            if alive:
                msg = (f"PteProgram: ExecuTorch has one threadpool per process, now {size} threads, and "
                       f"{len(alive)} loaded program(s) ({', '.join(alive[:5])}) run on it; this one asks for {threads}. "
                       f"Replacing the pool under them would crash them: pass threads={size} (or None), "
                       "let those programs go first, or run this one in another process.")
                raise ValueError(msg)
            with quiet():  # "[threadpool.cpp:66] Resetting threadpool to N threads."
                _portable_lib()._unsafe_reset_threadpool(threads)  # noqa: SLF001
        method = load()
        _LOADED.add(program)
        return method


def _portable_lib() -> Any:
    from executorch.extension.pybindings import portable_lib

    return portable_lib
