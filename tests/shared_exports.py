"""One ``torch.export`` per worker for identical inputs: tests whose point is not the export share its result.

Many tests start from the same model and inputs (the zoo Llama, decomposed, in doctests, fixtures of several files
and the packaging tests) and each would trace it again: the suite spent ~190 worker-seconds tracing graphs it had
already traced in the same process. ``hfx.export`` is a pure function of the model (its modules, weights, buffers,
config and attributes), the inputs, the dynamic shapes and the patches, so while this module is installed
``hfx._export.export.exported_from_flat`` returns the ``Exported`` it made before for inputs whose ``fingerprint``
is the same, after checking that the stored program's weights are still the ones it was traced with.

A fingerprint reads values, not identities, where it can: tensors by dtype, shape and bytes, modules and plain
objects by type and attributes, functions by code, defaults and closure. Anything else counts by identity (and is
kept alive, so that its ``id`` cannot be reused by another object). Code a test changes from outside the model (a
monkeypatched module function) is not in the fingerprint: tests that take ``monkeypatch``, tests that watch what
runs (``capfd``, ``capsys``, ``caplog``, ``recwarn``: a shared export prints and warns nothing), and those marked
``fresh_exports`` (the tests of export itself, its patches and its failure paths), export afresh.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import hashlib
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum,
          torch.memory_format, torch.layout)


class _Fingerprint:
    """A running SHA-1 over a walk of values; ``pinned`` holds what was counted by identity."""

    def __init__(self) -> None:
        self.digest = hashlib.sha1()
        self.seen: dict[int, int] = {}
        self.walked: list[Any] = []  # alive while the walk lasts: a temporary's id must not be reused inside it
        self.pinned: list[Any] = []

    def emit(self, *parts: Any) -> None:
        self.digest.update(repr(parts).encode())

    def walk(self, value: Any) -> None:  # noqa: C901, PLR0912 - one branch per kind of value
        if isinstance(value, _PLAIN):
            self.emit(type(value).__qualname__, value)
            return
        key = id(value)
        if key in self.seen:  # shared and cyclic references: by position in the walk
            self.emit("ref", self.seen[key])
            return
        self.seen[key] = len(self.seen)
        self.walked.append(value)
        if isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, torch.nn.Module):
            self._object(value, skip=("_parameters", "_buffers", "_modules"))
            for group in ("_parameters", "_buffers", "_modules"):
                self.emit(group)
                self.walk(dict(vars(value)[group]))
        elif isinstance(value, Mapping):
            self.emit(type(value).__qualname__, len(value))
            for k in sorted(value, key=repr):
                self.walk(k)
                self.walk(value[k])
        elif isinstance(value, (list, tuple)):
            self.emit(type(value).__qualname__, len(value))
            for item in value:
                self.walk(item)
        elif isinstance(value, (set, frozenset)):
            self.emit(type(value).__qualname__, sorted(map(repr, value)))
        elif isinstance(value, functools.partial):
            self.emit("partial")
            self.walk((value.func, value.args, value.keywords))
        elif isinstance(value, types.FunctionType):
            self._function(value)
        elif isinstance(value, types.MethodType):
            self.emit("method")
            self.walk((value.__func__, value.__self__))
        elif isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType, torch._ops.OperatorBase,  # noqa: SLF001
                                torch._ops.OpOverloadPacket)):  # noqa: SLF001
            self.emit("named", getattr(value, "__module__", None), getattr(value, "__qualname__", str(value)))
        elif hasattr(value, "__dict__"):
            self._object(value)
        elif _slots(type(value)):  # inspect.Signature and its Parameters
            self.emit("slots", type(value).__module__, type(value).__qualname__)
            for name in _slots(type(value)):
                self.walk(getattr(value, name, None))
        else:
            self.emit("identity", type(value).__qualname__, key)
            self.pinned.append(value)

    def _tensor(self, tensor: torch.Tensor) -> None:
        meta = (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.requires_grad, type(tensor).__qualname__)
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer) or tensor.is_meta:
            self.emit("tensor by identity", meta, id(tensor))
            self.pinned.append(tensor)
            return
        data = tensor.detach().contiguous().reshape(-1)
        self.emit("tensor", meta, hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest() if data.numel() else "")

    def _object(self, value: Any, skip: tuple[str, ...] = ()) -> None:
        attributes = {k: v for k, v in vars(value).items() if k not in skip}
        self.emit("object", type(value).__module__, type(value).__qualname__, sorted(attributes))
        for name in sorted(attributes):
            self.walk(attributes[name])

    def _function(self, function: types.FunctionType) -> None:
        code = function.__code__
        self.emit("function", function.__module__, function.__qualname__, code.co_code, repr(code.co_consts))
        self.walk((function.__defaults__, function.__kwdefaults__))
        for cell in function.__closure__ or ():
            try:
                self.walk(cell.cell_contents)
            except ValueError:  # an empty cell
                self.emit("empty cell")


def _slots(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``cls`` and its bases (ordered, no weak-reference slots)."""
    names = []
    for base in reversed(cls.__mro__):
        slots = vars(base).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [name for name in slots if name not in ("__weakref__", "__dict__")]
    return tuple(names)


def fingerprint(*values: Any) -> tuple[str, list[Any]]:
    """The digest of ``values`` and the objects it counted by identity (keep them alive while the digest is used)."""
    walk = _Fingerprint()
    walk.walk(values)
    return walk.digest.hexdigest(), walk.pinned


def _weights_digest(exported: Any) -> str:
    """A digest of the program's weights and constants: a shared program must still hold what it was traced with."""
    program = exported.program
    return fingerprint(dict(program.state_dict), dict(program.constants))[0]


_SUSPENDED = threading.local()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Every export in the block traces afresh (and is not stored)."""
    before = getattr(_SUSPENDED, "on", False)
    _SUSPENDED.on = True
    try:
        yield
    finally:
        _SUSPENDED.on = before


# Results kept per worker, the most recently used first: every object kept alive is walked by each full garbage
# collection, so a store of every export made the whole suite slower than the traces it saved (measured: 40 kept
# decomposed exports made an unrelated lowering 9% slower). The repeated exports are a few popular graphs.
KEPT = 8


def _sharing_now() -> bool:
    """Whether this call may share: not in a ``suspended`` block, and on the main thread (tests of threads run
    their stages concurrently on purpose)."""
    return not getattr(_SUSPENDED, "on", False) and threading.current_thread() is threading.main_thread()


def _shared(original: Any, key_of: Any, watched: Any, *, kept: int, copy: Any = None) -> Any:
    """``original`` that returns (a ``copy`` of) the result of a recent call whose ``key_of(*args, **kwargs)`` is
    the same, while the ``Exported`` that ``watched(result, *args, **kwargs)`` names still holds the weights it held
    when the result was made. ``key_of`` returns ``None`` for a call that must run."""
    store: collections.OrderedDict[str, tuple[Any, str, list[Any]]] = collections.OrderedDict()
    lock = threading.Lock()
    copy = copy or (lambda result: result)

    @functools.wraps(original)
    def shared(*args: Any, **kwargs: Any) -> Any:
        keyed = key_of(*args, **kwargs) if _sharing_now() else None
        if keyed is None:
            return original(*args, **kwargs)
        key, pinned = keyed
        with lock:
            found = store.get(key)
            if found is not None:
                store.move_to_end(key, last=False)
        if found is not None and _weights_digest(watched(found[0], *args, **kwargs)) == found[1]:
            return copy(found[0])
        result = original(*args, **kwargs)
        with lock:
            store[key] = (result, _weights_digest(watched(result, *args, **kwargs)), pinned)
            store.move_to_end(key, last=False)
            while len(store) > kept:
                store.popitem()
        return copy(result)

    return shared


def sharing(original: Any, kept: int = KEPT) -> Any:
    """``exported_from_flat`` that returns the ``Exported`` of a recent call with the same fingerprint."""

    def key_of(flat: Any, shapes: Any, patches: Any) -> tuple[str, list[Any]] | None:
        if isinstance(flat.source, torch.fx.GraphModule):  # a lowering's re-export of its own graph: never seen
            return None  # again, it would only push shared exports out of the store
        return fingerprint(flat.module, flat.source, dict(flat.kwargs), dict(flat.constants), flat.name, shapes,
                           tuple(patches))

    return _shared(original, key_of, lambda exported, *_: exported, kept=kept)


def identity_key(*values: Any) -> tuple[str, list[Any]]:
    """The digest of ``values``: plain values, tuples, lists and dicts by value, anything else (records, programs,
    functions, a fix that records its calls) by identity, kept alive in the list returned."""
    pinned: list[Any] = []

    def walk(value: Any) -> Any:
        if isinstance(value, _PLAIN):
            return (type(value).__qualname__, value)
        if isinstance(value, (tuple, list)):
            return (type(value).__qualname__, [walk(item) for item in value])
        if isinstance(value, Mapping):
            return ("mapping", sorted((repr(walk(k)), walk(v)) for k, v in value.items()))
        pinned.append(value)
        return ("identity", type(value).__qualname__, id(value))

    parts = [walk(value) for value in values]
    return hashlib.sha1(repr(parts).encode()).hexdigest(), pinned


def sharing_by_identity(original: Any, *, skip: tuple[str, ...] = (), copy: Any = None, kept: int = KEPT) -> Any:
    """``original(exported, ...)``, a pure function of an ``Exported`` (``for_runtime``, a lowering's conversion),
    returning a recent call's result for the same ``Exported`` object and ``identity_key``-equal other arguments
    (those named in ``skip``, such as a log it writes, left out). Shared exports make equal exports one object."""
    import inspect

    signature = inspect.signature(original)

    def key_of(*args: Any, **kwargs: Any) -> tuple[str, list[Any]]:
        bound = signature.bind(*args, **kwargs).arguments
        return identity_key(original, [(name, value) for name, value in bound.items() if name not in skip])

    return _shared(original, key_of, lambda _, exported, *__, **___: exported, kept=kept, copy=copy)
