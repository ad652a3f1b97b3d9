"""Directories written whole or not at all: files go to a staging folder beside the target, moved in at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_directory(target: Path, *, overwrite: bool, stage: str) -> Iterator[Path]:
    """Yield an empty staging folder next to ``target``; on success it replaces ``target``, on failure it is removed.

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is false (named with ``stage``).
    """
    if target.exists() and not overwrite:
        msg = f"{stage}: {target} already exists; choose another directory or pass overwrite=True"
        raise FileExistsError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _move_into_place(staging: Path, target: Path) -> None:
    """Replace ``target`` with ``staging`` so that ``target`` is either old or complete."""
    if not target.exists():
        os.replace(staging, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.replace(target, old / "x")
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
