"""Every generative zoo model lowered with AOTInductor: hfx.generate's tokens against eager's.

    python benchmarks/aoti_parity.py [--one-row-matmuls inductor|aten|auto] [--models llama,t5] [--out PATH]

Each model (hfx.zoo, random weights) is captured at batch 2 x 7, decomposed, exported and lowered by
``hfx.lower_to_aoti(threads=1, one_row_matmuls=...)``; then greedy generation of 6 tokens at batch 1 (one row
per decode step: where ``"inductor"`` runs Inductor's reduction) and at batch 2 (ATen's matmul), each against
``model.generate``. The zoo's models fit in the caches, so ``"auto"`` keeps ATen for every one of them: the
default here is ``"inductor"``, the path a large model takes on a CPU whose one-row matmul is slow. Writes
one JSON line per model to ``--out`` and prints a table. Not timed: a correctness sweep of a fast path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NEW_TOKENS = 6


def model_row(name: str, one_row_matmuls: str) -> dict[str, Any]:
    """``{"name", "b1", "b2", "seconds"}`` (whether each batch gave eager's tokens), or ``"error"``."""
    import torch

    import hfx
    from hfx import zoo

    start = time.perf_counter()
    row: dict[str, Any] = {"name": name}
    try:
        model = zoo.build(name)
        exported = hfx.export(hfx.decompose(hfx.capture(zoo.inputs(name, batch=2, sequence=7), model)))
        programs = hfx.lower_to_aoti(exported, threads=1, one_row_matmuls=one_row_matmuls)
        for batch in (1, 2):
            inputs = zoo.inputs(name, batch=batch, sequence=9)
            with torch.no_grad():
                eager = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
            row[f"b{batch}"] = bool(torch.equal(hfx.generate(inputs, programs, max_new_tokens=NEW_TOKENS), eager))
    except Exception as exc:  # noqa: BLE001 - a sweep records every model's failure and goes on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``rows``.

    >>> print(table([{"name": "llama", "b1": True, "b2": True, "seconds": 9.0}, {"name": "x", "error": "E: y"}]))
    | model | batch 1 | batch 2 | s | error |
    |---|---|---|---:|---|
    | llama | yes | yes | 9.0 |  |
    | x | - | - | - | E: y |
    """
    def mark(row: dict[str, Any], key: str) -> str:
        return {True: "yes", False: "**no**"}.get(row.get(key), "-")

    lines = ["| model | batch 1 | batch 2 | s | error |", "|---|---|---|---:|---|"]
    lines += [f"| {r['name']} | {mark(r, 'b1')} | {mark(r, 'b2')} | {r.get('seconds', '-')} | {r.get('error', '')} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    from hfx import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-row-matmuls", default="inductor", choices=("inductor", "aten", "auto"))
    parser.add_argument("--models", default=",".join(zoo.names(generative=True)))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "aoti_parity.jsonl")
    args = parser.parse_args()
    rows = []
    with args.out.open("w") as out:
        for name in args.models.split(","):
            rows.append(model_row(name, args.one_row_matmuls))
            print(json.dumps(rows[-1]), file=out, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
