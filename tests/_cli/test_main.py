"""The hfx command line end to end: the exports in a subprocess as a user runs them, the rest in-process.

One ``hfx export --generation`` of a tiny Llama saved with ``save_pretrained``
(and a tokenizer) is shared by every test in this module: they read its table,
its progress output, and run ``hfx inspect`` and ``hfx run`` on what it saved.
``hfx run``, ``hfx zoo`` and a failing export run ``main`` in this process
(``in_process``: the same code and output, without a ~7 s interpreter start-up
each); the subprocess path is the two exports' and ``hfx inspect``'s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import transformers

from hfx import zoo
from hfx._cli.main import main

# Every stderr line hfx writes itself: progress steps and its own one-paragraph messages.
_HFX_STDERR = ("  done ", "  failed ", "  ... ", "hfx ")


def hfx_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hfx *args`` with one thread (the test machine's cores are shared)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "hfx", *args], capture_output=True, text=True, timeout=timeout,
                          env=environment)


def in_process(args: list[str], capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``main(args)`` in this process, as ``hfx_cli`` reports a run: the exit code (argparse's ``SystemExit``
    too) and what reached file descriptors 1 and 2."""
    capfd.readouterr()  # what the test printed before
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def upstream_noise(stderr: str) -> list[str]:
    """The stderr lines hfx did not write (upstream warnings, logs, native prints)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(_HFX_STDERR)]


def _word_tokenizer():
    """A word-level tokenizer over the tiny Llama's 256 ids (``w4`` is id 4), built without a download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {**{token: i for i, token in enumerate(specials)}, **{f"w{i}": i for i in range(4, 256)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


@pytest.fixture(scope="module")
def llama_export(tmp_path_factory):
    """``(result, out dir)`` of ``hfx export DIR --to onnx --generation`` on a saved tiny Llama with a tokenizer."""
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("cli")
    zoo.build("llama").save_pretrained(root / "llama")
    _word_tokenizer().save_pretrained(root / "llama")
    result = hfx_cli("export", str(root / "llama"), "--to", "onnx", "--generation", "--out", str(root / "out"))
    return result, root / "out"


def test_export_verifies_each_component_and_the_tokens(llama_export):
    result, out = llama_export
    assert result.returncode == 0, result.stderr
    rows = {tuple(line.split()[:3]) for line in result.stdout.splitlines()}
    assert {("onnx", "decode", "pass"), ("onnx", "generate", "pass")} <= rows
    assert "batch 3, sequence 11" in result.stdout
    manifest = json.loads((out / "onnx" / "hfx.json").read_text())
    # A full-attention text decoder: one graph for prompt and steps (decompose's default)
    assert list(manifest["components"]) == ["decode"] and manifest["processor"] == "processor"


def test_export_shows_progress_per_component_and_no_upstream_output(llama_export):
    result, _ = llama_export
    assert "  done   onnx: lower decode" in result.stderr and "  done   torch.export decode" in result.stderr
    assert upstream_noise(result.stderr) == []
    assert "Traceback" not in result.stderr + result.stdout


def test_inspect_shows_components_axes_bounds_and_versions(llama_export, capsys):
    _, out = llama_export
    result = hfx_cli("inspect", str(out))
    assert result.returncode == 0, result.stderr
    assert "component 'decode' (onnx, opset 18)" in result.stdout
    assert "past_sequence in [0, " in result.stdout and "batch in [1, inf)" in result.stdout  # it prefills from 0
    assert f"transformers {transformers.__version__}" in result.stdout and "tokenizer/processor: processor/" in result.stdout
    assert main(["inspect", str(out / "onnx"), "--json"]) == 0  # in-process: the same code, without a second start-up
    described = json.loads(capsys.readouterr().out)["onnx"]
    decode = described["components"]["decode"]
    assert decode["inputs"][0] == {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}
    assert decode["size"] == sum(p.stat().st_size for p in (out / "onnx").glob("decode.onnx*"))
    assert described["generation"]["model_class"] == "LlamaForCausalLM"


def test_run_generates_from_a_prompt_with_the_saved_tokenizer(llama_export, capfd):
    import hfx

    _, out = llama_export
    result = in_process(["run", str(out), "--prompt", "w10 w11 w12", "--max-new-tokens", "4"], capfd)
    assert result.returncode == 0, result.stderr
    programs = hfx.load(out / "onnx")
    encoded = programs.processor("w10 w11 w12", return_tensors="pt")
    prompt = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    expected = hfx.generate(prompt, programs, max_new_tokens=4)
    assert result.stdout.strip() == programs.processor.decode(expected[0], skip_special_tokens=True)
    assert result.stdout.startswith("w10 w11 w12")


def test_run_samples_like_hfx_generate_with_the_same_seed(llama_export, capfd):
    import torch

    import hfx

    _, out = llama_export
    result = in_process(["run", str(out), "--runtime", "onnx", "--input-ids", "5,6", "--do-sample", "--seed", "7",
                         "--max-new-tokens", "6"], capfd)
    ids = torch.tensor([[5, 6]])
    expected = hfx.generate({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, hfx.load(out / "onnx"),
                            max_new_tokens=6, do_sample=True, seed=7)
    assert result.stdout.strip() == ",".join(map(str, expected[0].tolist()))


def test_run_searches_beams_with_the_common_options_as_eager_generate_does(llama_export, capfd):
    import torch
    from transformers import AutoModelForCausalLM

    _, out = llama_export
    result = in_process(["run", str(out), "--runtime", "onnx", "--input-ids", "5,6,7", "--num-beams", "3",
                         "--repetition-penalty", "1.2", "--no-repeat-ngram-size", "2", "--max-new-tokens", "6"], capfd)
    assert result.returncode == 0, result.stderr
    model = AutoModelForCausalLM.from_pretrained(out.parent / "llama").eval()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                  num_beams=3, repetition_penalty=1.2, no_repeat_ngram_size=2)
    assert result.stdout.strip() == ",".join(map(str, expected[0].tolist()))


def test_export_for_consumers_writes_the_packages_their_pipelines_load(tmp_path):
    # Two consumers with two decompositions (the runner keeps its cache inside); each writer's own
    # package, run by the real consumer, is tested in tests/_package.
    og = pytest.importorskip("onnxruntime_genai")
    consumers = ["ort-genai", "executorch-runner"]
    result = hfx_cli("export", "--for", ",".join(consumers), "--static-cache", "64", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    for consumer in consumers:  # hfx.load + hfx.generate of each package gave eager's tokens
        assert re.search(rf"^{re.escape(consumer)}\s+pass\s+equal", result.stdout, re.MULTILINE), result.stdout
    assert "a 64-position cache inside" in result.stdout  # the runner's own decomposition, from --static-cache
    assert not (tmp_path / "out" / "onnx").exists()  # --for alone lowers to no runtime of --to
    assert (tmp_path / "out" / "executorch-runner" / "model.pte").is_file()
    model = og.Model(str(tmp_path / "out" / "ort-genai"))  # the consumer loads it as it is
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=8)
    generator = og.Generator(model, params)
    generator.append_tokens([[1, 5, 6]])
    generator.generate_next_token()
    assert len(generator.get_sequence(0)) == 4


def test_a_failed_check_exits_1_and_the_table_says_fail(tmp_path, capfd):
    pytest.importorskip("onnxruntime")
    result = in_process(["export", "bert", "--to", "onnx", "--atol", "0", "--rtol", "0", "--out", str(tmp_path)], capfd)
    assert result.returncode == 1, result.stderr
    assert any(line.split()[:3] == ["onnx", "model", "FAIL"] for line in result.stdout.splitlines())
    assert "1 check(s) failed: onnx model" in result.stdout
    assert (tmp_path / "onnx" / "hfx.json").is_file()  # saved anyway, to inspect
    assert upstream_noise(result.stderr) == []


def test_zoo_lists_the_builtin_models(capfd):
    result = in_process(["zoo"], capfd)
    assert result.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:]}
    assert rows.keys() == set(zoo.ENTRIES)
    assert rows["whisper"] == ["encoder-decoder", "AutoModelForSpeechSeq2Seq", "yes"]
