"""``save`` and ``load``: a directory with a versioned JSON manifest and each runtime's own files."""

from __future__ import annotations

import importlib
import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
from toolz import curry

from hfx._atomic import staged_directory
from hfx._errors import HfxError, argument_error
from hfx._records import Components, GenerationMeta, IoSpec
from hfx.backends._common import check_threads

SCHEMA_VERSION = 2  # 2: ``meta`` is a ``GenerationMeta``'s JSON (1: a flat dict, still read)
MANIFEST = "hfx.json"
PROCESSOR = "processor"

# Program record class -> the module that writes and reads its files. Read-only: nothing registers here.
_RUNTIME_MODULES = MappingProxyType(
    {
        "Exported": "hfx.backends._torch",
        "AotiProgram": "hfx.backends._aoti",
        "OnnxProgram": "hfx.backends._onnx",
        "PteProgram": "hfx.backends._executorch",
        "OvProgram": "hfx.backends._openvino",
    }
)


def _runtime_module(kind: str) -> Any:
    if kind not in _RUNTIME_MODULES:
        msg = f"save: cannot save a {kind}; save takes {sorted(_RUNTIME_MODULES)} or Components of them"
        raise TypeError(msg)
    return importlib.import_module(_RUNTIME_MODULES[kind])


@curry
def save(
    directory: str | os.PathLike[str],
    program: Any,
    /,
    *,
    overwrite: bool = False,
    processor: Any = None,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Save a program (or ``Components`` of programs) to ``directory``.

    The directory holds ``hfx.json`` (schema version, hfx and package versions,
    and per component: runtime, files and calling contract) plus each runtime's
    own files (``.pt2``, an AOTInductor ``.pt2`` package, ``.onnx`` + ``.onnx.data``, ``.pte`` (+ ``.ptd``), ``.xml``/``.bin``).
    For ``Components`` it also keeps what ``generate`` needs (the generation
    config and the component roles, in ``meta``) and a tokenizer or processor
    in ``processor/``.
    Files are written to a temporary directory next to the target and moved in
    at the end, so a failed save leaves nothing behind.

    ``save(directory)`` alone is a stage ``program -> Path``:
    ``pipe(model, capture(inputs), lower_to_onnx, save("out/model"))``.

    Args:
        directory: where to save; must not exist unless ``overwrite``.
        program: an ``Exported``, ``AotiProgram``, ``OnnxProgram``, ``PteProgram``, ``OvProgram`` or ``Components``.
        overwrite: replace an existing directory.
        processor: a tokenizer or processor (``save_pretrained``) to keep with the
            programs; defaults to ``program.processor`` for ``Components``.
        meta: JSON facts to keep with the programs (a model id, a license),
            merged over the ``Components``' own ``meta.extra``.

    Returns:
        The directory's path.

    Raises:
        TypeError: ``directory`` is not a path, or ``program`` is one (the arguments in the wrong order),
            or ``program`` is not a program hfx saves.
        FileExistsError: ``directory`` exists and ``overwrite`` is false.

    Example:
        >>> import torch, tempfile, hfx
        >>> ex = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 1)))
        >>> path = save(tempfile.mkdtemp() + "/linear", ex)
        >>> load(path)(input=torch.ones(4, 3)).shape
        torch.Size([4, 1])
    """
    _check_order(directory, program)
    target = Path(directory)
    components = program if isinstance(program, Components) else Components(items={program.name: program})
    if meta:
        components = attrs.evolve(components, meta=attrs.evolve(components.meta, extra={**components.meta.extra, **meta}))
    with staged_directory(target, overwrite=overwrite, stage="save") as staging:
        write_saved(staging, components, single=not isinstance(program, Components), processor=processor)
    return target


def _check_order(directory: Any, program: Any) -> None:
    """Raise ``TypeError`` when ``save(directory, program)`` got its arguments swapped or no path."""
    call = "save(directory, program)"
    if isinstance(program, (str, os.PathLike)):
        raise argument_error(call, "program (the last argument)", "a program or Components", program)
    if not isinstance(directory, (str, os.PathLike)):
        raise argument_error(call, "directory", "a path (str or os.PathLike)", directory)


def write_saved(
    staging: Path,
    components: Components,
    *,
    single: bool = False,
    processor: Any = None,
    layout: Mapping[str, Mapping[str, str]] = MappingProxyType({}),
) -> None:
    """Write ``components`` into the empty folder ``staging`` as ``save`` does: runtime files, ``hfx.json``, processor.

    ``layout`` maps a component to the file names its runtime's ``save_files`` takes (a package's own layout).
    """
    manifest = _write_components(components, staging, single=single, layout=layout)
    processor = processor if processor is not None else components.processor
    if processor is not None:
        processor.save_pretrained(staging / PROCESSOR)
        manifest["processor"] = PROCESSOR
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _write_components(
    components: Components, staging: Path, *, single: bool, layout: Mapping[str, Mapping[str, str]]
) -> dict[str, Any]:
    from hfx._version import __version__
    from hfx.backends._common import versions

    entries = {}
    for name, program in components.items():
        kind = type(program).__name__
        module = _runtime_module(kind)
        entry = module.save_files(program, staging, **layout.get(name, {}))
        entries[name] = {"runtime": module.RUNTIME, "record": kind, "io": program.io.to_json(), **entry}
    return {
        "schema_version": SCHEMA_VERSION,
        "hfx_version": __version__,
        "versions": versions("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch", "openvino"),
        "single": single,
        "meta": components.meta.to_json(),
        "components": entries,
    }


def load(directory: str | os.PathLike[str], /, *, trust: bool = False, threads: int | None = None) -> Any:
    """Load what ``save`` wrote: one program, or ``Components`` when several were saved.

    What the manifest names is resolved, never imported: classes in its specs only among transformers' cache
    classes (``hfx._pytree``), files only inside ``directory``. Nothing is unpickled unless ``trust=True``: a
    ``.pt2`` that holds pickled parts (``hfx.save`` writes none; another tool or a changed file may) is refused,
    since unpickling can run any code. An ``AotiProgram``'s package is compiled native code, which loading runs:
    it too loads only with ``trust=True``.

    Args:
        directory: what ``hfx.save`` wrote.
        trust: allow loading pickled parts of a ``.pt2`` and compiled packages (``AotiProgram``); only for an
            export whose source you trust.
        threads: the threads each program computes on, given to it as it loads: ONNX Runtime's session,
            OpenVINO's compiled model, ExecuTorch's threadpool (``hfx.backends._executorch_threads``). ``None``:
            each runtime's default, as ``lower_to_*`` gives it. Set here rather than with ``attrs.evolve`` after
            loading, which opens a second session (a second copy of the weights in memory while both live). A
            compiled package (``AotiProgram``) runs on the threads it was compiled for: another number is
            refused. A ``torch.export`` program runs on torch's own (``torch.set_num_threads``).

    Raises:
        FileNotFoundError: no ``hfx.json`` in ``directory``.
        ValueError: the manifest was written by a newer hfx schema, names a file outside ``directory``, or its
            specs name a class hfx does not resolve from a file, or (without ``trust``) a ``.pt2`` holds pickled
            parts or a component is a compiled package; the message names the manifest and the entry; or
            ``threads`` is not a positive int, or not the threads a compiled package was made for.
    """
    if threads is not None:
        check_threads("load", threads)
    path = Path(directory)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        msg = f"load: {path} has no {MANIFEST}; it was not written by hfx.save"
        raise FileNotFoundError(msg)
    manifest = _read_manifest(manifest_path)
    if manifest.get("schema_version", 0) > SCHEMA_VERSION:
        msg = f"load: {path} uses manifest schema {manifest['schema_version']}; this hfx reads up to {SCHEMA_VERSION}. Upgrade hfx."
        raise ValueError(msg)
    programs = {name: _load_component(path, name, entry, trust=trust, threads=threads)
                for name, entry in manifest["components"].items()}
    if manifest.get("single") and len(programs) == 1:
        return next(iter(programs.values()))
    processor = load_processor(_inside(path, manifest["processor"], "processor")) if manifest.get("processor") else None
    return Components(items=programs, meta=GenerationMeta.from_json(manifest.get("meta", {})), processor=processor)


def _load_component(path: Path, name: str, entry: Mapping[str, Any], *, trust: bool, threads: int | None) -> Any:
    """One component of the manifest in ``path``: its files checked to lie inside ``path``, its specs to name only
    classes hfx resolves from a file (``hfx._pytree``), then loaded by its runtime."""
    from hfx._contract import load_spec

    for file in entry.get("files", ()):
        _inside(path, file, f"component {name!r}")
    io = IoSpec.from_json(entry["io"])
    try:
        for spec in (io.in_spec, io.out_spec):
            load_spec(spec)
    except ValueError as exc:
        msg = f"load: {path / MANIFEST}: component {name!r}: {exc}"
        raise ValueError(msg) from exc
    module = _runtime_module(entry["record"])
    try:
        pickled = [] if trust else getattr(module, "unpickled_members", lambda *_: [])(entry, path)
        native = [] if trust else getattr(module, "native_members", lambda *_: [])(entry, path)
        if not pickled and not native:
            return module.load_files(entry, path, name=name, io=io, threads=threads)
    except HfxError:  # hfx's own errors already say what failed (a device that cannot compile the model ...)
        raise
    except (OSError, RuntimeError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # unreadable files
        files = ", ".join(entry.get("files", ())) or "its files"
        msg = (f"load: {path / MANIFEST}: component {name!r} could not be read from {files}: "
               f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. The files are truncated or "
               "changed since hfx.save wrote them: copy the export again or save it again")
        raise ValueError(msg) from exc
    what = (f"is a compiled package: loading it runs its native code ({_shown(native)})" if native else
            f"holds pickled parts ({_shown(pickled)}), which hfx.save never writes, and unpickling can run any code")
    msg = (f"load: {path / MANIFEST}: component {name!r}: {entry['files'][0]} {what}. Pass trust=True (CLI: --trust) "
           "only if you trust where the export came from")
    raise ValueError(msg)


def _shown(members: list[str]) -> str:
    """The first three of ``members``, for a message."""
    return ", ".join(members[:3]) + (" ..." if len(members) > 3 else "")


def _read_manifest(manifest_path: Path) -> dict[str, Any]:
    """The manifest's JSON, checked to be an hfx manifest (an object with ``components``)."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"load: {manifest_path} is not valid JSON ({exc}); it is truncated or not hfx's: save the export again"
        raise ValueError(msg) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("components"), dict):
        msg = f"load: {manifest_path} has no 'components'; it is another tool's hfx.json, not one hfx.save wrote"
        raise ValueError(msg)
    return manifest


def _inside(directory: Path, file: Any, what: str) -> Path:
    """``directory / file``, refused unless ``file`` is a relative path that stays inside ``directory``."""
    inside = isinstance(file, str) and bool(file) and not Path(file).is_absolute() and ".." not in Path(file).parts
    if not inside:
        msg = (f"load: {directory / MANIFEST}: {what} names the file {file!r}, outside the export's directory; "
               "hfx.save writes only files inside it, so the manifest was not written by hfx or was changed")
        raise ValueError(msg)
    return directory / file


def load_processor(path: Path) -> Any:
    """The processor saved with the programs: a multimodal processor, else a tokenizer."""
    import transformers

    try:
        return transformers.AutoProcessor.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError):
        return transformers.AutoTokenizer.from_pretrained(path)
