"""The torch.export runtime: an ``Exported`` saved as a ``.pt2`` file."""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from hfx._records import DynamicShapes, Exported, IoSpec

RUNTIME = "pt2"

# Archive members that hold no pickle: format markers, read as text (torch/export/pt2_archive/constants.py).
_MARKERS = frozenset({"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"})
# Payload files ``torch.export.load`` reads as raw bytes when their config says ``use_pickle: false``.
_RAW_PAYLOADS = {"data/weights/": "weight_", "data/constants/": "tensor_"}


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


def load_files(entry: dict[str, Any], directory: Path, *, name: str, io: IoSpec, threads: int | None = None) -> Exported:
    """Load a program written by ``save_files``. It runs on torch's threads (``torch.set_num_threads``), which
    are the process's, not the program's: ``threads`` is not set here."""
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


def unpickled_members(entry: dict[str, Any], directory: Path) -> list[str]:
    """The members of the component's ``.pt2`` that ``torch.export.load`` would unpickle (pickle can run code).

    ``torch.export.load`` unpickles a tensor-subclass constant with ``weights_only=False``, custom and opaque
    objects with ``pickle.loads``, and falls back to ``weights_only=False`` for sample inputs it cannot read
    safely. hfx writes none of them (plain tensors are raw bytes, sample inputs are left empty). Only what is
    known to be plain passes: JSON, the format markers, empty sample inputs and the raw payloads a config lists.

    Raises:
        ValueError: a payload config is not valid JSON (``KeyError``/``BadZipFile`` for a damaged archive).
    """
    path = Path(directory) / entry["files"][0]
    with zipfile.ZipFile(path) as archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
        listed = [payload for info in infos for payload in _listed_payloads(archive, info)]
        plain = {name for name, raw in listed if raw}
        pickled = [name for name, raw in listed if not raw]
        return pickled + [info.filename for info in infos
                          if info.filename not in plain | set(pickled) and not _plain_member(info)]


def _listed_payloads(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> list[tuple[str, bool]]:
    """``(file, is raw)`` for each payload a weights or constants config member lists; ``[]`` for other members."""
    root, member = _archive_parts(info.filename)
    if not member.endswith(("_weights_config.json", "_constants_config.json")):
        return []
    folder = f"{PurePosixPath(member).parent}/"
    prefix = _RAW_PAYLOADS.get(folder)
    return [(f"{root}{folder}{meta['path_name']}",
             bool(prefix) and not meta.get("use_pickle") and meta["path_name"].startswith(prefix))
            for meta in json.loads(archive.read(info))["config"].values()]


def _plain_member(info: zipfile.ZipInfo) -> bool:
    _, member = _archive_parts(info.filename)
    empty_inputs = member.startswith("data/sample_inputs/") and info.file_size == 0
    return member in _MARKERS or member.endswith(".json") or empty_inputs


def _archive_parts(filename: str) -> tuple[str, str]:
    """``("model/", "data/weights/weight_0")``: the archive's root folder and the member's path under it."""
    root, _, member = filename.partition("/")
    return (f"{root}/", member) if member else ("", root)
