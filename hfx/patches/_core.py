"""Reversible patches: two primitives and one combinator.

A patch is a zero-argument callable returning a context manager. Patches are
process-global while active: do not run exports concurrently in threads.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, ContextManager

from hfx._errors import PatchError

Patch = Callable[[], ContextManager[Any]]
_MISSING = object()


@contextlib.contextmanager
def swap_attr(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name = value`` inside the block and restore it exactly on exit.

    The old value is read with ``vars()``, not ``getattr()``, so a staticmethod,
    a descriptor or an inherited attribute comes back as it was.

    >>> class A: x = 1
    >>> with swap_attr(A, "x", 2):
    ...     A.x
    2
    >>> A.x, "x" in vars(A)
    (1, True)
    """
    old = vars(owner).get(name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


@contextlib.contextmanager
def swap_attr_on_each(owners: Iterable[Any], name: str, value: Any) -> Iterator[None]:
    """``swap_attr(owner, name, value)`` for every owner in ``owners`` at once; all restored on exit.

    >>> class A: x = 1
    >>> class B: x = 1
    >>> with swap_attr_on_each((A, B), "x", 2):
    ...     A.x, B.x
    (2, 2)
    >>> A.x, B.x
    (1, 1)
    """
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(swap_attr(owner, name, value))
        yield


@contextlib.contextmanager
def swap_item(owner: MutableMapping[Any, Any], key: Any, value: Any) -> Iterator[None]:
    """Set ``owner[key] = value`` inside the block and restore (or remove) it on exit.

    >>> d = {}
    >>> with swap_item(d, "k", 1):
    ...     d["k"]
    1
    >>> d
    {}
    """
    old = owner.get(key, _MISSING)
    owner[key] = value
    try:
        yield
    finally:
        if old is _MISSING:
            del owner[key]
        else:
            owner[key] = old


@contextlib.contextmanager
def with_patches(*patches: Patch) -> Iterator[None]:
    """Enter every patch in order; on exit, on error, or when a later patch fails, undo them all.

    Args:
        *patches: zero-argument callables that return context managers.

    Raises:
        PatchError: a patch failed to apply (the ones entered before it are undone).

    Example:
        >>> calls = []
        >>> @contextlib.contextmanager
        ... def p():
        ...     calls.append("in"); yield; calls.append("out")
        >>> with with_patches(p, p):
        ...     pass
        >>> calls
        ['in', 'in', 'out', 'out']
    """
    with contextlib.ExitStack() as stack:
        for patch in patches:
            try:
                stack.enter_context(patch())
            except Exception as exc:
                name = getattr(patch, "__name__", repr(patch))
                msg = f"[with_patches] patch {name} failed to apply: {exc}. Every patch entered before it was undone."
                raise PatchError(msg) from exc
        yield


def size_at_trace(size: int | Any) -> int:
    """The value a size (an int or a ``torch.SymInt``) has in the traced inputs, read without a guard."""
    import torch

    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


def source_contains(function: Any, text: str | re.Pattern[str]) -> bool:
    """Whether ``function``'s (or a module's) source holds ``text``, or a match of it where it is a compiled
    pattern (False where the source cannot be read): how a patch finds its model pattern."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return bool(text.search(source)) if isinstance(text, re.Pattern) else text in source


def defining_modules(model: Any) -> set[Any]:
    """The Python modules that define the classes of ``model``'s submodules (where a module-level patch goes)."""
    return {module for module in (sys.modules.get(type(m).__module__) for m in model.modules()) if module is not None}
