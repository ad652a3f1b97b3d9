"""Helpers every runtime module shares."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from hfx._records import Capture, Exported


def require(*modules: str, extra: str) -> None:
    """Raise ``ImportError`` naming the pip extra to install when any of ``modules`` is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = (
            f"this runtime needs {', '.join(missing)}, which is not installed. "
            f"Install it with: pip install 'hfx[{extra}]'"
        )
        raise ImportError(msg)


def as_exported(subject: Any, *, stage: str) -> Exported:
    """``subject`` if it is already ``Exported``; a ``Capture`` is exported first."""
    if isinstance(subject, Exported):
        return subject
    if isinstance(subject, Capture):
        from hfx._export import export

        return export(subject)
    msg = f"{stage} takes an Exported or a Capture (or Components of them), got {type(subject).__name__}"
    raise TypeError(msg)


def spec_caches(exported: Exported) -> Any:
    """A context in which the cache classes named by ``exported``'s specs are pytree nodes (for lowering)."""
    from hfx._caches import classes_in_spec, registered_caches

    return registered_caches(classes_in_spec(exported.io.in_spec) + classes_in_spec(exported.io.out_spec))


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
