"""Dropping the resident pages of a file a runtime maps read-only, once it holds what it needs in its own memory,
and having the pages it reads again mapped one at a time."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_MADV_RANDOM = 1  # Linux
_MADV_DONTNEED = 4


def mappings(path: str | Path, *, read_only: bool = True) -> list[tuple[int, int]]:
    """``(start, end)`` of each mapping of ``path`` in this process (``/proc/self/maps``; none off Linux):
    the read-only ones, or (``read_only=False``) every one, copy-on-write mappings too (ONNX Runtime maps
    external weights readable and writable, private).
    """
    if not sys.platform.startswith("linux"):
        return []
    target = str(Path(path).resolve())
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == target and not (read_only and "w" in fields[1]):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def read_only_mappings(path: str | Path) -> list[tuple[int, int]]:
    """``(start, end)`` of each read-only mapping of ``path`` in this process."""
    return mappings(path, read_only=True)


@functools.cache
def _libc() -> Any:
    """The C library, or ``None`` where none is found."""
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` with its argument types set, or ``None`` where no C library is found."""
    libc = _libc()
    if libc is None:
        return None
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


@functools.cache
def _munlock() -> Callable[[int, int], int] | None:
    """libc's ``munlock`` with its argument types set, or ``None`` where no C library is found."""
    libc = _libc()
    if libc is None:
        return None
    munlock = libc.munlock
    munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return munlock


def drop_resident_pages(path: str | Path) -> int:
    """Drop this process's resident pages of the read-only mappings of ``path``; return the bytes advised.

    The mappings stay: a page read again comes back from the page cache or the file, with the same
    bytes (the mapping is read-only, so no page of it was changed). RSS then counts only the pages
    read after this. Locked pages are unlocked first (``madvise`` refuses them): ExecuTorch's data
    loader locks each range it maps, also those it has copied into its own memory. A no-op off Linux
    or where ``madvise`` is not found.
    """
    ranges = read_only_mappings(path)
    madvise = _madvise() if ranges else None
    if madvise is None:
        return 0
    munlock = _munlock()
    for start, end in ranges if munlock is not None else ():
        munlock(start, end - start)
    return sum(end - start for start, end in ranges if madvise(start, end - start, _MADV_DONTNEED) == 0)


def read_back_page_by_page(path: str | Path) -> bool:
    """Make later reads of ``path``'s mappings in this process map a page each; whether it could.

    Why: a runtime that keeps reading a few rows of a mapped file in place (OpenVINO's and ONNX Runtime's
    embedding lookups, beside their own packed copies of the other weights) maps a whole folio of the
    page cache per fault, and a file just written or read in sequence sits there in large folios: on a
    6.18 kernel with ext4, 2 MB each, so a 128-token prompt of a SmolLM-135M-shaped decoder mapped 96 MB
    (OpenVINO) or 92 MB (ONNX Runtime) of its 108 MB embedding. The file's clean pages no process maps
    are dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` after ``fdatasync``; other
    processes' mappings keep theirs) and every mapping of it in this process, copy-on-write ones too
    (advice changes no byte), is marked random-access (``MADV_RANDOM``: no readahead), so a row read
    again comes back as one 4 KB page. Call it after ``drop_resident_pages``, which drops read-only
    mappings' pages only. A no-op off Linux or without a mapping.
    """
    ranges = mappings(path, read_only=False)
    madvise = _madvise() if ranges else None
    if madvise is None or not hasattr(os, "posix_fadvise"):
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(descriptor)  # the page cache drops clean pages only: a file just saved may not be written yet
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)
    except OSError:  # a file system that takes no such advice (read-only, remote): the pages stay as they are
        return False
    return all(madvise(start, end - start, _MADV_RANDOM) == 0 for start, end in ranges)


def release_copied_pages(path: str | Path) -> None:
    """Once a runtime holds what it copied from its mapped weight file ``path``: drop the pages it read
    (``drop_resident_pages``) and have those it reads again in place come back a page each
    (``read_back_page_by_page``). What OpenVINO's, ONNX Runtime's and ExecuTorch's loads call.
    """
    drop_resident_pages(path)
    read_back_page_by_page(path)
