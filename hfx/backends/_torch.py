"""The torch.export runtime: an ``Exported`` saved as a ``.pt2`` file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfx._records import DynamicShapes, Exported, IoSpec

RUNTIME = "pt2"


def save_files(program: Exported, directory: Path) -> dict[str, Any]:
    """Write ``<name>.pt2`` into ``directory``; return the manifest entry."""
    import torch

    from hfx._caches import registered_caches

    filename = f"{program.name}.pt2"
    with registered_caches():
        torch.export.save(program.program, directory / filename)
    return {
        "files": [filename],
        "dynamic_shapes": program.dynamic_shapes.to_json(),
        "source_class": program.source_class,
    }


def load_files(entry: dict[str, Any], directory: Path, *, name: str, io: IoSpec) -> Exported:
    """Load a program written by ``save_files``."""
    import torch

    from hfx._caches import registered_caches

    with registered_caches():
        program = torch.export.load(directory / entry["files"][0])
    return Exported(
        program=program,
        io=io,
        dynamic_shapes=DynamicShapes.from_json(entry["dynamic_shapes"]),
        name=name,
        source_class=entry.get("source_class", ""),
    )
