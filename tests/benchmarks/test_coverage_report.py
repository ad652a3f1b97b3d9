"""``benchmarks/_coverage_report.py``: each column says which releases its cells ran on."""

from __future__ import annotations

from benchmarks._coverage_report import column_versions, generated_totals, other_end


def test_each_column_lists_the_releases_of_its_cells_with_counts():
    cells = {
        "llama,onnx,forward,hfx": {"status": "pass", "versions": "torch 2.13.0, transformers 5.22.2"},
        "bert,onnx,forward,hfx": {"status": "pass", "versions": "torch 2.14.1, transformers 5.24.0"},
        "gpt2,onnx,forward,hfx": {"status": "pass", "versions": "torch 2.14.1, transformers 5.24.0"},
        "llama,onnx,forward,peer": {"status": "fail"},
    }
    rows = {row.split(" | ")[0].lstrip("| "): row for row in column_versions(cells)}
    assert rows["onnx fwd"] == ("| onnx fwd | torch 2.13.0, transformers 5.22.2 (1); torch 2.14.1, transformers 5.24.0 (2) "
                                "| not recorded (1) |")
    assert rows["pte fwd"].endswith("| - | - |")


def test_another_end_counts_each_column_and_lists_its_failures():
    cells = {
        "llama,onnx,forward,hfx": {"status": "pass", "versions": "torch 2.14.1, transformers 5.24.0"},
        "bert,onnx,forward,hfx": {"status": "fail", "reason": "boom", "versions": "torch 2.14.1, transformers 5.24.0"},
    }
    lines = other_end("coverage-newest.json", {"cells": cells, "runs": []})
    assert lines[0] == "### torch 2.14.1, transformers 5.24.0 (`benchmarks/results/coverage-newest.json`)"
    onnx = next(line for line in lines if line.startswith("| onnx fwd |"))
    assert onnx.split(" | ")[1:3] == ["1", "1"]  # the other forward cells are not run
    assert "* `bert,onnx,forward,hfx`: boom" in lines


def test_the_generated_totals_name_each_cell_the_peer_passes_and_hfx_does_not():
    cells = {
        "causal-lm:a,onnx,forward,hfx": {"status": "fail"},
        "causal-lm:a,onnx,forward,peer": {"status": "pass"},
        "causal-lm:b,onnx,forward,hfx": {"status": "pass"},
        "causal-lm:b,onnx,forward,peer": {"status": "pass"},
        "causal-lm:c,onnx,forward,peer": {"status": "pass"},  # hfx not run yet
        "causal-lm:d,onnx,forward,hfx": {"status": "fail"},
        "causal-lm:d,onnx,forward,peer": {"status": "fail"},
    }
    lines = generated_totals(cells)
    assert lines[0] == "* hfx: **1 / 3** cells run pass (33.3%), 0 n/a."
    assert lines[-1] == ("* Cells the peer passes and hfx does not (or has not run): **2**: "
                         "`causal-lm:a,onnx,forward`, `causal-lm:c,onnx,forward`")
