"""The OpenVINO GenAI package: ``openvino_genai.LLMPipeline`` loads it as it is and generates eager's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.tolerances import FP32_PARITY

# The consumers are in the test extra: a missing one is an install step (pip install -e '.[test]'), not a skip.
import openvino as ov  # noqa: E402
import openvino_genai as genai  # noqa: E402

PROMPTS = ["hello world, export once", "the quick brown fox"]


@pytest.fixture(scope="module")
def package_dir(parts, tmp_path_factory):
    return hfx.package(tmp_path_factory.mktemp("genai") / "llama", parts, consumer="openvino-genai", tokenizer=zoo.tokenizer())


def _pipeline(directory):
    from hfx._package.openvino_genai import EXACT_PROPERTIES

    return genai.LLMPipeline(str(directory), "CPU", **EXACT_PROPERTIES)


def _eager_new_tokens(model, prompt: str, count: int) -> list[int]:
    ids = zoo.tokenizer()(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=count, min_new_tokens=count, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:].tolist()


def _config(count: int):
    config = genai.GenerationConfig()
    config.max_new_tokens = count
    config.min_new_tokens = count  # a random model may say EOS early; both sides then go on alike
    return config


@pytest.mark.parametrize("prompt", ["hello world", "models speak in tokens: numbers and words"])
def test_llm_pipeline_generates_the_eager_tokens(llama, package_dir, prompt):
    pipeline = _pipeline(package_dir)
    ids = zoo.tokenizer()(prompt, return_tensors="np")
    tokenized = genai.TokenizedInputs(ov.Tensor(ids["input_ids"]), ov.Tensor(ids["attention_mask"]))
    got = pipeline.generate(tokenized, _config(8)).tokens[0]
    assert list(got) == _eager_new_tokens(llama, prompt, 8)


def test_llm_pipeline_text_is_the_eager_text(llama, package_dir):
    pipeline = _pipeline(package_dir)
    text = pipeline.generate("hello world", _config(6))
    assert str(text) == zoo.tokenizer().decode(_eager_new_tokens(llama, "hello world", 6), skip_special_tokens=True)


def test_the_package_holds_one_stateful_model_and_the_tokenizer_models(package_dir):
    names = {path.name for path in package_dir.iterdir()}
    assert {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml",
            "config.json", "generation_config.json", "tokenizer.json", "hfx.json"} <= names
    assert not any(name.endswith(".bin") and name != "openvino_model.bin" and "tokenizer" not in name for name in names)
    model = ov.Core().read_model(package_dir / "openvino_model.xml")
    inputs = {port.get_any_name() for port in model.inputs}
    assert inputs == {"input_ids", "attention_mask", "position_ids", "beam_idx"}
    assert len(model.get_sinks()) == 2 * zoo.build("llama").config.num_hidden_layers  # keys and values per layer


def test_stateful_model_keeps_the_given_model_and_reorders_by_beam_idx(parts):
    from hfx.backends._openvino_stateful import stateful_model

    program = hfx.lower_to_ov(parts["decode"])
    before = [port.get_any_name() for port in program.model.inputs]
    stateful = stateful_model(program.model)
    assert [port.get_any_name() for port in program.model.inputs] == before  # a copy was changed
    from hfx._package.openvino_genai import EXACT_PROPERTIES

    request = ov.Core().compile_model(stateful, "CPU", dict(EXACT_PROPERTIES)).create_infer_request()
    prompt = zoo.tokenizer()(PROMPTS, return_tensors="pt", padding=True)
    mask = prompt["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    feed = {"input_ids": prompt["input_ids"], "attention_mask": mask, "position_ids": positions}
    first = request.infer({**{k: v.numpy() for k, v in feed.items()}, "beam_idx": np.array([0, 1], dtype=np.int32)})["logits"][:, -1].copy()
    # Swapping the rows of the cache with beam_idx = [1, 0] and the rows of the next token gives swapped logits.
    token = torch.tensor(first.argmax(-1))[:, None]
    step = {"input_ids": token.flip(0), "attention_mask": torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], -1).flip(0),
            "position_ids": positions[:, -1:].flip(0) + 1}
    swapped = request.infer({**{k: v.numpy() for k, v in step.items()}, "beam_idx": np.array([1, 0], dtype=np.int32)})["logits"][:, -1]
    expected = program(input_ids=token, attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], -1),
                       position_ids=positions[:, -1:] + 1,
                       past_key_values=program(**feed, past_key_values=_empty_cache(program)).past_key_values).logits[:, -1]
    torch.testing.assert_close(torch.tensor(swapped), expected.flip(0), atol=FP32_PARITY, rtol=FP32_PARITY)


def _empty_cache(program):
    from hfx._generate import initial_cache

    return initial_cache(program, 2, "past_key_values")


def test_consumers_refuse_what_they_cannot_load(parts, tmp_path):
    split = pipe(zoo.build("llama"), hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=False))
    with pytest.raises(ValueError, match=r"openvino-genai.*multi_token_decode=True"):
        hfx.package(tmp_path / "a", split, consumer="openvino-genai", tokenizer=zoo.tokenizer())
    t5 = pipe(zoo.build("t5"), hfx.capture(zoo.inputs("t5")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"openvino-genai.*encoder-decoder"):
        hfx.package(tmp_path / "b", t5, consumer="openvino-genai", tokenizer=zoo.tokenizer())
    with pytest.raises(ValueError, match="no tokenizer"):
        hfx.package(tmp_path / "c", parts, consumer="openvino-genai")
    with pytest.raises(ValueError, match="unknown consumer 'tflite'"):
        hfx.package(tmp_path / "d", parts, consumer="tflite", tokenizer=zoo.tokenizer())
    with pytest.raises(TypeError, match=r"programs \(the last argument\) must be the Components.*call package\(directory, programs\)"):
        hfx.package(parts, tmp_path / "f", consumer="openvino-genai", tokenizer=zoo.tokenizer())
    assert not any(tmp_path.iterdir())  # a refused package writes nothing


def test_a_failed_package_leaves_no_directory(parts, tmp_path, monkeypatch):
    import hfx._package.package as stage

    def broken(programs, staging, *, tokenizer):
        (staging / "openvino_model.xml").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(stage, "CONSUMERS", {"openvino-genai": broken})
    with pytest.raises(RuntimeError, match="disk full"):
        hfx.package(tmp_path / "e", parts, consumer="openvino-genai", tokenizer=zoo.tokenizer())
    assert list(tmp_path.iterdir()) == []


def test_hfx_loads_the_package_and_generates_the_eager_tokens(llama, package_dir):
    loaded = hfx.load(package_dir)
    assert list(loaded) == ["decode"] and loaded["decode"].state
    prompt = zoo.tokenizer()(["hello world", "the lazy dog jumps over"], return_tensors="pt", padding=True)
    want = llama.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(hfx.generate(dict(prompt), loaded, max_new_tokens=6), want)
