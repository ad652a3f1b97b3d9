"""The ONNX Runtime GenAI package: ``onnxruntime_genai.Model`` loads it as it is and generates eager's greedy tokens."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from hfx._records import Components

# The consumers are in the test extra: a missing one is an install step (pip install -e '.[test]'), not a skip.
import onnxruntime_genai as og  # noqa: E402

PROMPTS = ["hello world", "models speak in tokens: numbers and words"]


@pytest.fixture(scope="module")
def package_dir(parts, tmp_path_factory):
    return hfx.package(tmp_path_factory.mktemp("ort-genai") / "llama", parts, consumer="ort-genai",
                       tokenizer=zoo.tokenizer())


def _eager_new_tokens(model, prompts: list[str], count: int) -> list[list[int]]:
    ids = zoo.tokenizer()(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=count, min_new_tokens=count, do_sample=False)
    return out[:, ids["input_ids"].shape[1]:].tolist()


def _genai_new_tokens(directory, prompts: list[str], count: int) -> list[list[int]]:
    """Greedy tokens of genai's own Generator on genai's own tokenization of ``prompts``."""
    model = og.Model(str(directory))
    tokens = og.Tokenizer(model).encode_batch(prompts)
    length = tokens.shape()[1]  # genai pads the batch to its longest prompt
    params = og.GeneratorParams(model)
    # min_length: a random model may say EOS early; both sides then go on alike.
    params.set_search_options(batch_size=len(prompts), max_length=length + count, min_length=length + count)
    generator = og.Generator(model, params)
    generator.append_tokens(tokens)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][length:] for i in range(len(prompts))]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_genai_generates_the_eager_tokens(llama, package_dir, prompt):
    assert _genai_new_tokens(package_dir, [prompt], 8) == _eager_new_tokens(llama, [prompt], 8)


def test_genai_generates_the_eager_tokens_for_a_padded_batch(llama, package_dir):
    assert _genai_new_tokens(package_dir, PROMPTS, 6) == _eager_new_tokens(llama, PROMPTS, 6)


def test_genai_tokenizer_reads_the_tokenizer_files_as_transformers_does(package_dir):
    tokenizer = og.Tokenizer(og.Model(str(package_dir)))
    for text in [*PROMPTS, "the quick brown fox!", "hello world, export once"]:
        ids = zoo.tokenizer()(text)["input_ids"]
        assert [int(t) for t in tokenizer.encode(text)] == ids
        # genai drops the first piece's space after BOS, as SentencePiece does.
        assert tokenizer.decode(np.array([1, *ids], dtype=np.int32)) == zoo.tokenizer().decode(ids)


def test_the_package_holds_the_genai_config_one_graph_and_the_tokenizer(package_dir, llama):
    names = {path.name for path in package_dir.iterdir()}
    assert {"genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json", "tokenizer_config.json",
            "config.json", "generation_config.json", "hfx.json"} <= names
    assert [name for name in names if name.endswith(".onnx")] == ["model.onnx"]  # the weights stored once
    config = json.loads((package_dir / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    assert (model["type"], model["context_length"], model["vocab_size"]) == ("llama", 256, 256)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (1, 2, 2)
    assert decoder["filename"] == "model.onnx"
    assert (decoder["head_size"], decoder["hidden_size"], decoder["num_attention_heads"],
            decoder["num_key_value_heads"], decoder["num_hidden_layers"]) == (16, 64, 4, 2, 2)
    assert decoder["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "position_ids": "position_ids", "past_key_names": "past_key_values.layers.%d.keys",
                                 "past_value_names": "past_key_values.layers.%d.values"}
    assert decoder["outputs"] == {"logits": "logits", "present_key_names": "present.layers.%d.keys",
                                  "present_value_names": "present.layers.%d.values"}
    search = config["search"]
    assert (search["do_sample"], search["num_beams"], search["max_length"], search["past_present_share_buffer"]) == (
        False, 1, 256, False)
    manifest = json.loads((package_dir / "hfx.json").read_text())
    assert manifest["components"]["decode"]["files"] == ["model.onnx", "model.onnx.data"]


def test_hfx_loads_the_package_and_generates_the_eager_tokens(llama, package_dir):
    loaded = hfx.load(package_dir)
    assert list(loaded) == ["decode"]
    prompt = zoo.tokenizer()(["hello world", "the lazy dog jumps over"], return_tensors="pt", padding=True)
    want = llama.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(hfx.generate(dict(prompt), loaded, max_new_tokens=6), want)


def test_gpt2_runs_as_a_llama_and_generates_the_eager_tokens(tmp_path):
    # Qwen2, Qwen3, Mistral, Gemma and Phi-3 run as genai's own types: tests/_package/test_families.py.
    model = zoo.build("gpt2")
    parts = pipe(model, hfx.capture(zoo.inputs("gpt2")), hfx.decompose(multi_token_decode=True))
    directory = hfx.package(tmp_path / "gpt2", parts, consumer="ort-genai", tokenizer=zoo.tokenizer())
    assert _genai_new_tokens(directory, PROMPTS[1:], 6) == _eager_new_tokens(model, PROMPTS[1:], 6)


def test_a_lowered_onnx_program_is_packaged_as_it_is(package_dir, parts, tmp_path):
    decode = hfx.load(package_dir)["decode"]
    directory = hfx.package(tmp_path / "p", Components(items={"decode": decode}, meta=parts.meta),
                            consumer="ort-genai", tokenizer=zoo.tokenizer())
    # Written under its own name (renaming a lowered program would build another ONNX Runtime session).
    assert json.loads((directory / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "decode.onnx"
    assert _genai_new_tokens(directory, PROMPTS[:1], 4) == _genai_new_tokens(package_dir, PROMPTS[:1], 4)


def test_what_genai_cannot_load_is_refused(llama, tmp_path):
    tokenizer = zoo.tokenizer()
    split = pipe(llama, hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=False))
    with pytest.raises(ValueError, match=r"ort-genai: it needs one graph.*multi_token_decode=True"):
        hfx.package(tmp_path / "a", split, consumer="ort-genai", tokenizer=tokenizer)
    t5 = pipe(zoo.build("t5"), hfx.capture(zoo.inputs("t5")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"ort-genai: T5ForConditionalGeneration is an encoder-decoder.*decoder-only"):
        hfx.package(tmp_path / "b", t5, consumer="ort-genai", tokenizer=tokenizer)
    mistral = pipe(zoo.build("mistral"), hfx.capture(zoo.inputs("mistral")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"ort-genai: mistral has sliding-window layers.*full sequence"):
        hfx.package(tmp_path / "c", mistral, consumer="ort-genai", tokenizer=tokenizer)
    mixtral = pipe(zoo.build("mixtral"), hfx.capture(zoo.inputs("mixtral")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"ort-genai: model type 'mixtral' is not one.*Package one of \["):
        hfx.package(tmp_path / "d", mixtral, consumer="ort-genai", tokenizer=tokenizer)
    assert not any(tmp_path.iterdir())  # a refused package writes nothing


def test_a_graph_genai_cannot_feed_is_refused(package_dir, parts, llama, tmp_path):
    decode = hfx.load(package_dir)["decode"]
    io = decode.io
    captured = hfx.decompose(hfx.capture(zoo.inputs("llama"), llama), multi_token_decode=True)["decode"]
    extra = attrs.evolve(captured, kwargs={**captured.kwargs, "token_type_ids": captured.kwargs["input_ids"]})
    static = attrs.evolve(io, updates=tuple(name for name in io.input_names if name.startswith("past_key_values.")))
    for changed, match in [(extra, r"takes \['token_type_ids'\], which onnxruntime_genai.Model does not feed"),
                           (attrs.evolve(decode, io=static), "static cache; genai feeds a cache that grows")]:
        programs = Components(items={"decode": changed}, meta=parts.meta)
        with pytest.raises(ValueError, match=f"ort-genai: .*{match}"):
            hfx.package(tmp_path / "p", programs, consumer="ort-genai", tokenizer=zoo.tokenizer())
    assert not any(tmp_path.iterdir())
