"""Dropping the resident pages of a file a runtime maps read-only, once it holds what it needs in its own memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

_MADV_DONTNEED = 4  # Linux


def read_only_mappings(path: str | Path) -> list[tuple[int, int]]:
    """``(start, end)`` of each read-only mapping of ``path`` in this process (``/proc/self/maps``; none off Linux)."""
    if not sys.platform.startswith("linux"):
        return []
    target = str(Path(path).resolve())
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == target and "w" not in fields[1]:
                start, end = (int(address, 16) for address in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def drop_resident_pages(path: str | Path) -> int:
    """Drop this process's resident pages of the read-only mappings of ``path``; return the bytes advised.

    The mappings stay: a page read again comes back from the page cache or the file, with the same
    bytes (the mapping is read-only, so no page of it was changed). RSS then counts only the pages
    read after this. A no-op off Linux or where ``madvise`` is not found.
    """
    name = ctypes.util.find_library("c")
    ranges = read_only_mappings(path)
    if not ranges or name is None:
        return 0
    madvise = ctypes.CDLL(name, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return sum(end - start for start, end in ranges if madvise(start, end - start, _MADV_DONTNEED) == 0)
