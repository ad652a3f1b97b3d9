"""Run a benchmark script in a fresh interpreter and read the JSON line it prints (shared by the benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_json(script: str | Path, arguments: list[str], *, timeout: float | None = None) -> dict[str, Any]:
    """``python script *arguments`` from the repository root; its last JSON line, or ``{"error": why}``."""
    command = [sys.executable, str(Path(script).resolve()), *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"error": tail}
    return json.loads(lines[-1])
