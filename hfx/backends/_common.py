"""Helpers every runtime module shares."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hfx._records import Capture, Exported
from hfx._upstream import check_window


def require(*modules: str, extra: str, stage: str = "") -> None:
    """Raise ``ImportError`` naming the stage and the pip extra to install when any of ``modules`` is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = (
            f"{stage + ': ' if stage else ''}this runtime needs {', '.join(missing)}, which is not installed. "
            f"Install it with: pip install 'hfx[{extra}]'"
        )
        raise ImportError(msg)
    for module in modules:
        check_window(module)


def as_exported(subject: Any, *, stage: str) -> Exported:
    """``subject`` if it is already ``Exported``; a ``Capture`` is exported first."""
    if isinstance(subject, Exported):
        return subject
    if isinstance(subject, Capture):
        from hfx._export.export import export

        return export(subject)
    msg = f"{stage} takes an Exported or a Capture (or Components of them), got {type(subject).__name__}"
    raise TypeError(msg)


@contextlib.contextmanager
def captured_output(buffer: io.StringIO, namespaces: tuple[str, ...]) -> Iterator[None]:
    """Write prints, warnings and the log records of ``namespaces`` to ``buffer`` while the block runs.

    The loggers' handlers are swapped and put back on exit, so this is
    process-global while active, like every hfx patch: do not lower in threads.
    """
    from hfx.patches import swap_attr

    handler = logging.StreamHandler(buffer)
    with contextlib.ExitStack() as stack:
        for logger in _loggers(namespaces):
            stack.enter_context(swap_attr(logger, "handlers", [handler]))
            stack.enter_context(swap_attr(logger, "propagate", False))
        stack.enter_context(contextlib.redirect_stdout(buffer))
        stack.enter_context(contextlib.redirect_stderr(buffer))
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        try:
            yield
        finally:
            buffer.writelines(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)


def _loggers(namespaces: tuple[str, ...]) -> list[logging.Logger]:
    """The top logger of each namespace and every existing logger under it that has its own handlers."""
    existing = [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and logger.handlers and name.split(".")[0] in namespaces
    ]
    return list({id(lg): lg for lg in [*map(logging.getLogger, namespaces), *existing]}.values())


def fixes_option(
    fixes: Iterable[Callable[..., Any]], *, stage: str, option: str, default: str
) -> tuple[Callable[..., Any], ...]:
    """``fixes`` as a tuple; a ``TypeError`` naming the stage, the option and its default unless it holds callables.

    Example:
        >>> fixes_option([print], stage="lower_to_ov", option="graph_fixes", default="OV_GRAPH_FIXES")
        (<built-in function print>,)
    """
    if not isinstance(fixes, (tuple, list)) or not all(callable(fix) for fix in fixes):
        msg = (
            f"{stage}: {option} must be a tuple of callables, such as (*hfx.backends.{default}, my_fix) "
            f"or hfx.backends.{default} without one; got {fixes!r}"
        )
        raise TypeError(msg)
    return tuple(fixes)


def fix_names(fixes: Iterable[Callable[..., Any]]) -> tuple[str, ...]:
    """The name of each fix, for the program record (a ``functools.partial`` is named after its function).

    Example:
        >>> import functools
        >>> fix_names([print, functools.partial(max, 1)])
        ('print', 'max')
    """
    return tuple(getattr(getattr(fix, "func", fix), "__name__", repr(fix)) for fix in fixes)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def root_cause(exc: BaseException) -> str:
    """``Type: first line`` of the innermost cause (runtimes wrap failures in long preambles)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {first_line(exc)}"


def with_log(message: str, log: str, *, source: str) -> str:
    """``message`` followed by the last 40 lines ``source`` printed, when it printed anything."""
    tail = "\n".join(log.strip().splitlines()[-40:])
    return f"{message}\n{source} output:\n{tail}" if tail else message


def lowering_error(stage: str, exported: Exported, what: str, todo: str, log: str = "", *, source: str) -> Any:
    """A ``LoweringError`` naming the stage, component and model, with the runtime's own output."""
    from hfx._errors import LoweringError, describe

    message = describe(stage, exported.source_class or "model", exported.name, what, todo)
    return LoweringError(with_log(message, log, source=source))


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of ``packages`` (for the manifest)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def default_threads() -> int:
    """The threads a runtime's program computes on unless told: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def given_options(**options: Any) -> dict[str, Any]:
    """``options`` without those that are ``None``: keyword arguments that leave the other fields at their defaults."""
    return {name: value for name, value in options.items() if value is not None}


def check_threads(stage: str, threads: Any) -> int:
    """``threads`` if it is a positive int, else a ``ValueError`` naming ``stage``."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        msg = f"{stage}: threads must be a positive int (the threads the runtime computes on), got {threads!r}"
        raise ValueError(msg)
    return threads
