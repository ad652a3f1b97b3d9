"""Render ``benchmarks/results/coverage.json`` as ``docs/coverage.md``: hfx and the peer side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._coverage_cells import KINDS, RUNTIMES, TOOLS
from hfx import zoo

_KIND_LABEL = {"forward": "fwd", "generation": "gen"}
_NOT_RUN = "·"
_NOT_APPLICABLE = "—"


def _applicable(arch: str, kind: str) -> bool:
    return kind == "forward" or zoo.entry(arch).generative


def cell_text(result: dict[str, Any] | None) -> str:
    """``✓ 3.1s 2e-07`` / ``✗ reason`` / ``n/a reason`` / ``·`` (not run yet), safe inside a table."""
    if result is None:
        return _NOT_RUN
    seconds = f" {result['export_s']:.1f}s" if "export_s" in result else ""
    if result["status"] == "pass":
        diff = f" {result['max_diff']:.0e}" if "max_diff" in result else ""
        return f"✓{seconds}{diff}"
    mark = "✗" if result["status"] == "fail" else "n/a"
    return f"{mark}{seconds} {result.get('reason', '')}".replace("|", "\\|").replace("\n", " ")


def _header(title: str) -> list[str]:
    columns = [f"{runtime} {_KIND_LABEL[kind]}" for runtime in RUNTIMES for kind in KINDS]
    return [f"| {title} | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]


def tool_table(cells: dict[str, Any], tool: str) -> list[str]:
    """One row per architecture, one column per runtime x kind, for ``tool``."""
    rows = _header(f"{tool} (family / arch)")
    for name, spec in zoo.ENTRIES.items():
        texts = [
            cell_text(cells.get(f"{name},{runtime},{kind},{tool}")) if _applicable(name, kind) else _NOT_APPLICABLE
            for runtime in RUNTIMES
            for kind in KINDS
        ]
        rows.append(f"| {spec.family} / {name} | " + " | ".join(texts) + " |")
    return rows


def _mark(result: dict[str, Any] | None) -> str:
    if result is None:
        return _NOT_RUN
    return {"pass": "✓", "fail": "✗"}.get(result["status"], "n/a")


def side_by_side(cells: dict[str, Any]) -> list[str]:
    """hfx / peer marks in one table, so the two tools' columns sit next to each other."""
    rows = _header("arch (hfx / peer)")
    for name in zoo.ENTRIES:
        marks = [
            " / ".join(_mark(cells.get(f"{name},{runtime},{kind},{tool}")) for tool in TOOLS)
            if _applicable(name, kind) else _NOT_APPLICABLE
            for runtime in RUNTIMES
            for kind in KINDS
        ]
        rows.append(f"| {name} | " + " | ".join(marks) + " |")
    return rows


def column_versions(cells: dict[str, Any]) -> list[str]:
    """Which torch and transformers releases each column's cells ran on (each cell records its own)."""
    rows = ["| column | " + " | ".join(TOOLS) + " |", "|---|" + "---|" * len(TOOLS)]
    for runtime in RUNTIMES:
        for kind in KINDS:
            seen = []
            for tool in TOOLS:
                found: dict[str, int] = {}
                for key, result in cells.items():
                    if key.endswith(f",{runtime},{kind},{tool}"):
                        versions = result.get("versions", "not recorded")
                        found[versions] = found.get(versions, 0) + 1
                seen.append("; ".join(f"{v} ({n})" for v, n in sorted(found.items())) or "-")
            rows.append(f"| {runtime} {_KIND_LABEL[kind]} | " + " | ".join(seen) + " |")
    return rows


def _keys(tool: str) -> list[str]:
    return [f"{name},{runtime},{kind},{tool}" for name in zoo.ENTRIES for kind in KINDS for runtime in RUNTIMES
            if _applicable(name, kind)]


def counts(cells: dict[str, Any], tool: str) -> dict[str, int]:
    """Cells of ``tool`` by status, plus ``not run`` and ``total`` (applicable cells)."""
    keys = _keys(tool)
    statuses = [cells[key]["status"] if key in cells else "not run" for key in keys]
    return {status: statuses.count(status) for status in ("pass", "fail", "n/a", "not run")} | {"total": len(keys)}


def goal_checks(cells: dict[str, Any]) -> list[str]:
    """The issue's goals: every cell the peer passes, hfx passes; 95% of all hfx cells pass."""
    regressions = [
        key.removesuffix(",hfx") for key in _keys("hfx")
        if cells.get(key.removesuffix("hfx") + "peer", {}).get("status") == "pass"
        and cells.get(key, {}).get("status") != "pass"
    ]
    hfx = counts(cells, "hfx")
    share = 100.0 * hfx["pass"] / hfx["total"] if hfx["total"] else 0.0
    lines = [f"* hfx passes **{hfx['pass']} / {hfx['total']}** applicable cells ({share:.1f}%; goal 95%), "
             f"{hfx['fail']} fail, {hfx['not run']} not run yet."]
    lines.append(f"* Cells the peer passes and hfx does not: **{len(regressions)}**"
                 + (": " + ", ".join(f"`{key}`" for key in regressions) if regressions else "."))
    return lines


def slowest(cells: dict[str, Any], top: int = 10) -> list[str]:
    """The ``top`` cells with the longest wall time."""
    ordered = sorted(cells.items(), key=lambda item: -item[1].get("wall_s", 0.0))[:top]
    return [f"* `{key}` {result.get('wall_s', 0):.0f} s ({result['status']})" for key, result in ordered]


def other_end(name: str, results: dict[str, Any]) -> list[str]:
    """hfx's pass / fail / not-run counts per column on another end of the window, and the cells that fail there."""
    cells = results["cells"]
    releases = sorted({r.get("versions", "not recorded") for r in cells.values()}) or ["nothing run yet"]
    rows = [f"### {'; '.join(releases)} (`benchmarks/results/{name}`)", "",
            "| column | pass | fail | not run |", "|---|---|---|---|"]
    failing = []
    for runtime in RUNTIMES:
        for kind in KINDS:
            keys = [f"{arch},{runtime},{kind},hfx" for arch in zoo.ENTRIES if _applicable(arch, kind)]
            status = [cells.get(key, {}).get("status") for key in keys]
            failing += [f"* `{key}`: {cells[key].get('reason', '')[:200]}" for key in keys
                        if cells.get(key, {}).get("status") == "fail"]
            rows.append(f"| {runtime} {_KIND_LABEL[kind]} | {status.count('pass')} | {status.count('fail')} | "
                        f"{status.count(None)} |")
    return [*rows, "", *(failing or ["No cell fails."]), ""]


def render(results: dict[str, Any], others: dict[str, dict[str, Any]] | None = None) -> str:
    """The whole markdown page; ``others``: the results on other ends of the window, by file name."""
    ends = [line for name, other in (others or {}).items() for line in other_end(name, other)]
    cells = results["cells"]
    last = results["runs"][-1] if results["runs"] else {}
    versions = ", ".join(f"{k} {v}" for k, v in last.get("machine", {}).get("versions", {}).items())
    summary = [f"| {tool} | " + " | ".join(str(v) for v in counts(cells, tool).values()) + " |" for tool in TOOLS]
    lines = [
        "# Coverage: the hfx zoo on every runtime, next to transformers.exporters",
        "",
        "Generated by `benchmarks/coverage.py` from `benchmarks/results/coverage.json`; do not edit by hand.",
        "Forward: export at batch 2 x sequence 7, compare with eager at batch 3 x sequence 11 (atol 1e-4",
        "+ 5e-5 x the output's largest magnitude, as `hfx.verify(rtol=)`: float32 rounding grows with it;",
        "image size 32 → 48 px for the models marked as taking any size). Generation: decompose + export + lower,",
        "`hfx.generate` must return eager `generate`'s greedy tokens (8 new tokens, batch 2, left padding).",
        "The peer (`transformers.exporters`) is run the way its docs show (`export(model, inputs, Config(dynamic=True))`);",
        "it has no loop that generates with its exported graphs, so its generation cells record what",
        "`export_for_generation` exports, as `n/a`. Its OpenVINO programs compile on `AUTO`, which on this CPU",
        "(avx512_bf16) runs at `INFERENCE_PRECISION_HINT` bfloat16 although the peer records f32 in the model's",
        "runtime options (checked on its compiled model: BERT pooler 1.1e-3 from eager, Llama logits 0.26, also",
        "at the capture shape); hfx compiles with f32. The peer's OpenVINO parity failures are measured at that precision.",
        "",
        f"Cells: `✓ export-seconds max-diff`, `✗ reason`, `{_NOT_APPLICABLE}` not applicable (no `generate`), "
        f"`{_NOT_RUN}` not run yet.",
        "",
        f"Machine: {last.get('machine', {}).get('platform', '?')}, {last.get('machine', {}).get('cpus', '?')} CPUs "
        "(shared), one thread per cell. Versions of the last run: " + (versions or "?") + ".",
        "",
        "Releases each column was measured on (cells per release):",
        "",
        *column_versions(cells),
        "",
        "Commands run: " + "; ".join(f"`{run['command']}` ({run['started']})" for run in results["runs"]) + ".",
        "",
        "## Goals",
        "",
        *goal_checks(cells),
        "",
        "| tool | pass | fail | n/a | not run | total |",
        "|---|---|---|---|---|---|",
        *summary,
        "",
        *(["## hfx on the ends of the tested window", "",
            "The same hfx cells, each run in a venv with one end's releases (`--end oldest`, `--end newest`; the",
            "tables above are the releases their columns name); columns marked not run are still to run.", "",
            *ends] if ends else []),
        "## Side by side (hfx / peer)",
        "",
        *side_by_side(cells),
        "",
        *[line for tool in TOOLS for line in (f"## {tool}", "", *tool_table(cells, tool), "")],
        "## Slowest cells (wall seconds, including model build and checks)",
        "",
        *slowest(cells),
        "",
    ]
    return "\n".join(lines)


def write_report(results: dict[str, Any], path: Path, others: dict[str, dict[str, Any]] | None = None) -> None:
    """Write ``render(results, others)`` to ``path`` through a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".md.tmp")
    staging.write_text(render(results, others))
    staging.replace(path)
