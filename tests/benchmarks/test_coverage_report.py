"""``benchmarks/_coverage_report.py``: each column says which releases its cells ran on."""

from __future__ import annotations

from benchmarks._coverage_report import column_versions


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
