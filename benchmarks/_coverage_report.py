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


def generated_counts(cells: dict[str, Any], census: dict[str, Any], tool: str) -> list[str]:
    """``tool``'s passed / run cells per task x runtime column, over the types the census lets run."""
    from hfx import _zoo_generated as generated

    types = census.get("types", {})
    columns = [(runtime, kind) for runtime in RUNTIMES for kind in KINDS]
    rows = [f"| {tool}: task | runnable / types | " + " | ".join(f"{r} {_KIND_LABEL[k]}" for r, k in columns) + " |",
            "|" + "---|" * (len(columns) + 2)]
    for spec in generated.TASKS:
        names = sorted(n for n in types if n.startswith(f"{spec.name}:"))
        ok = [n for n in names if types[n].get("status") == "ok"]
        if not names:
            continue
        texts = []
        for runtime, kind in columns:
            ran = [r for r in (cells.get(f"{n},{runtime},{kind},{tool}") for n in ok) if r is not None]
            counted = [r for r in ran if r["status"] != "n/a"]  # n/a: no reference to compare with, not counted
            if kind == "generation" and not spec.generative:
                texts.append(_NOT_APPLICABLE)
            elif ran and not counted:
                texts.append("n/a")
            else:
                texts.append(f"{sum(r['status'] == 'pass' for r in counted)}/{len(counted)}" if counted else _NOT_RUN)
        rows.append(f"| {spec.name} | {len(ok)} / {len(names)} | " + " | ".join(texts) + " |")
    return rows


def census_exclusions(census: dict[str, Any]) -> list[str]:
    """The types the census keeps out (their tiny config does not build or their eager forward fails), with why."""
    lines = []
    for name, result in sorted(census.get("types", {}).items()):
        if result.get("status") != "ok":
            reason = _markdown_safe(str(result.get("reason", "")))
            lines.append(f"* `{name}` ({result['status']}): {reason}")
    return lines or ["None."]


def generated_totals(cells: dict[str, Any]) -> list[str]:
    """Cells run per tool, how many pass, and the pass rate (over the types the census lets run)."""
    lines = []
    for tool in TOOLS:
        statuses = [r["status"] for key, r in cells.items() if key.endswith(f",{tool}")]
        passed, counted = statuses.count("pass"), len([s for s in statuses if s != "n/a"])
        share = f" ({100.0 * passed / counted:.1f}%)" if counted else ""
        lines.append(f"* {tool}: **{passed} / {counted}** cells run pass{share}, {statuses.count('n/a')} n/a.")
    behind = [key.removesuffix(",peer") for key, result in sorted(cells.items())
              if key.endswith(",peer") and result["status"] == "pass"
              and cells.get(key.removesuffix("peer") + "hfx", {}).get("status") != "pass"]
    lines.append(f"* Cells the peer passes and hfx does not (or has not run): **{len(behind)}**"
                 + (": " + ", ".join(f"`{key}`" for key in behind) if behind else "."))
    return lines


_TEXT_INPUTS = {"input_ids", "attention_mask", "decoder_input_ids"}


def text_only(census: dict[str, Any]) -> list[str]:
    """Runnable image-text and speech types whose generic inputs are text alone (no image or audio placeholder)."""
    found = [name for name, result in sorted(census.get("types", {}).items())
             if name.partition(":")[0] in ("image-text-to-text", "speech-seq2seq") and result.get("status") == "ok"
             and "inputs" in result and set(result["inputs"]) <= _TEXT_INPUTS]
    return [", ".join(f"`{name}`" for name in found) + "." if found else "None."]


def generated_failures(cells: dict[str, Any]) -> list[str]:
    """Every failing cell of the generated zoo with its reason."""
    lines = [f"* `{key}`: {_markdown_safe(str(result.get('reason', '')))[:240]}"
             for key, result in sorted(cells.items()) if result.get("status") == "fail"]
    return lines or ["No cell fails."]


def image_size_line(cells: dict[str, Any]) -> str:
    """How many hfx forward cells were checked at another image size, and how that went."""
    checked = [cell["image_size"].rsplit(": ", 1)[-1] for key, cell in cells.items()
               if key.endswith(",forward,hfx") and "image_size" in cell]
    found = {outcome: checked.count(outcome) for outcome in ("pass", "refused", "eager refuses", "fail", "error")}
    return (f"Checked at another image size so far: {len(checked)} cells ("
            + ", ".join(f"{n} {outcome}" for outcome, n in found.items()) + "); image cells run before this check"
            " (no `image_size` in the JSON) were compared at the capture's image size only.")


def generated_section(results: dict[str, Any], census: dict[str, Any]) -> list[str]:
    """The generated zoo's part of the page: census, pass counts per task and runtime, exclusions, failures."""
    cells = results.get("cells", {})
    runs = "; ".join(
        f"`{run['command']}` ({run['started']}" + (f", {run['types']} types in {run['elapsed_s']:.0f} s)"
                                                   if "elapsed_s" in run and "types" in run else ")")
        for run in census.get("runs", []) + results.get("runs", [])
    )
    return [
        "## The generated zoo: every model type of transformers' auto mappings",
        "",
        "Generated by `benchmarks/coverage.py --census` and `--zoo generated` from",
        "`benchmarks/results/zoo-census.json` and `benchmarks/results/coverage-generated.json`. Each type's config is",
        "its class's defaults with small sizes passed to every size parameter (`hfx._zoo_generated.shrink`), its",
        "inputs are built from its task and its model class's main input. Its weights are its class's own init,",
        "except that a parameter the init leaves all zeros gets small random values (`hfx.zoo.build`): AFMoE and",
        "ERNIE 4.5 MoE zero their router, so top-k chose among exact ties, in an order no two runtimes share;",
        "and a BatchNorm the init scales near zero gets a scale near one: RT-DETR's init draws them from",
        "N(0, 0.01), so a random image's features tied exactly and the encoder's top-k queries with them.",
        "The census builds each type and runs its",
        "eager forward at batch 2 x sequence 7 and 3 x 11; a type that fails there is listed below with the reason",
        "and not run, so it does not count against the pass rate. Each column gives the cells that pass / the cells",
        f"run, over the runnable types (`{_NOT_RUN}` none run yet, `{_NOT_APPLICABLE}` no `generate`).",
        "A generation cell decomposes the model captured at batch 2 x 7, lowers it, and compares 8 new tokens of a",
        "left-padded 2 x 9 prompt with eager `generate(do_sample=False)`: `hfx.generate`'s loop, or, for a model",
        "whose generation config asks for beam search (FSMT), transformers' `generate` over the programs",
        "(`hfx.as_model`). Eager `generate` runs first; where it fails on the zoo's prompt (Pop2Piano wants",
        "`input_features` positionally) the cell is `n/a` and does not count, as a type whose eager forward fails.",
        "A forward cell of an image or video model (`pixel_values`) also runs hfx's program on images (frames) of",
        "1.5 H x 1.25 W (`at_another_image_size`): where the program takes that size, it must match eager or the cell",
        "fails; a program that refuses it (its bounds, an `InputError`) passes, as does one whose eager model refuses it.",
        image_size_line(cells),
        "",
        "CI runs a sample of it (`.ci/run`): `hfx.zoo.sample(seed)` picks one runnable type per task, rotating with the",
        "commit count, and `benchmarks/coverage.py --zoo generated --sample SEED --tools hfx --kinds forward --check`",
        "runs its forward cells on every runtime without saving them; a cell that passes on record and fails there",
        "fails CI.",
        "",
        *[line for tool in TOOLS for line in (*generated_counts(cells, census, tool), "")],
        *generated_totals(cells),
        "",
        f"Census runs, then cell runs: {runs or 'none yet'}.",
        "",
        "### Failing cells",
        "",
        *generated_failures(cells),
        "",
        "### Types the census excludes",
        "",
        *census_exclusions(census),
        "",
        "### Runnable image-text and speech types that run on text alone",
        "",
        "Their config names no image or audio placeholder token the generic builder can fill, so their cells",
        "exercise the language model only:",
        "",
        *text_only(census),
        "",
    ]


def render(results: dict[str, Any], others: dict[str, dict[str, Any]] | None = None, *,
           generated: dict[str, Any] | None = None, census: dict[str, Any] | None = None) -> str:
    """The whole markdown page; ``others``: the results on other ends of the window, by file name; ``generated``
    and ``census``: the generated zoo's results and census (their section is left out when both are empty)."""
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
        *(generated_section(generated or {}, census or {}) if (census or {}).get("types") else []),
    ]
    return "\n".join(lines)


def write_report(results: dict[str, Any], path: Path, others: dict[str, dict[str, Any]] | None = None, *,
                 generated: dict[str, Any] | None = None, census: dict[str, Any] | None = None) -> None:
    """Write ``render(results, others, generated=, census=)`` to ``path`` through a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".md.tmp")
    staging.write_text(render(results, others, generated=generated, census=census))
    staging.replace(path)


def _markdown_safe(text: str) -> str:
    """``text`` on one line with table pipes and link brackets escaped (``rope['x']['y']`` is no reference link)."""
    return text.replace("\n", " ").replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")
