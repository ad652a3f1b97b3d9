"""Coverage of the hfx zoo on every runtime, side by side with the peer (transformers.exporters).

    python benchmarks/coverage.py [--only llama,gemma2] [--runtimes torch,onnx,pte,ov] [--kinds forward,generation]
                                  [--tools hfx,peer] [--jobs 1] [--timeout 600] [--force | --failed]
    python benchmarks/coverage.py --report          # only rewrite docs/coverage.md from the JSON
    python benchmarks/coverage.py --end newest ...  # in the newest end's venv: its own JSON and section
    python benchmarks/coverage.py --cell gemma2,onnx,forward,hfx   # one cell, printed as JSON
    python benchmarks/coverage.py --census [--tasks causal-lm,ctc] [--force]   # the generated zoo's census
    python benchmarks/coverage.py --zoo generated [--tasks causal-lm,...] [--shard K/N] [--sample SEED] ...
    python benchmarks/coverage.py --zoo generated --sample SEED --tools hfx --kinds forward --check  # CI's check

Each cell (architecture x runtime x {forward, generation} x {hfx, peer}) runs in its own subprocess with a
timeout. Results accumulate in ``benchmarks/results/coverage.json`` (a cell already there is skipped unless
``--force``), so a run can be stopped, resumed and filtered; ``docs/coverage.md`` is rewritten after every cell.

``--zoo generated`` runs the generated zoo (``hfx._zoo_generated``: a tiny config for every model type of
transformers' auto mappings, per task) instead of the hand-made one: its results go to
``benchmarks/results/coverage-generated.json`` and their own section of the report. Only types whose census passed
run; ``--census`` writes the census (``benchmarks/results/zoo-census.json``: each type's tiny config builds and its
eager forward runs at both shapes), each type in a worker subprocess with a timeout. ``--shard K/N`` runs the K-th
of N deterministic parts of the planned cells; ``--sample SEED`` only the types ``hfx._zoo_generated.sample`` picks.

Forward: export at batch 2 x sequence 7, compare with eager at batch 3 x sequence 11 (atol 1e-4 + 5e-5 x the output's
largest magnitude). Generation:
``decompose`` + export + lower, then ``hfx.generate`` must give eager ``generate``'s greedy tokens (8 new tokens,
batch 2, left padding). The peer has no generation loop over its graphs; its generation cells record whether
``export_for_generation`` exports, as ``n/a``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _coverage_cells as cells  # noqa: E402
from benchmarks._coverage_report import write_report  # noqa: E402
from hfx import zoo  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "coverage.json"
GENERATED = RESULTS.with_name("coverage-generated.json")
CENSUS = ROOT / "benchmarks" / "results" / "zoo-census.json"
REPORT = ROOT / "docs" / "coverage.md"


def other_ends(main: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """``{file name: results}`` of the runs on other releases of the window (``coverage-<end>.json`` beside ``main``)."""
    return {path.name: load_results(path) for path in sorted(main.parent.glob("coverage-*.json")) if path != GENERATED}


def _write_report() -> None:
    """Rewrite docs/coverage.md from every results file (the hand-made zoo, the other ends, the generated zoo)."""
    write_report(load_results(), REPORT, other_ends(), generated=load_results(GENERATED), census=load_census())


def cell_key(arch: str, runtime: str, kind: str, tool: str) -> str:
    """The JSON key of one cell."""
    return f"{arch},{runtime},{kind},{tool}"


def shard(keys: list[str], spec: str | None) -> list[str]:
    """The ``K``-th of ``N`` parts of ``keys`` for ``spec`` ``"K/N"`` (1-based): every N-th key, so parts take alike.

    Example:
        >>> shard(["a", "b", "c", "d", "e"], "2/2")
        ['b', 'd']
    """
    if not spec:
        return keys
    part, _, parts = spec.partition("/")
    if not (part.isdigit() and parts.isdigit() and 1 <= int(part) <= int(parts)):
        msg = f"--shard takes K/N with 1 <= K <= N, got {spec!r}"
        raise ValueError(msg)
    return keys[int(part) - 1 :: int(parts)]


def planned_cells(archs: list[str], runtimes: list[str], kinds: list[str], tools: list[str]) -> list[str]:
    """Every applicable cell, hfx before peer, forward before generation (no generation for non-generative archs)."""
    return [
        cell_key(arch, runtime, kind, tool)
        for tool in tools
        for kind in kinds
        for arch in archs
        for runtime in runtimes
        if kind == "forward" or zoo.entry(arch).generative
    ]


def beside_failures(keys: list[str], recorded: dict[str, Any]) -> list[str]:
    """The peer's cells of ``keys`` whose hfx cell fails in ``recorded``: where the peer passing would be a cell
    "the peer passes and hfx does not".

    Example:
        >>> beside_failures(["a,onnx,forward,peer", "b,onnx,forward,peer", "a,onnx,forward,hfx"],
        ...                 {"a,onnx,forward,hfx": {"status": "fail"}, "b,onnx,forward,hfx": {"status": "pass"}})
        ['a,onnx,forward,peer']
    """
    return [key for key in keys if key.endswith(",peer")
            and recorded.get(key.removesuffix(",peer") + ",hfx", {}).get("status") == "fail"]


def load_results(path: Path = RESULTS) -> dict[str, Any]:
    """The accumulated results, or an empty record."""
    if path.exists():
        return json.loads(path.read_text())
    return {"cells": {}, "runs": []}


def save_results(results: dict[str, Any], path: Path = RESULTS) -> None:
    """Write the results through a temporary file, so an interrupted run never leaves half a JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)
    os.replace(handle.name, path)


def run_in_subprocess(key: str, timeout: float) -> dict[str, Any]:
    """Run one cell in a fresh interpreter; a timeout or a crash becomes a ``fail`` with that reason."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cell", key]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "fail", "reason": f"timeout after {timeout:g} s", "wall_s": round(timeout, 1)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
    return {"status": "fail", "reason": f"crash (exit {done.returncode}): {tail}",
            "wall_s": round(time.perf_counter() - start, 1)}


def machine() -> dict[str, Any]:
    """The machine and package versions a run used."""
    import importlib.metadata as md

    versions = {}
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch", "openvino"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = "not installed"
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "versions": versions}


def window_versions() -> str:
    """The torch and transformers releases of this interpreter (the cells' children run it): the window's axes."""
    import importlib.metadata as md

    return f"torch {md.version('torch')}, transformers {md.version('transformers')}"


@contextlib.contextmanager
def _locked_results(path: Path = RESULTS) -> Iterator[dict[str, Any]]:
    """The results under an exclusive lock, saved on exit: runs started side by side never drop each other's cells."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_suffix(".lock"), "w") as lock:  # one lock: every file feeds the one report
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load_results(path)
        yield results
        save_results(results, path)
        _write_report()


def run(keys: list[str], *, jobs: int, timeout: float, path: Path = RESULTS) -> None:
    """Run ``keys`` (``jobs`` at a time), saving the JSON at ``path`` and rewriting the report after each cell."""
    with _locked_results(path) as results:
        results["runs"].append({"command": " ".join(["python", "benchmarks/coverage.py", *sys.argv[1:]]),
                                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine()})
    versions = window_versions()  # the same for every cell of a run
    for key, outcome in _outcomes(keys, jobs=jobs, timeout=timeout):
        with _locked_results(path) as results:
            results["cells"][key] = {**outcome, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                                     "versions": versions}
        print(f"{key:<40} {outcome['status']:<5} {outcome.get('wall_s', '')}s {outcome.get('reason', '')}",
              flush=True)


def _outcomes(keys: list[str], *, jobs: int, timeout: float) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, outcome)`` of each cell of ``keys`` as it finishes, ``jobs`` subprocesses at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_in_subprocess, key, timeout): key for key in keys}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()


def check(keys: list[str], *, jobs: int, timeout: float, recorded: dict[str, Any]) -> list[str]:
    """Run ``keys`` without saving anything; return those that pass in ``recorded`` and fail now.

    CI's regression check over a sample: each cell is printed with the status it has on record (``-`` for none).
    """
    regressions = []
    for key, outcome in _outcomes(keys, jobs=jobs, timeout=timeout):
        before = recorded.get(key, {}).get("status", "-")
        print(f"{key:<48} {outcome['status']:<5} (on record: {before:<4}) {outcome.get('wall_s', '')}s "
              f"{outcome.get('reason', '')}", flush=True)
        if before == "pass" and outcome["status"] != "pass":
            regressions.append(key)
    return sorted(regressions)


def load_census(path: Path = CENSUS) -> dict[str, Any]:
    """The stored census of the generated zoo, or an empty one."""
    if path.exists():
        return json.loads(path.read_text())
    return {"types": {}, "runs": []}


def census_worker(names: list[str], timeout: float) -> None:
    """Census each of ``names`` in this process, one JSON line each; a type past ``timeout`` seconds is stopped."""
    from hfx import _zoo_generated as generated

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError(f"census took over {timeout:g} s")

    signal.signal(signal.SIGALRM, stop)
    for name in names:
        signal.alarm(max(1, int(timeout)))
        try:
            result = generated.census(name)
        finally:
            signal.alarm(0)
        print(json.dumps({name: result}), flush=True)


def _census_batch(batch: list[str], timeout: float) -> tuple[dict[str, Any], str]:
    """Run one worker over ``batch``; its answers, and why it stopped early (when it did).

    A type that takes over ``timeout`` (+ 30 s of start-up) without an answer, in Python or stuck in native code,
    gets the worker killed, so that one hang costs one timeout.
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--census-worker", ",".join(batch),
               "--timeout", str(timeout)]
    got: dict[str, Any] = {}
    lines: queue.Queue[str | None] = queue.Queue()
    errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty worker never blocks on a full pipe
    with errors, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT) as worker:
        def read() -> None:
            for line in worker.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        while len(got) < len(batch):
            try:
                line = lines.get(timeout=timeout + 30)
            except queue.Empty:
                worker.kill()
                return got, f"hang: no answer within {timeout:g} s"
            if line is None:
                break
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    got.update(json.loads(line))
        worker.wait()
        errors.seek(0)
        tail = (errors.read().strip().splitlines() or ["no output"])[-1][:160]
    return got, f"crash (exit {worker.returncode}): {tail}"


def run_census(names: list[str], *, timeout: float, chunk: int = 20) -> dict[str, Any]:
    """Census ``names`` in worker subprocesses of ``chunk`` types; a crash or hang marks its type and the rest go on.

    The census is saved (atomically) after every worker, so a stopped run resumes where it was.
    """
    census = load_census()
    census["runs"].append({"command": " ".join(["python", "benchmarks/coverage.py", *sys.argv[1:]]),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": window_versions(),
                           "types": len(names)})
    todo = list(names)
    start = time.perf_counter()
    while todo:
        batch, todo = todo[:chunk], todo[chunk:]
        got, why = _census_batch(batch, timeout)
        census["types"].update(got)
        missing = [name for name in batch if name not in got]
        if missing:  # the first type without an answer stopped the worker; the others run again
            census["types"][missing[0]] = {"status": "crash", "reason": why}
            todo = missing[1:] + todo
        census["runs"][-1]["elapsed_s"] = round(time.perf_counter() - start, 1)
        save_results(census, CENSUS)
        print(f"census: {len(names) - len(todo)} / {len(names)}", flush=True)
    return census


def census_counts(census: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``{task: {status: count}}`` of a census."""
    counts: dict[str, dict[str, int]] = {}
    for name, result in census["types"].items():
        task = counts.setdefault(name.partition(":")[0], {})
        task[result["status"]] = task.get(result["status"], 0) + 1
    return counts


def _names(value: str | None, default: tuple[str, ...]) -> list[str]:
    return list(default) if not value else value.split(",")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", help="run one cell arch,runtime,kind,tool in this process and print its JSON")
    parser.add_argument("--only", help="comma-separated architectures (default: the whole zoo); generated zoo: "
                                        "task:type names (causal-lm:qwen3_next)")
    parser.add_argument("--runtimes", help=f"comma-separated, from {','.join(cells.RUNTIMES)}")
    parser.add_argument("--kinds", help=f"comma-separated, from {','.join(cells.KINDS)}")
    parser.add_argument("--tools", help=f"comma-separated, from {','.join(cells.TOOLS)}")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at the same time")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    parser.add_argument("--force", action="store_true", help="rerun cells that already have a result")
    parser.add_argument("--failed", action="store_true", help="rerun the cells whose result is a failure")
    parser.add_argument("--report", action="store_true", help="only rewrite docs/coverage.md from the JSON")
    parser.add_argument("--end", help="another end of the tested window (e.g. newest): results go to "
                                      "benchmarks/results/coverage-<end>.json, shown in their own section")
    parser.add_argument("--zoo", choices=("hand", "generated"), default="hand",
                        help="the hand-made zoo (default) or the generated one (every type of the auto mappings)")
    parser.add_argument("--tasks", help="generated zoo: comma-separated tasks (default: all)")
    parser.add_argument("--shard", help="K/N: run only the K-th of N parts of the planned cells")
    parser.add_argument("--sample", type=int, help="generated zoo: only the types sample(SEED) picks")
    parser.add_argument("--census", action="store_true", help="run the generated zoo's census (--tasks, --force)")
    parser.add_argument("--beside-failures", action="store_true",
                        help="only the peer's cells beside hfx cells that fail on record (with --tools peer): "
                             "does the peer pass where hfx does not")
    parser.add_argument("--check", action="store_true",
                        help="run the planned cells without saving; exit 1 if a cell that passes on record fails")
    parser.add_argument("--census-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cell:
        print(json.dumps(cells.run_cell(*args.cell.split(","))), flush=True)
        return
    if args.census_worker:
        census_worker(args.census_worker.split(","), args.timeout)
        return
    if args.report:
        _write_report()
        return
    if args.census or args.zoo == "generated":
        from hfx import _zoo_generated as generated

        tasks = tuple(_names(args.tasks, tuple(t.name for t in generated.TASKS)))
        every = list(generated.names(tasks))
    if args.census:
        known = load_census()["types"]
        todo = [name for name in every if args.force or name not in known]
        print(f"census: {len(todo)} types to run ({len(every) - len(todo)} already done)", flush=True)
        census = run_census(todo, timeout=min(args.timeout, 120.0))
        for task, found in sorted(census_counts(census).items()):
            print(f"{task:<24} ok {found.get('ok', 0):>4} / {sum(found.values()):>4}  {found}", flush=True)
        _write_report()
        return
    if args.zoo == "generated":
        census = load_census()["types"]
        archs = [name for name in every if census.get(name, {}).get("status") == "ok"]
        if args.sample is not None:
            archs = [name for name in generated.sample(args.sample, census_results=census) if name in archs]
        if args.only:
            archs = [name for name in archs if name in args.only.split(",")]
        path = GENERATED
    else:
        archs = _names(args.only, tuple(zoo.ENTRIES))
        path = RESULTS.with_name(f"coverage-{args.end}.json") if args.end else RESULTS
    keys = shard(planned_cells(archs, _names(args.runtimes, cells.RUNTIMES), _names(args.kinds, cells.KINDS),
                               _names(args.tools, cells.TOOLS)), args.shard)
    done = load_results(path)["cells"]
    if args.beside_failures:
        keys = beside_failures(keys, done)
    if args.check:
        print(f"checking {len(keys)} cells against {path.relative_to(ROOT)}", flush=True)
        regressions = check(keys, jobs=args.jobs, timeout=args.timeout, recorded=done)
        if regressions:
            print(f"{len(regressions)} cell(s) pass on record and fail now: {', '.join(regressions)}", flush=True)
            sys.exit(1)
        return
    todo = [key for key in keys
            if args.force or key not in done or (args.failed and done[key].get("status") == "fail")]
    print(f"{len(todo)} cells to run ({len(keys) - len(todo)} already done)", flush=True)
    run(todo, jobs=args.jobs, timeout=args.timeout, path=path)


if __name__ == "__main__":
    main()
