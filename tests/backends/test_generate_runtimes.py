"""generate and as_model on every runtime: the lowered prefill/decode (+ encoder) graphs give exactly the eager tokens."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import (
    GENERATIVE_MODELS,
    MARIAN_SHIPPED,
    NEW_TOKENS,
    eager_tokens,
    one_layer,
    packed_image_inputs,
    whisper_speech_parts,
)

# runtime -> (module that must be importable, the lowering's name in hfx)
RUNTIMES = {
    "onnx": ("onnxruntime", "lower_to_onnx"),
    "pte": ("executorch", "lower_to_pte"),
    "ov": ("openvino", "lower_to_ov"),
}


def _lowering(runtime: str):
    module, name = RUNTIMES[runtime]
    pytest.importorskip(module)
    return getattr(hfx, name)


@pytest.fixture(scope="module")
def parts_for(generative, generative_one_layer):
    """``parts_for(runtime, name) -> (model, exported Components)``: the Llama with the zoo's two layers (a cache of
    more than one layer, whose entries must not be mixed up) except on ExecuTorch, every other architecture with one
    layer per stack (``tests.helpers.one_layer``: its own path, cross-attention, image merge or scan, in fewer nodes;
    ExecuTorch lowers ~12 s a layer here)."""
    return lambda runtime, name: (generative if name == "llama" and runtime != "pte" else generative_one_layer)(name)


@pytest.fixture(scope="module")
def lowered(parts_for):
    """``(model, programs)`` per runtime and architecture, each lowered once."""
    cache: dict[tuple[str, str], hfx.Components] = {}

    def get(runtime: str, name: str) -> tuple[torch.nn.Module, hfx.Components]:
        model, parts = parts_for(runtime, name)
        if (runtime, name) not in cache:
            cache[runtime, name] = _lowering(runtime)(parts)
        return model, cache[runtime, name]

    return get


# The Llama's cells are in test_llama_generates_eager_tokens_greedy_and_seeded_and_stores_its_weights_once, which
# uses the same programs: one test per lowering, or xdist would lower it on both workers. On ExecuTorch, whose
# lowering costs ~15 s per graph of a one-layer model here, each path has one cell: Whisper is the encoder-decoder
# (cross-attention cache, encoder outside the loop) and test_packed_image_model_generates_the_eager_tokens the
# vision-language model (image encoder, projector, merged prompt); T5 and LLaVA generate on ExecuTorch in
# benchmarks/coverage.py's generation cells.
_ONE_PATH_PER_PTE_CELL = {("t5", "pte"), ("llava", "pte")}
_GENERATE_CELLS = [(name, runtime) for name in GENERATIVE_MODELS for runtime in RUNTIMES
                   if name != "llama" and (name, runtime) not in _ONE_PATH_PER_PTE_CELL]


# A multimodal model whose language model takes the prompt and the steps: no decode holds a second copy of it.
_SPLIT_PREFILL = ("image_encoder", "projector", "embed_tokens", "language_model", "lm_head")


def _eager(model, inputs, **settings):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, **settings)


@pytest.mark.parametrize(("name", "runtime"), _GENERATE_CELLS)
def test_generate_and_as_model_give_the_eager_tokens(lowered, runtime, name, tmp_path):
    model, programs = lowered(runtime, name)
    if name in ("t5", "whisper"):
        _assert_the_weights_are_stored_once(model, programs, tmp_path / runtime, components=("encoder", "decode"))
    if name == "llava":
        _assert_the_weights_are_stored_once(model, programs, tmp_path / runtime, components=_SPLIT_PREFILL)
    inputs = zoo.inputs(name, batch=2, sequence=9)
    expected = eager_tokens(model, inputs, NEW_TOKENS[name])
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=NEW_TOKENS[name]), expected)
    # transformers' own generate over the same programs: greedy, then 3 beams (the cache reordered each step) on
    # one prompt (3 rows: within ExecuTorch's planned batch of 4), and a forced EOS in the last position.
    view = hfx.as_model(programs)
    assert torch.equal(_eager(view, inputs, max_new_tokens=NEW_TOKENS[name]), expected)
    if name != "llava":
        one = zoo.inputs(name, batch=1, sequence=9)
        assert torch.equal(_eager(view, one, max_new_tokens=8, num_beams=3), _eager(model, one, max_new_tokens=8, num_beams=3))
        forced = {"forced_eos_token_id": model.generation_config.eos_token_id}
        expected = _eager(model, inputs, max_new_tokens=6, **forced)
        assert torch.equal(_eager(view, inputs, max_new_tokens=6, **forced), expected)
        assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=6, settings=forced), expected)
    if name == "whisper":
        _speech_recognition_matches_eager(model, view)



# The shipped settings (beams, forced EOS, bad words) are transformers' generate and hfx.generate over any programs:
# one runtime; Marian's graphs on the others are those of every encoder-decoder cell above.
@pytest.mark.parametrize("runtime", ["onnx"])
def test_marian_with_its_shipped_settings_gives_the_eager_tokens(lowered, runtime):
    model, programs = lowered(runtime, "marian")
    inputs = zoo.inputs("marian", batch=2, sequence=9)
    # transformers' generate over the programs: 4 beams, the forced EOS and the bad words opus-mt ships.
    expected = _eager(model, inputs, max_new_tokens=8, **MARIAN_SHIPPED)
    assert torch.equal(_eager(hfx.as_model(programs), inputs, max_new_tokens=8, **MARIAN_SHIPPED), expected)
    # The lean loop, greedy: the forced EOS lands in the last position, as in eager.
    greedy = {**MARIAN_SHIPPED, "num_beams": 1}
    expected = _eager(model, inputs, max_new_tokens=8, **greedy)
    assert (expected[:, -1] == 2).all()
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=8, settings=greedy), expected)


def _speech_recognition_matches_eager(model, view):
    import numpy as np
    from transformers import pipeline

    tokenizer, features = whisper_speech_parts(model.config)
    audio = np.random.default_rng(1).standard_normal(9000).astype("float32")
    # The pipeline searches 5 beams by default (openai's Whisper does); 3 fit ExecuTorch's planned batch of 4.
    texts = [pipeline("automatic-speech-recognition", model=m, tokenizer=tokenizer, feature_extractor=features)(
        audio, generate_kwargs={"max_new_tokens": 8, "num_beams": 3}) for m in (model, view)]
    assert texts[0] == texts[1] and texts[0]["text"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_packed_image_model_generates_the_eager_tokens(parts_for, runtime):
    model, parts = parts_for(runtime, "qwen2_vl")
    programs = _lowering(runtime)(parts)  # OpenVINO drops the unread image grid input: fed by name
    inputs = packed_image_inputs(model.config, 3, 7, (1, 4, 6))  # other images than the capture's
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=12), eager_tokens(model, inputs, 12))


@pytest.mark.parametrize("runtime", ["pt2", *RUNTIMES])
def test_llama_generates_eager_tokens_greedy_and_seeded_and_stores_its_weights_once(generative, lowered, runtime,
                                                                                     tmp_path):
    model, programs = generative("llama") if runtime == "pt2" else lowered(runtime, "llama")
    _assert_the_weights_are_stored_once(model, programs, tmp_path / runtime)
    padded = zoo.inputs("llama", batch=2, sequence=9)
    assert torch.equal(hfx.generate(padded, programs, max_new_tokens=NEW_TOKENS["llama"]),
                       eager_tokens(model, padded, NEW_TOKENS["llama"]))
    inputs = zoo.inputs("llama", batch=1, sequence=5)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=32), eager_tokens(model, inputs, 32))
    first = hfx.generate(inputs, programs, max_new_tokens=8, do_sample=True, top_k=20, seed=11)
    assert torch.equal(first, hfx.generate(inputs, programs, max_new_tokens=8, do_sample=True, top_k=20, seed=11))
    _as_model_matches_eager_for_each_setting(model, programs)


def _as_model_matches_eager_for_each_setting(model, programs):
    """transformers' generate over ``programs``: the model's default, 3 beams, repetition penalty with no repeated
    bigram, on a left-padded batch of 3; and a streamer that receives the tokens in order."""
    from transformers import pipeline
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.pieces = []

        def put(self, value):
            self.pieces.append(value.reshape(-1))

        def end(self):
            pass

    view = hfx.as_model(programs)
    padded = zoo.inputs("llama", batch=3, sequence=9)  # row 0 left-padded
    one = zoo.inputs("llama", batch=1, sequence=6)
    for inputs, settings in ((padded, {}), (one, {"num_beams": 3}),
                             (padded, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2})):
        expected = _eager(model, inputs, max_new_tokens=10, **settings)
        assert torch.equal(_eager(view, inputs, max_new_tokens=10, **settings), expected), settings
    streamer = Collect()
    tokens = _eager(view, one, max_new_tokens=6, streamer=streamer)
    assert torch.equal(torch.cat(streamer.pieces), tokens[0]) and torch.equal(tokens, _eager(model, one, max_new_tokens=6))
    texts = [pipeline("text-generation", model=m, tokenizer=zoo.tokenizer())(["the cat sat on", "hello"], max_new_tokens=5,
                                                                           do_sample=False) for m in (model, view)]
    assert texts[0] == texts[1]


@pytest.fixture(scope="module")
def static_parts():
    """``(model, config, parts)`` of a one-layer static-cache Llama (the in-place update is per layer alike)."""
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=40)
    model = one_layer("llama")
    return model, config, hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama"), model), generation_config=config))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_static_cache_updates_in_place(static_parts, runtime):
    model, config, parts = static_parts
    programs = _lowering(runtime)(parts)
    decode = programs["decode"]
    assert decode.io.updates and decode.io.outputs[-1].name.startswith("updated.")
    inputs = zoo.inputs("llama", batch=2, sequence=9)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=16, do_sample=False, generation_config=config)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=16), expected)
    # transformers' generate makes 4D masks for a static cache; the graphs still get the 2D one they take.
    assert torch.equal(_eager(hfx.as_model(programs), inputs, max_new_tokens=16), expected)


# Mamba's selective scan exports as a loop-free prefix scan (hfx.patches._ssm.prefix_selective_scan), which every
# runtime lowers, at any batch: on ExecuTorch through patch_edge_validator_list_returns (backends/_executorch_fixes).


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_state_space_model_generates_the_eager_tokens(parts_for, runtime):
    model, parts = parts_for(runtime, "mamba")
    programs = _lowering(runtime)(parts)
    inputs = zoo.inputs("mamba", batch=2, sequence=9)  # the capture is (2, 7)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=16), eager_tokens(model, inputs, 16))
    inputs = zoo.inputs("mamba", batch=1, sequence=20)  # another batch, two chunks of the prefix scan
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=16), eager_tokens(model, inputs, 16))


def _weight_bytes(directory) -> int:
    """Bytes of the saved files that hold weights: external data, OpenVINO .bin, a .pte and its .ptd, a .pt2's weights."""
    import zipfile

    total = 0
    for path in directory.iterdir():
        if path.suffix == ".pt2":
            with zipfile.ZipFile(path) as archive:
                total += sum(i.file_size for i in archive.infolist() if "/data/weights/" in i.filename)
        elif path.suffix in (".data", ".bin", ".pte", ".ptd"):
            total += path.stat().st_size
    return total


def _assert_the_weights_are_stored_once(model, programs, directory, components=("decode",)) -> None:
    """A decomposed model's saved weights are one copy of the model's: no prefill holds a second copy of the
    decoder (a text decoder: one graph for prompt and steps; an encoder-decoder: the encoder, which also computes
    the cross-attention cache, and one decode graph; a multimodal model: its parts, the language model one graph)."""
    assert list(programs) == list(components)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    saved = _weight_bytes(hfx.save(directory, programs))
    # One copy, not two: small norm weights may sit inside the graph file (ONNX, OpenVINO), a .pte also holds its
    # program, ~15% of this tiny model (benchmarks/runtime_speed.py measures the size at a real one), and an
    # encoder-decoder whose encoder and decoder share their token embedding (T5, Marian: 14-17% of these tiny
    # ones) stores it with each graph that embeds tokens.
    assert 0.9 * weights <= saved < 1.5 * weights
