"""The ExecuTorch runner package: ``TextLLMRunner`` loads it as it is and generates eager's greedy tokens.

EOS and vocabulary: the runner stops at the program's ``get_eos_ids`` and, like
any greedy decoder, at nothing else; it samples among the tokenizer's ids only
(its sampler's size is ``tokenizer.vocab_size()``, 183 for the zoo tokenizer
under the zoo Llama's 256 logits). So eager runs with the same EOS and with the
ids the tokenizer does not have suppressed, and each prompt is one the random
model continues for ``COUNT`` tokens without an EOS (asserted, so that a changed
model cannot make the comparison shorter).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo

# The consumers are in the test extra: a missing one is an install step (pip install -e '.[test]'), not a skip.
import executorch.extension.llm.runner as runner  # noqa: E402

LENGTH = 64
COUNT = 8
PROMPTS = ["hello world", "models speak in tokens: numbers and words"]


@pytest.fixture(scope="module")
def parts(llama):
    prompt = dict(zoo.tokenizer()(PROMPTS[0], return_tensors="pt"))
    return pipe(llama, hfx.capture(prompt), hfx.decompose(internal_cache_length=LENGTH))


@pytest.fixture(scope="module")
def package_dir(parts, tmp_path_factory):
    return hfx.package(tmp_path_factory.mktemp("runner") / "llama", parts, consumer="executorch-runner",
                       tokenizer=zoo.tokenizer())


def _eager_new_tokens(model, prompt: str) -> list[int]:
    tokenizer = zoo.tokenizer()
    ids = tokenizer(prompt, return_tensors="pt")
    outside = list(range(len(tokenizer), model.config.vocab_size))  # ids the runner's sampler never picks
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=COUNT, do_sample=False, suppress_tokens=outside)
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    assert len(new) == COUNT and model.generation_config.eos_token_id not in new  # no early EOS to hide a mismatch
    return new


@pytest.mark.parametrize("prompt", PROMPTS)
def test_text_llm_runner_generates_the_eager_greedy_tokens(llama, package_dir, prompt):
    model = runner.TextLLMRunner(str(package_dir / "model.pte"), str(package_dir / "tokenizer.json"))
    pieces, stats = [], []
    config = runner.GenerationConfig(echo=False, max_new_tokens=COUNT, temperature=0.0)
    model.generate(prompt, config, pieces.append, stats.append)
    want = _eager_new_tokens(llama, prompt)
    assert stats[0].num_prompt_tokens == len(zoo.tokenizer()(prompt)["input_ids"])
    assert stats[0].num_generated_tokens == COUNT - 1  # the steps after the prompt's call, which gave the first
    assert pieces == [zoo.tokenizer().decode([token]) for token in want]


def test_the_program_carries_the_runner_metadata(llama, package_dir):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(package_dir / "model.pte")
    values = {name: program.load_method(name).execute([]) for name in program.method_names if name != "forward"}
    assert values == {
        "get_max_seq_len": [LENGTH], "get_max_context_len": [LENGTH], "get_vocab_size": [llama.config.vocab_size],
        "use_kv_cache": [True], "enable_dynamic_shape": [True], "use_sdpa_with_kv_cache": [False],
        "get_bos_id": [llama.generation_config.bos_token_id], "get_eos_ids": [llama.generation_config.eos_token_id],
    }
    meta = program.metadata("forward")
    assert meta.num_inputs() == 2 and meta.num_outputs() == 1  # tokens, input_pos -> logits: the cache stays inside


def test_the_program_runs_executorch_llm_kernels(package_dir):
    operators = hfx.load(package_dir)["decode"].operators
    assert {"llama::custom_sdpa", "llama::update_cache"} <= set(operators)
    assert not any("index_copy" in name or "scaled_dot_product" in name for name in operators)


def test_the_package_holds_the_runner_files_and_hfx_reads_it(llama, package_dir):
    names = {path.name for path in package_dir.iterdir()}
    assert {"model.pte", "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
            "hfx.json"} <= names
    assert json.loads((package_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    manifest = json.loads((package_dir / "hfx.json").read_text())
    assert manifest["components"]["decode"]["files"] == ["model.pte"]
    assert hfx.load(package_dir).meta.roles.internal_cache_length == LENGTH
    prompt = dict(zoo.tokenizer()(PROMPTS[1], return_tensors="pt"))
    want = llama.generate(**prompt, max_new_tokens=COUNT, do_sample=False)
    # A fresh process that only loads the package: hfx registers ExecuTorch's LLM kernels the program runs.
    check = ("import sys, json, hfx\nfrom hfx import zoo\n"
             "prompt = dict(zoo.tokenizer()(sys.argv[2], return_tensors='pt'))\n"
             f"print(json.dumps(hfx.generate(prompt, hfx.load(sys.argv[1]), max_new_tokens={COUNT}).tolist()))")
    result = subprocess.run([sys.executable, "-c", check, str(package_dir), PROMPTS[1]], capture_output=True,
                            text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == want.tolist()


def test_xnnpack_takes_the_reshapes_and_norms_of_the_runner_program(package_dir):
    program = hfx.load(package_dir)["decode"]
    assert set(program.rewrites) == {"views_infer_their_symbolic_dim", "row_means_as_pooling"}
    assert not {"aten::mean", "executorch_prim::et_view"} & set(program.operators)  # in XNNPACK, not portable kernels


def test_the_runner_package_refuses_what_the_runner_cannot_load(llama, tmp_path):
    t5 = pipe(zoo.build("t5"), hfx.capture(zoo.inputs("t5")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"package for executorch-runner: T5ForConditionalGeneration is an encoder-decoder"):
        hfx.package(tmp_path / "a", t5, consumer="executorch-runner", tokenizer=zoo.tokenizer())
    split = pipe(llama, hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"executorch-runner: .*cache as an input.*internal_cache_length=N"):
        hfx.package(tmp_path / "b", split, consumer="executorch-runner", tokenizer=zoo.tokenizer())
    assert not any(tmp_path.iterdir())
