"""The torch.export runtime: an ``Exported`` saved as a ``.pt2`` file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hfx._records import DynamicShapes, Exported, IoSpec

RUNTIME = "pt2"


def save_files(program: Exported, directory: Path) -> dict[str, Any]:
    """Write ``<name>.pt2`` into ``directory``; return the manifest entry."""
    import torch

    from hfx._pytree import registered_caches

    filename = f"{program.name}.pt2"
    # Example inputs would pickle cache objects, which torch.export.load then only reads with
    # weights_only=False (and a logging error); the program does not need them.
    without_examples = copy.copy(program.program)
    without_examples._example_inputs = None  # noqa: SLF001
    with registered_caches():
        torch.export.save(without_examples, directory / filename)
    return {
        "files": [filename],
        "dynamic_shapes": program.dynamic_shapes.to_json(),
        "source_class": program.source_class,
    }


def load_files(entry: dict[str, Any], directory: Path, *, name: str, io: IoSpec) -> Exported:
    """Load a program written by ``save_files``."""
    import torch

    from hfx._pytree import classes_in_spec, registered_caches

    classes_in_spec(io.out_spec)  # imports the output classes' modules: the program's spec names them
    with registered_caches():
        program = torch.export.load(directory / entry["files"][0])
    return Exported(
        program=program,
        io=io,
        dynamic_shapes=DynamicShapes.from_json(entry["dynamic_shapes"]),
        name=name,
        source_class=entry.get("source_class", ""),
    )
