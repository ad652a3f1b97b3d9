"""The hfx command line, run in a subprocess as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _hfx(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hfx", *args], capture_output=True, text=True, timeout=timeout)


def test_export_verifies_and_saves_each_runtime(tmp_path):
    pytest.importorskip("onnxruntime")
    result = _hfx("export", "--to", "pt2,onnx", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "pt2      pass" in result.stdout and "onnx     pass" in result.stdout
    assert "Traceback" not in result.stderr and "Warning" not in result.stdout
    manifest = json.loads((tmp_path / "onnx" / "hfx.json").read_text())
    assert manifest["components"]["model"]["runtime"] == "onnx"


def test_a_failed_check_exits_non_zero(tmp_path):
    result = _hfx("export", "--to", "pt2", "--atol", "-1", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "FAIL" in result.stdout


def test_bad_arguments_give_one_paragraph_and_no_traceback(tmp_path):
    result = _hfx("export", "no-such-model-dir", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "no-such-model-dir" in result.stderr and "Traceback" not in result.stderr
    result = _hfx("export", "--to", "tflite", "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown runtime" in result.stderr


def test_zoo_lists_the_builtin_models():
    result = _hfx("zoo")
    assert result.returncode == 0 and "llama" in result.stdout and "whisper" in result.stdout
