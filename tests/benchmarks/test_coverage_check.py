"""``benchmarks/coverage.py --check``: CI's sample run reports every cell and fails only on a regression."""

from __future__ import annotations

from benchmarks import coverage


def test_a_cell_that_passes_on_record_and_fails_now_is_a_regression(monkeypatch, capsys):
    now = {"a,onnx,forward,hfx": "fail", "b,onnx,forward,hfx": "pass", "c,onnx,forward,hfx": "fail",
           "d,onnx,forward,hfx": "fail"}
    monkeypatch.setattr(coverage, "run_in_subprocess", lambda key, timeout: {"status": now[key], "wall_s": 1.0})
    recorded = {"a,onnx,forward,hfx": {"status": "pass"}, "b,onnx,forward,hfx": {"status": "fail"},
                "c,onnx,forward,hfx": {"status": "fail"}}
    regressions = coverage.check(list(now), jobs=2, timeout=5, recorded=recorded)
    assert regressions == ["a,onnx,forward,hfx"]  # a fixed cell (b), a known failure (c) and a new one (d) are not
    printed = capsys.readouterr().out
    assert "d,onnx,forward,hfx" in printed and "(on record: -" in printed


def test_the_peer_is_run_beside_the_cells_hfx_fails_only():
    keys = ["a,onnx,forward,peer", "b,onnx,forward,peer", "c,onnx,forward,peer", "a,onnx,forward,hfx"]
    recorded = {"a,onnx,forward,hfx": {"status": "fail"}, "b,onnx,forward,hfx": {"status": "pass"}}
    assert coverage.beside_failures(keys, recorded) == ["a,onnx,forward,peer"]  # c: no hfx cell on record
