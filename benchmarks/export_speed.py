"""Export time of hfx against the peer (transformers.exporters), side by side in one run.

    python benchmarks/export_speed.py [--models llama,bert,t5] [--runtimes torch,onnx,pte,ov]
                                      [--kinds forward,generation] [--repeats 1]

For each model and kind (``forward``: one graph; ``generation``: the prefill/decode split), every measurement runs
in a fresh interpreter (``--measure``), so both tools pay the same cold start (imports are done before the clock
starts; the first ``torch.export`` of the process is inside it for both). hfx exports once and lowers that one
program to each runtime; the peer exports from the model again for each runtime, as its API does. Rows print the
seconds to get each runtime's program and the ratio hfx / peer (below 1.0 is faster), then the time to get all the
asked runtimes (hfx: one export plus each lowering; peer: one export per runtime). hfx and peer runs alternate; the
median over ``--repeats`` is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER_CLASSES = {
    "torch": ("DynamoExporter", "DynamoConfig"),
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "pte": ("ExecutorchExporter", "ExecutorchConfig"),
    "ov": ("OpenVINOExporter", "OpenVINOConfig"),
}
CAPTURE = {"batch": 2, "sequence": 7}


def _inputs(model_name: str, kind: str) -> dict[str, Any]:
    from hfx import zoo

    return zoo.forward_inputs(model_name, **CAPTURE) if kind == "forward" else zoo.inputs(model_name, **CAPTURE)


def hfx_seconds(model_name: str, kind: str, runtimes: list[str]) -> dict[str, float]:
    """Seconds of hfx's one export (``"export"``) and of each runtime's lowering of that export."""
    import hfx
    from hfx import zoo

    model = zoo.build(model_name)
    inputs = _inputs(model_name, kind)
    start = time.perf_counter()
    captured = hfx.capture(inputs, model)
    exported = hfx.export(hfx.decompose(captured) if kind == "generation" else captured)
    seconds = {"export": time.perf_counter() - start}
    lowerings = {"onnx": hfx.lower_to_onnx, "pte": hfx.lower_to_pte, "ov": hfx.lower_to_ov}
    for runtime in runtimes:
        if runtime == "torch":
            continue
        start = time.perf_counter()
        lowerings[runtime](exported)
        seconds[runtime] = time.perf_counter() - start
    return seconds


def peer_seconds(model_name: str, kind: str, runtimes: list[str]) -> dict[str, float]:
    """Seconds of the peer's export to each runtime, each from the model (its API has no export-once-lower-many)."""
    import transformers.exporters as peer

    from hfx import zoo

    model = zoo.build(model_name)
    seconds = {}
    for runtime in runtimes:
        exporter_name, config_name = PEER_CLASSES[runtime]
        exporter, config = getattr(peer, exporter_name)(), getattr(peer, config_name)(dynamic=True)
        inputs = _inputs(model_name, kind)  # the peer casts its sample inputs in place: a fresh copy each time
        start = time.perf_counter()
        if kind == "generation":
            exporter.export_for_generation(model, inputs, config)
        else:
            exporter.export(model, inputs, config)
        seconds[runtime] = time.perf_counter() - start
    return seconds


def per_runtime(tool: str, seconds: dict[str, float], runtimes: list[str]) -> dict[str, float]:
    """Seconds to get each runtime's program, and ``"all"`` for every asked runtime."""
    if tool == "peer":
        return {**seconds, "all": sum(seconds.values())}
    got = {runtime: seconds["export"] + seconds.get(runtime, 0.0) for runtime in runtimes}
    return {**got, "all": sum(seconds.values())}


def measure_in_subprocess(tool: str, model_name: str, kind: str, runtimes: list[str]) -> dict[str, float]:
    """One measurement in a fresh interpreter; a failure becomes an empty dict and is printed."""
    from benchmarks._child import run_json

    got = run_json(__file__, ["--measure", tool, "--models", model_name, "--kinds", kind, "--runtimes", ",".join(runtimes)])
    if "error" in got:
        print(f"  {tool} {model_name} {kind} failed: {got['error'][:200]}", flush=True)
        return {}
    return per_runtime(tool, got, runtimes)


def _median(runs: list[dict[str, float]], key: str) -> float | None:
    values = [run[key] for run in runs if key in run]
    return statistics.median(values) if values else None


def _cell(value: float | None) -> str:
    return "fail" if value is None else f"{value:.1f}"


def report(model_name: str, kind: str, runtimes: list[str], hfx_runs: list[dict], peer_runs: list[dict]) -> None:
    """Print one table: seconds per runtime for hfx and peer, and the ratio."""
    print(f"\n{model_name} {kind}: seconds to a program (median of {len(hfx_runs)})")
    print(f"{'runtime':<8} {'hfx':>8} {'peer':>8} {'hfx/peer':>9}")
    for key in [*runtimes, "all"]:
        ours, theirs = _median(hfx_runs, key), _median(peer_runs, key)
        ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "-"
        print(f"{key:<8} {_cell(ours):>8} {_cell(theirs):>8} {ratio:>9}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,bert,t5")
    parser.add_argument("--runtimes", default="torch,onnx,pte,ov")
    parser.add_argument("--kinds", default="forward,generation")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--measure", choices=("hfx", "peer"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    runtimes = args.runtimes.split(",")

    if args.measure:
        import torch

        torch.set_num_threads(1)
        measure = hfx_seconds if args.measure == "hfx" else peer_seconds
        print(json.dumps(measure(args.models, args.kinds, runtimes)), flush=True)
        return

    from hfx import zoo

    print(f"runtimes {args.runtimes}; one torch thread per process; capture {CAPTURE}", flush=True)
    for model_name in args.models.split(","):
        for kind in args.kinds.split(","):
            if kind == "generation" and not zoo.entry(model_name).generative:
                continue
            hfx_runs, peer_runs = [], []
            for _ in range(args.repeats):
                hfx_runs.append(measure_in_subprocess("hfx", model_name, kind, runtimes))
                peer_runs.append(measure_in_subprocess("peer", model_name, kind, runtimes))
            report(model_name, kind, runtimes, hfx_runs, peer_runs)


if __name__ == "__main__":
    main()
