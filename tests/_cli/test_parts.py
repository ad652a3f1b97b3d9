"""The command line's small parts, in isolation: progress, tables, option checks, model errors, docs coverage."""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest

import hfx
from hfx._cli.common import UsageError, table
from hfx._cli.export import parse_runtimes, quantizer
from hfx._cli.load_model import _is_offline, _not_loadable
from hfx._cli.progress import step
from hfx._cli.run import prompt_inputs

ROOT = Path(__file__).resolve().parents[2]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_step_prints_one_line_per_finished_step_off_a_terminal():
    out = io.StringIO()
    with step("export", stream=out):
        pass
    with pytest.raises(ValueError, match="boom"), step("lower", stream=out):
        raise ValueError("boom")
    lines = out.getvalue().splitlines()
    assert [line.split("(")[0].split() for line in lines] == [["done", "export"], ["failed", "lower"]]


def test_step_redraws_the_running_line_on_a_terminal():
    out = _Tty()
    with step("export", stream=out):
        assert out.getvalue() == "\r\x1b[K  ...    export"
    assert out.getvalue().count("\n") == 1 and out.getvalue().split("\r\x1b[K")[-1].startswith("  done   export")


def test_table_pads_columns():
    assert table(["a", "b"], [["xx", 1]]).splitlines() == ["a   b", "--  -", "xx  1"]


def test_parse_runtimes_keeps_order_and_rejects_unknown_names():
    assert parse_runtimes("onnx, pt2,onnx") == ["onnx", "pt2"]
    with pytest.raises(UsageError, match=r"unknown runtime\(s\) \['tflite'\]"):
        parse_runtimes("pt2,tflite")
    with pytest.raises(UsageError, match="choose among"):
        parse_runtimes(" , ")


def test_parse_consumers_keeps_order_and_rejects_unknown_names():
    from hfx._cli.package import consumers, parse_consumers

    assert "openvino-genai" in consumers()
    assert parse_consumers("openvino-genai, openvino-genai") == ["openvino-genai"]
    with pytest.raises(UsageError, match=r"unknown consumer\(s\) \['tflite'\]"):
        parse_consumers("openvino-genai,tflite")


def test_quantizer_maps_each_scheme_to_the_runtime_stage():
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hfx, "quantize_ov", lambda program, **options: calls.append((program, options)), raising=False)
        quantizer("int4", "ov")("program")
    assert calls == [("program", {"mode": "int4"})]
    with pytest.raises(UsageError, match="int4 is not available for pt2: it exists for pte, onnx, ov"):
        quantizer("int4", "pt2")


def test_quantizer_says_when_the_stage_is_not_in_this_build(monkeypatch):
    monkeypatch.delattr(hfx, "quantize_onnx", raising=False)
    with pytest.raises(UsageError, match=r"needs hfx.quantize_onnx, which is not available in this build"):
        quantizer("int8", "onnx")


def test_prompt_inputs_parse_ids_and_reject_bad_ones():
    inputs = prompt_inputs(argparse.Namespace(prompt=None, input_ids="4, 5,6"), None)
    assert inputs["input_ids"].tolist() == [[4, 5, 6]] and inputs["attention_mask"].tolist() == [[1, 1, 1]]
    with pytest.raises(UsageError, match="comma-separated integers"):
        prompt_inputs(argparse.Namespace(prompt=None, input_ids="4,x"), None)
    with pytest.raises(UsageError, match="no tokenizer was saved"):
        prompt_inputs(argparse.Namespace(prompt="hello", input_ids=None), None)


def test_model_errors_tell_an_unreachable_hub_from_a_bad_path(tmp_path):
    class LocalEntryNotFoundError(OSError):
        pass

    offline = OSError("We couldn't connect to 'https://huggingface.co'")
    offline.__cause__ = LocalEntryNotFoundError("outgoing traffic has been disabled")
    assert _is_offline(offline) and not _is_offline(OSError("not found"))
    assert "could not be reached" in _not_loadable("org/model", offline)
    assert "is not a directory, a built-in model name or a hub id" in _not_loadable("./model", OSError())
    assert "is a directory but transformers could not load" in _not_loadable(str(tmp_path), OSError("no config"))


def test_the_api_reference_covers_every_public_name():
    documented = set(re.findall(r"^::: hfx\.(\w+)$", (ROOT / "docs" / "api.md").read_text(), flags=re.MULTILINE))
    assert documented == set(hfx.__all__)


def test_the_docs_nav_lists_every_page():
    nav = set(re.findall(r":\s*(\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert nav == pages
