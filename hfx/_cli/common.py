"""What the command line's subcommands share: exit codes, the usage error, runtime names, table printing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from hfx._cli.progress import step
from hfx._cli.quiet import quiet
from hfx._errors import HfxError

CAPTURE_SHAPE = (2, 7)  # batch, sequence of the example inputs the graphs are captured with

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Runtime name on the command line -> the name ``save`` writes in the manifest.
RUNTIMES = MappingProxyType({"pt2": "pt2", "onnx": "onnx", "pte": "pte", "ov": "openvino"})


# Runtime -> (packages it needs, the pip extra that installs them).
_PACKAGES = MappingProxyType({
    "pt2": ((), ""),
    "onnx": (("onnx", "onnxscript", "onnxruntime"), "onnx"),
    "pte": (("executorch",), "executorch"),
    "ov": (("openvino",), "openvino"),
})


class UsageError(HfxError, ValueError):
    """A command-line argument is invalid; the message says which and what to pass."""


def require_runtimes(runtimes: Sequence[str]) -> None:
    """Raise ``ImportError`` naming the pip extra when a package one of ``runtimes`` needs is not installed."""
    from hfx.backends._common import require

    for runtime in runtimes:
        packages, extra = _PACKAGES[runtime]
        if packages:
            try:
                require(*packages, extra=extra)
            except ImportError as exc:
                raise ImportError(f"runtime {runtime}: {exc}") from exc


def quiet_step(stream: IO[str], args: argparse.Namespace, label: str, work: Callable[[], Any]) -> Any:
    """``work()`` shown as one progress step, with upstream output silenced unless ``--verbose``."""
    with step(label, stream=stream), quiet(verbose=args.verbose):
        return work()


def eager_tokens(model: Any, prompt: Mapping[str, Any], count: int, generation_config: Any = None) -> Any:
    """Eager ``model.generate``'s greedy tokens on a copy of ``prompt`` (the reference an export's tokens must equal)."""
    import copy

    import torch

    options = {"generation_config": generation_config} if generation_config is not None else {}
    with torch.no_grad():
        return model.generate(**copy.deepcopy(dict(prompt)), max_new_tokens=count, do_sample=False, **options)


def token_difference(tokens: Any, expected: Any) -> str | None:
    """``None`` when ``tokens`` equal ``expected``; else how they differ (``"shapes differ"``, ``"3 ids differ"``)."""
    if tokens.shape != expected.shape:
        return "shapes differ"
    differ = int((tokens != expected).sum())
    return f"{differ} ids differ" if differ else None


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, columns padded to their widest cell.

    Example:
        >>> print(table(["a", "bb"], [[1, 2], [333, 4]]))
        a    bb
        ---  --
        1    2
        333  4
    """
    cells = [list(map(str, header)), *[list(map(str, row)) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def megabytes(size: int | None) -> str:
    """``size`` bytes as ``"1.23 MB"`` (``"-"`` for ``None``)."""
    return "-" if size is None else f"{size / 1e6:.2f} MB"


def read_manifest(directory: Path) -> dict[str, Any]:
    """The ``hfx.json`` manifest in ``directory``; ``FileNotFoundError`` names what to pass instead."""
    from hfx._save import MANIFEST

    path = directory / MANIFEST
    if not path.is_file():
        msg = f"{directory} holds no {MANIFEST}: pass a directory written by `hfx export` or hfx.save."
        raise FileNotFoundError(msg)
    return json.loads(path.read_text())


def saved_exports(directory: Path) -> dict[str, Path]:
    """Runtime -> saved directory: ``directory`` itself when it holds a manifest, else its runtime subdirectories.

    ``hfx export --out DIR`` writes one subdirectory per runtime; ``hfx.save`` writes one directory.
    """
    from hfx._save import MANIFEST

    if (directory / MANIFEST).is_file():
        saved_as = next(iter(read_manifest(directory)["components"].values()))["runtime"]
        return {next((k for k, v in RUNTIMES.items() if v == saved_as), saved_as): directory}
    found = {runtime: directory / runtime for runtime in RUNTIMES if (directory / runtime / MANIFEST).is_file()}
    if not found:
        what = "does not exist" if not directory.exists() else f"holds no {MANIFEST} and no runtime subdirectory with one"
        msg = f"{directory} {what}: pass a directory written by `hfx export --out DIR` (or hfx.save)."
        raise FileNotFoundError(msg)
    return found


def component_sizes(directory: Path) -> dict[str, int]:
    """Component name -> bytes of the files the manifest in ``directory`` lists for it."""
    components = read_manifest(directory)["components"]
    return {name: sum(_size(directory / f) for f in entry.get("files", ())) for name, entry in components.items()}


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0
