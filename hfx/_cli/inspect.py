"""``hfx inspect DIR``: what a saved export holds, read from its manifest and files (nothing is exported or run)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from hfx._cli.common import EXIT_OK, megabytes, read_manifest, saved_exports, table
from hfx._records import GenerationMeta

# Manifest keys of a component entry that describe how it runs rather than what it is.
_RUNTIME_DETAILS = ("opset", "device", "source_class")
# Generation settings worth showing (the manifest keeps the whole generation config).
_GENERATION_KEYS = ("eos_token_id", "pad_token_id", "bos_token_id", "cache_implementation", "max_cache_len")


def run_inspect(args: argparse.Namespace, stream: IO[str]) -> int:
    """Print what ``args.dir`` holds, as tables or (``--json``) as JSON."""
    del stream
    described = {runtime: describe(path) for runtime, path in saved_exports(Path(args.dir)).items()}
    print(json.dumps(described, indent=2) if args.json else "\n\n".join(map(_as_text, described.values())))
    return EXIT_OK


def describe(directory: Path) -> dict[str, Any]:
    """A JSON-ready description of the export saved in ``directory``.

    Returns:
        ``path``, ``hfx_version``, ``versions`` (the packages it was made with),
        ``generation`` (model class, encoder-decoder, cache input, key generation
        settings; empty for a single graph), ``processor`` and, per component:
        ``runtime``, ``files`` (name -> bytes, ``None`` when missing), ``size``,
        ``inputs``/``outputs`` (name, dtype, shape with named dynamic axes),
        ``dynamic_axes`` (name -> ``[min, max]``, ``max`` ``None`` when unbounded),
        ``constants``, ``updates`` (inputs written in place) and runtime details.
    """
    manifest = read_manifest(directory)
    return {
        "path": str(directory),
        "hfx_version": manifest.get("hfx_version"),
        "versions": manifest.get("versions", {}),
        "generation": _generation(GenerationMeta.from_json(manifest.get("meta", {}))),
        "processor": manifest.get("processor"),
        "components": {name: _component(directory, entry) for name, entry in manifest["components"].items()},
    }


def _component(directory: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    io = entry["io"]
    files = {f: (directory / f).stat().st_size if (directory / f).is_file() else None for f in entry.get("files", ())}
    used = {dim for spec in (*io["inputs"], *io["outputs"]) for dim in spec["shape"] if isinstance(dim, str)}
    return {
        "runtime": entry["runtime"],
        "files": files,
        "size": sum(size or 0 for size in files.values()),
        "inputs": io["inputs"],
        "outputs": io["outputs"],
        "dynamic_axes": {name: bounds for name, bounds in io.get("bounds", {}).items() if name in used},
        "constants": io.get("constants", {}),
        "updates": io.get("updates", []),
        **{key: entry[key] for key in _RUNTIME_DETAILS if entry.get(key)},
    }


def _generation(meta: GenerationMeta) -> dict[str, Any]:
    settings = meta.generation.config
    if not settings:
        return {}
    return {
        "model_class": meta.model.class_name,
        "is_encoder_decoder": meta.generation.is_encoder_decoder,
        "cache_input": meta.roles.cache_input,
        **{key: settings[key] for key in _GENERATION_KEYS if settings.get(key) is not None},
    }


def _as_text(described: Mapping[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in described["versions"].items())
    lines = [f"{described['path']}: {len(described['components'])} component(s), hfx {described['hfx_version']}",
             f"  made with: {versions}"]
    if described["generation"]:
        lines.append("  generation: " + ", ".join(f"{k} {v}" for k, v in described["generation"].items()))
    if described["processor"]:
        lines.append(f"  tokenizer/processor: {described['processor']}/")
    for name, component in described["components"].items():
        lines += ["", *_component_text(name, component)]
    return "\n".join(lines)


def _component_text(name: str, component: Mapping[str, Any]) -> list[str]:
    details = "".join(f", {key} {component[key]}" for key in _RUNTIME_DETAILS if key in component)
    files = ", ".join(f"{f} {megabytes(size) if size is not None else 'MISSING'}" for f, size in component["files"].items())
    lines = [f"component {name!r} ({component['runtime']}{details}): {megabytes(component['size'])} in {files}"]
    axes = ", ".join(f"{dim} in [{low}, {'inf)' if high is None else f'{high}]'}" for dim, (low, high) in component["dynamic_axes"].items())
    lines.append(f"  dynamic axes: {axes or 'none (static shapes)'}")
    if component["constants"]:
        lines.append("  constants: " + ", ".join(f"{k}={v!r}" for k, v in component["constants"].items()))
    if component["updates"]:
        lines.append("  written in place (static cache): " + ", ".join(component["updates"]))
    rows = [[kind, spec["name"], spec["dtype"], "[" + ", ".join(map(str, spec["shape"])) + "]"]
            for kind in ("inputs", "outputs") for spec in component[kind]]
    lines += ["  " + line for line in table(["", "name", "dtype", "shape"], [[k[:-1], *rest] for k, *rest in rows]).splitlines()]
    return lines
