"""The command line's failures: one paragraph on stderr, the right exit code, a traceback only with --verbose."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

import hfx
from hfx._cli.main import _report, main
from tests._cli.test_main import hfx_cli, in_process, upstream_noise


def _one_paragraph(result: subprocess.CompletedProcess[str]) -> str:
    """The message hfx printed; fails unless stderr is progress lines plus one ``hfx <command>:`` line."""
    assert "Traceback" not in result.stderr and upstream_noise(result.stderr) == []
    messages = [line for line in result.stderr.splitlines() if line.startswith("hfx ")]
    assert len(messages) == 1, result.stderr
    return messages[0]


def test_a_bad_argument_exits_2_with_one_paragraph():
    result = hfx_cli("export", "--to", "tflite")
    assert result.returncode == 2
    assert "--to: unknown runtime(s) ['tflite']; choose among pt2,onnx,pte,ov" in _one_paragraph(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["export", "--quantize", "int4", "--to", "pt2"], "--quantize int4 is not available for pt2: it exists for pte, onnx, ov"),
        (["export", "--static-cache", "64"], "add --generation"),
        (["export", "--generation", "--static-cache", "8", "--to", "pt2"], "pass at least 19"),
        (["export", "--to", "pt2", "--opset", "19"], "--opset 19 applies to ONNX only"),
        (["export", "--to", "onnx", "--opset", "12"], "--opset: opset must be an int in [18,"),
        (["run", "no-such-dir", "--input-ids", "1"], "no-such-dir does not exist"),
        (["export", "--for", "tflite-runner"], "--for: unknown consumer(s) ['tflite-runner']; choose among"),
        (["export", "--for", "openvino-genai", "--quantize", "int8"], "--quantize shape(s) the programs of --to"),
        (["export", "--for", "openvino-genai", "--generation"], "--generation shape(s) the programs of --to"),
        (["export", "--for", "openvino-genai", "--static-cache", "64"], "sets the cache length of executorch-runner"),
        (["export", "--for", "executorch-runner", "--static-cache", "8"], "pass at least 19"),
    ],
)
def test_options_that_cannot_apply_fail_before_any_work(args, says, capsys):
    # In-process (the subprocess path is the test above): these fail while parsing, before a model loads.
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "load" not in err


def test_an_unknown_option_is_argparse_usage_and_exit_2(capfd):
    result = in_process(["export", "--no-such-option"], capfd)
    assert result.returncode == 2 and "unrecognized arguments: --no-such-option" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_model_directory_names_it_and_what_to_pass(tmp_path, capfd):
    result = in_process(["export", str(tmp_path / "no-such-model"), "--to", "pt2", "--out", str(tmp_path / "out")],
                         capfd)
    assert result.returncode == 2
    message = _one_paragraph(result)
    assert "no-such-model' is not a directory" in message and "see `hfx zoo`" in message
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_says_so_and_what_to_pass_instead(tmp_path):
    result = hfx_cli("export", "made-up-org/no-such-model", "--to", "pt2", "--out", str(tmp_path),
                     env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    message = _one_paragraph(result)
    assert "the Hugging Face Hub could not be reached" in message and "save_pretrained" in message


def test_a_missing_runtime_package_names_the_extra_to_install(tmp_path, capfd, monkeypatch):
    # ``sys.modules[name] = None`` is how Python marks a module as not importable: find_spec returns None.
    monkeypatch.setitem(sys.modules, "openvino", None)
    result = in_process(["export", "--to", "ov", "--out", str(tmp_path)], capfd)
    assert result.returncode == 2
    assert "runtime ov: this runtime needs openvino" in _one_paragraph(result)
    assert "pip install 'hfx[openvino]'" in result.stderr


def test_verbose_shows_the_traceback(tmp_path, capfd):
    result = in_process(["export", str(tmp_path / "no-such-model"), "--to", "pt2", "--verbose"], capfd)
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr and "UsageError" in result.stderr


class _Unexportable(torch.nn.Module):
    def forward(self, x):
        return x.item()


@pytest.mark.parametrize("verbose", [False, True])
def test_the_component_that_failed_ends_the_paragraph(verbose, capsys):
    # A lifted stage names the component in a note, which str(exc) leaves out: the paragraph must carry it.
    with pytest.raises(hfx.CaptureError) as info:
        hfx.export(hfx.Components(items={"decode": hfx.capture({"x": torch.ones(2)}, _Unexportable())}))
    assert _report(info.value, argparse.Namespace(command="export", verbose=verbose)) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hfx export: ")]
    assert len(lines) == 1 and lines[0].startswith("hfx export: CaptureError: [export] component 'model' of _Unexportable")
    assert "; in component 'decode' of export" in lines[0]
