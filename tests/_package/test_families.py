"""The decoder families people ship (Qwen2, Qwen3, Mistral, Gemma, Phi-3), packaged for every consumer.

Each family is decomposed and exported once (one graph for prompt and steps) and written as the ONNX Runtime GenAI,
OpenVINO GenAI and Transformers.js packages; the ExecuTorch runner's package is its own decomposition (the KV cache
inside the program). Every consumer then runs its package as it is, and its greedy tokens are eager's. One layer per
model: the same operators and cache as the zoo's two, lowered in less time. Llama, GPT-2 and the refusals are in the
consumer's own test file.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.helpers import install_transformers_js, one_layer

# The consumers are in the test extra: a missing one is an install step (pip install -e '.[test]'), not a skip.
# Mistral as v0.3 ships it (no sliding window; the zoo's Mistral slides, which ONNX Runtime GenAI refuses).
FAMILIES = {"qwen2": {}, "qwen3": {}, "mistral": {"sliding_window": None}, "gemma": {}, "phi3": {}}
PROMPT = "models speak in tokens: numbers and words"
COUNT = 6


@pytest.fixture(scope="module")
def family_models():
    return {name: one_layer(name, **overrides) for name, overrides in FAMILIES.items()}


@pytest.fixture(scope="module")
def exported(family_models):
    """Each family's one decode graph, exported once and packaged for the three ONNX and OpenVINO consumers."""
    prompt = dict(zoo.tokenizer()(["hello world, export once", "the quick brown fox"], return_tensors="pt", padding=True))
    return {name: pipe(model, hfx.capture(prompt), hfx.decompose(multi_token_decode=True), hfx.export)
            for name, model in family_models.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def _package(root, parts, name: str, consumer: str):
    return hfx.package(root / consumer / name, parts, consumer=consumer, tokenizer=zoo.tokenizer())


def _eager_new_tokens(model, *, suppress_outside_the_tokenizer: bool = False) -> list[int]:
    tokenizer = zoo.tokenizer()
    ids = tokenizer(PROMPT, return_tensors="pt")
    options = {"min_new_tokens": COUNT}  # a random model may say EOS early; each consumer is asked for as many
    if suppress_outside_the_tokenizer:  # the runner samples among the tokenizer's ids only (test_executorch_runner)
        options = {"suppress_tokens": list(range(len(tokenizer), model.config.vocab_size))}
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=COUNT, do_sample=False, **options)
    return out[0, ids["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ort_genai_generates_the_eager_tokens(family_models, exported, root, name):
    from tests._package.test_ort_genai import _genai_new_tokens

    directory = _package(root, exported[name], name, "ort-genai")
    assert _genai_new_tokens(directory, [PROMPT], COUNT) == [_eager_new_tokens(family_models[name])]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_openvino_genai_generates_the_eager_tokens(family_models, exported, root, name):
    import openvino as ov
    import openvino_genai as genai

    from hfx._package.openvino_genai import EXACT_PROPERTIES

    directory = _package(root, exported[name], name, "openvino-genai")
    pipeline = genai.LLMPipeline(str(directory), "CPU", **EXACT_PROPERTIES)
    ids = zoo.tokenizer()(PROMPT, return_tensors="np")
    config = genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = COUNT
    tokens = pipeline.generate(genai.TokenizedInputs(ov.Tensor(ids["input_ids"]), ov.Tensor(ids["attention_mask"])),
                               config).tokens[0]
    assert list(tokens) == _eager_new_tokens(family_models[name])


def test_transformers_js_generates_the_eager_tokens(family_models, exported, root):
    from tests._package.test_transformers_js import SCRIPT

    prefix = install_transformers_js()
    directories = {name: _package(root, parts, name, "transformers.js") for name, parts in exported.items()}
    job = {"root": str(root), "extract": [],
           "generate": [{"key": name, "path": str(path), "dtype": "fp32", "prompts": [PROMPT], "new_tokens": COUNT}
                        for name, path in directories.items()]}
    (root / "job.json").write_text(json.dumps(job))
    run = subprocess.run(["node", str(SCRIPT), str(prefix), str(root / "job.json")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])["generate"]
    assert {name: got[name][0] for name in FAMILIES} == {name: _eager_new_tokens(family_models[name]) for name in FAMILIES}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_executorch_runner_generates_the_eager_tokens(family_models, root, name):
    import executorch.extension.llm.runner as runner

    prompt = dict(zoo.tokenizer()(PROMPT, return_tensors="pt"))
    parts = pipe(family_models[name], hfx.capture(prompt), hfx.decompose(internal_cache_length=64))
    directory = _package(root, parts, name, "executorch-runner")
    # A tied embedding (Gemma) is kept in model.ptd, stored once: the runner reads it as its data file.
    weights = directory / "model.ptd"
    assert weights.is_file() == family_models[name].config.tie_word_embeddings
    model = runner.TextLLMRunner(str(directory / "model.pte"), str(directory / "tokenizer.json"),
                                 str(weights) if weights.is_file() else None)
    pieces, stats = [], []
    model.generate(PROMPT, runner.GenerationConfig(echo=False, max_new_tokens=COUNT, temperature=0.0),
                   pieces.append, stats.append)
    want = _eager_new_tokens(family_models[name], suppress_outside_the_tokenizer=True)
    assert pieces == [zoo.tokenizer().decode([token]) for token in want]
