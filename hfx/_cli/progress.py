"""A minimal progress display for the command line: one line per stage, written to stderr.

On a terminal the running step's line is redrawn in place and replaced by its
result; otherwise (a pipe, a CI log) one line is printed per finished step.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import IO

_CLEAR_LINE = "\r\x1b[K"


def progress_stream() -> IO[str]:
    """A text stream on a duplicate of file descriptor 2, so progress stays visible while fd 2 is silenced.

    Falls back to ``sys.stderr`` when fd 2 cannot be duplicated (no console).
    """
    try:
        sys.stderr.flush()
        return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    except (OSError, ValueError, AttributeError):
        return sys.stderr


@contextlib.contextmanager
def step(label: str, *, stream: IO[str]) -> Iterator[None]:
    """Show ``label`` while the block runs and ``label`` with its seconds (or ``failed``) when it ends.

    Args:
        label: what the step does, e.g. ``"lower decode to onnx"``.
        stream: where to write (see ``progress_stream``).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with step("export", stream=out):
        ...     pass
        >>> out.getvalue().startswith("  done   export")
        True
    """
    tty = _is_tty(stream)
    if tty:
        stream.write(f"{_CLEAR_LINE}  ...    {label}")
        stream.flush()
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        _finish(stream, tty, "failed", label, time.perf_counter() - started)
        raise
    _finish(stream, tty, "done", label, time.perf_counter() - started)


def _finish(stream: IO[str], tty: bool, status: str, label: str, seconds: float) -> None:
    prefix = _CLEAR_LINE if tty else ""
    stream.write(f"{prefix}  {status:<7}{label} ({seconds:.1f} s)\n")
    stream.flush()


def _is_tty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False
