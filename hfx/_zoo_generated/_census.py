"""The census (does a generated type build small and run eagerly?) and CI's rotating sample of it."""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hfx._errors import reason_of
from hfx._zoo_generated._inputs import forward_inputs
from hfx._zoo_generated._shrink import task_config
from hfx._zoo_generated._tasks import TASKS, model_class


CENSUS_SHAPES = ((2, 7), (3, 11))  # (batch, sequence): the coverage cells' capture and check shapes
MAX_PARAMETERS = 5_000_000


def _first_tensor(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, Mapping):
        values = list(outputs.values())
    else:
        values = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
        if isinstance(value, (tuple, list, Mapping)) and (found := _first_tensor(value)) is not None:
            return found
    return None


def census(name: str, /) -> dict[str, Any]:
    """Whether generated entry ``name`` builds small and runs eagerly at both census shapes, and why not.

    Steps: the tiny config builds; the model (counted on the meta device first) has at most ``MAX_PARAMETERS``
    parameters and builds; its inputs build; the eager forward runs at (batch 2, sequence 7) and (3, 11) and gives
    finite floats. A failure stops at its step.

    Returns:
        ``{"status": "ok" | "config" | "build" | "inputs" | "eager", "reason": ..., "parameters": ...,
        "inputs": [input names], "seconds": ...}`` (``reason`` only when not ok).

    Example:
        >>> census("causal-lm:llama")["status"]
        'ok'
    """
    start = time.perf_counter()
    result: dict[str, Any] = {"status": "config"}
    try:
        config = task_config(name)
        result["status"] = "build"
        cls = model_class(name)
        with torch.device("meta"):
            parameters = sum(p.numel() for p in cls(config).parameters())
        result["parameters"] = parameters
        if parameters > MAX_PARAMETERS:
            msg = f"{parameters} parameters: a size the shrinker does not reach"
            raise ValueError(msg)
        torch.manual_seed(0)
        model = cls(config).eval()
        for batch, sequence in CENSUS_SHAPES:
            result["status"] = "inputs"
            values = forward_inputs(name, config, batch, sequence)
            result["inputs"] = sorted(values)  # what the forward ran with (an image-text type may take text only)
            result["status"] = "eager"
            with torch.no_grad():
                first = _first_tensor(model(**values))
            if first is not None and not torch.isfinite(first).all():
                msg = f"non-finite output at batch {batch}, sequence {sequence}"
                raise FloatingPointError(msg)
        result["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the census records any failure as data
        result["reason"] = reason_of(exc, limit=200)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


CENSUS_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "zoo-census.json"


def runnable(census_results: Mapping[str, Mapping[str, Any]], task_name: str, /) -> tuple[str, ...]:
    """The names of ``task_name`` whose census is ok, sorted."""
    return tuple(sorted(name for name, result in census_results.items()
                        if name.startswith(f"{task_name}:") and result.get("status") == "ok"))


def sample(seed: int, /, *, census_results: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One eager-runnable generated entry per task, rotating with ``seed``: what CI runs for that seed.

    Over consecutive seeds each task walks through all of its runnable types (sorted), from a start that differs
    between tasks. Tasks with no runnable type are left out.

    Args:
        seed: any integer; the same seed gives the same sample.
        census_results: ``{name: census(name)}``; by default the stored census
            (``benchmarks/results/zoo-census.json``, written by ``benchmarks/coverage.py --census``).

    Returns:
        Entry names, in task order.

    Raises:
        FileNotFoundError: no census given and none stored.

    Example:
        >>> census_results = {"ctc:hubert": {"status": "ok"}, "ctc:sew": {"status": "ok"}}
        >>> sample(0, census_results=census_results), sample(1, census_results=census_results)
        (['ctc:sew'], ['ctc:hubert'])
    """
    if census_results is None:
        import json

        census_results = json.loads(CENSUS_PATH.read_text())["types"]
    chosen = []
    for spec in TASKS:
        found = runnable(census_results, spec.name)
        if found:
            chosen.append(found[(seed + zlib.crc32(spec.name.encode())) % len(found)])
    return chosen
