"""as_model: transformers' own generate() and pipeline() over exported graphs give eager's tokens and text.

The programs here are the exported (torch.export) components; tests/backends/test_generate_runtimes.py runs the
same table on ONNX Runtime, ExecuTorch and OpenVINO.
"""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import (
    MARIAN_SHIPPED,
    llava_processor,
    one_layer,
    whisper_speech_parts,
)

# A table of generation settings -> what each exercises in transformers' generate.
LLAMA_SETTINGS = {
    "default": {},
    "beam search, 3 beams": {"num_beams": 3},
    "beams returned": {"num_beams": 3, "num_return_sequences": 2, "length_penalty": 0.5},
    "repetition penalty and no repeated bigram": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    "minimum length, suppressed and bad tokens": {"min_new_tokens": 10, "suppress_tokens": [5, 6],
                                                  "bad_words_ids": [[7], [8, 9]]},
}
ENCODER_DECODERS = ("t5", "bart", "marian", "whisper")


def _eager(model, inputs, **settings):
    with torch.no_grad():
        return model.generate(**inputs, **settings)


def test_as_model_is_the_model_class_with_no_weights(generative):
    model, parts = generative("llama")
    view = hfx.as_model(parts)
    assert type(view).__name__ == type(model).__name__ and isinstance(view, type(model))
    assert all(t.is_meta for t in (*view.parameters(), *view.buffers()))  # it holds what the runtime holds
    assert view.generation_config.to_dict() == model.generation_config.to_dict()
    assert view.device == torch.device("cpu")


@pytest.mark.parametrize("setting", list(LLAMA_SETTINGS))
def test_llama_generates_eager_tokens_for_each_setting_on_a_left_padded_batch_of_three(generative, setting):
    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=3, sequence=9)  # row 0 left-padded
    settings = {"max_new_tokens": 12, "do_sample": False, **LLAMA_SETTINGS[setting]}
    assert torch.equal(_eager(hfx.as_model(parts), inputs, **settings), _eager(model, inputs, **settings))


def test_seeded_sampling_draws_the_eager_tokens(generative):
    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=2, sequence=7)
    settings = {"max_new_tokens": 10, "do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 1.3}
    torch.manual_seed(5)
    expected = _eager(model, inputs, **settings)
    torch.manual_seed(5)
    assert torch.equal(_eager(hfx.as_model(parts), inputs, **settings), expected)


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_encoder_decoders_beam_search_gives_the_eager_tokens(generative, name):
    model, parts = generative(name)
    inputs = zoo.inputs(name, batch=2, sequence=9)
    for settings in ({"do_sample": False}, {"num_beams": 3, "do_sample": False}):
        expected = _eager(model, inputs, max_new_tokens=10, **settings)
        assert torch.equal(_eager(hfx.as_model(parts), inputs, max_new_tokens=10, **settings), expected), settings


def test_a_streamer_receives_the_tokens_in_order(generative):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.pieces, self.ended = [], False

        def put(self, value):
            self.pieces.append(value.reshape(-1))

        def end(self):
            self.ended = True

    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=1, sequence=6)
    streamer = Collect()
    tokens = _eager(hfx.as_model(parts), inputs, max_new_tokens=9, do_sample=False, streamer=streamer)
    assert streamer.ended and torch.equal(torch.cat(streamer.pieces), tokens[0])
    assert torch.equal(tokens, _eager(model, inputs, max_new_tokens=9, do_sample=False))


def test_stopping_criteria_stop_where_eager_stops(generative):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AtToken(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == stop

    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=1, sequence=6)
    stop = int(_eager(model, inputs, max_new_tokens=8, do_sample=False)[0, 6 + 3])
    expected = _eager(model, inputs, max_new_tokens=8, do_sample=False, stopping_criteria=StoppingCriteriaList([AtToken()]))
    got = _eager(hfx.as_model(parts), inputs, max_new_tokens=8, do_sample=False,
                 stopping_criteria=StoppingCriteriaList([AtToken()]))
    assert torch.equal(got, expected) and got.shape[1] <= 6 + 4



@pytest.fixture(scope="module")
def marian_shipped():
    """A Marian with opus-mt's generation config, decomposed and exported: the config travels with the export."""
    model = zoo.build("marian")
    model.generation_config.update(**MARIAN_SHIPPED)
    return model, hfx.export(hfx.decompose(hfx.capture(zoo.inputs("marian"), model)))


def test_the_shipped_generation_config_is_honoured(marian_shipped):
    model, parts = marian_shipped
    inputs = zoo.inputs("marian", batch=2, sequence=9)
    # transformers' generate on the graphs: 4 beams, forced EOS, bad words, as the model ships them.
    assert torch.equal(_eager(hfx.as_model(parts), inputs, max_new_tokens=8), _eager(model, inputs, max_new_tokens=8))
    # hfx.generate cannot search beams: it says so, and with num_beams=1 it forces EOS in the last position.
    with pytest.raises(ValueError, match=r"num_beams=4.*hfx\.as_model"):
        hfx.generate(inputs, parts, max_new_tokens=8)
    expected = _eager(model, inputs, max_new_tokens=8, num_beams=1)
    assert (expected[:, -1] == 2).all()
    assert torch.equal(hfx.generate(inputs, parts, max_new_tokens=8, settings={"num_beams": 1}), expected)


@pytest.mark.parametrize("drafts", ["prompt lookup", "a one-layer draft model"])
def test_assisted_decoding_gives_the_eager_tokens(generative, drafts):
    # The decode graph takes several tokens (the candidates) and the cache is cropped where they are rejected;
    # transformers assists at batch 1 only.
    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=1, sequence=9)
    draft = {"prompt_lookup_num_tokens": 3} if drafts == "prompt lookup" else {"assistant_model": one_layer("llama")}
    settings = {"max_new_tokens": 12, "do_sample": False, **draft}
    assert torch.equal(_eager(hfx.as_model(parts), inputs, **settings), _eager(model, inputs, **settings))


def test_a_loaded_export_searches_beams_like_eager(generative, tmp_path):
    model, parts = generative("t5")
    hfx.save(tmp_path / "t5", parts)
    inputs = zoo.inputs("t5", batch=2, sequence=9)
    settings = {"max_new_tokens": 8, "num_beams": 3, "do_sample": False}
    assert torch.equal(_eager(hfx.as_model(hfx.load(tmp_path / "t5")), inputs, **settings), _eager(model, inputs, **settings))


LOOP_SETTINGS = [s for s in LLAMA_SETTINGS if "beam" not in s]


@pytest.mark.parametrize("setting", LOOP_SETTINGS)
def test_the_lean_loop_applies_transformers_processors(generative, setting):
    model, parts = generative("llama")
    inputs = zoo.inputs("llama", batch=3, sequence=9)
    settings = LLAMA_SETTINGS[setting]
    expected = _eager(model, inputs, max_new_tokens=12, do_sample=False, **settings)
    assert torch.equal(hfx.generate(inputs, parts, max_new_tokens=12, settings=settings), expected)


def test_the_text_generation_pipeline_gives_the_eager_text(generative):
    # transformers 5 removed the text2text-generation pipeline; encoder-decoders are driven by generate above.
    from transformers import pipeline

    tokenizer = zoo.tokenizer()
    prompts = ["the cat sat on", "hello world"]
    model, parts = generative("llama")
    eager = pipeline("text-generation", model=model, tokenizer=tokenizer)(prompts, max_new_tokens=6, do_sample=False)
    ours = pipeline("text-generation", model=hfx.as_model(parts), tokenizer=tokenizer)(prompts, max_new_tokens=6,
                                                                                    do_sample=False)
    assert ours == eager and ours[0][0]["generated_text"] != prompts[0]


def test_the_speech_recognition_pipeline_gives_the_eager_text(generative):
    import numpy as np
    from transformers import pipeline

    model, parts = generative("whisper")
    tokenizer, features = whisper_speech_parts(model.config)
    audio = np.random.default_rng(0).standard_normal(12000).astype("float32")  # 0.75 s
    texts = [pipeline("automatic-speech-recognition", model=m, tokenizer=tokenizer, feature_extractor=features)(
        audio, generate_kwargs={"max_new_tokens": 8}) for m in (model, hfx.as_model(parts))]
    assert texts[0] == texts[1] and texts[0]["text"]


def test_the_image_text_to_text_pipeline_gives_the_eager_text(generative):
    import numpy as np
    from PIL import Image
    from transformers import pipeline

    model, parts = generative("llava")
    processor = llava_processor(model.config)
    image = Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype("uint8"))
    texts = [pipeline("image-text-to-text", model=m, processor=processor)(
        images=image, text="<image> the cat sat", max_new_tokens=6, do_sample=False) for m in (model, hfx.as_model(parts))]
    assert texts[0] == texts[1] and texts[0][0]["generated_text"] != "<image> the cat sat"


def test_as_model_refuses_what_transformers_cannot_drive(generative):
    _, parts = generative("llama")
    with pytest.raises(TypeError, match="Components"):
        hfx.as_model(parts["decode"])
    with pytest.raises(ValueError, match="'decode' component"):
        hfx.as_model(hfx.Components(items={"x": parts["decode"]}, meta=parts.meta))
    with pytest.raises(TypeError, match="settings must be a mapping"):
        hfx.generate(zoo.inputs("llama", batch=1, sequence=4), parts, settings=[("num_beams", 1)])
    with pytest.raises(ValueError, match=r"\['beams'\] are not generation settings"):
        hfx.generate(zoo.inputs("llama", batch=1, sequence=4), parts, settings={"beams": 2})
    runner_shaped = hfx.decompose(hfx.capture(zoo.inputs("llama", batch=1, sequence=4), zoo.build("llama")),
                                  internal_cache_length=16)
    with pytest.raises(ValueError, match=r"internal_cache_length.*Decompose without internal_cache_length"):
        hfx.as_model(runner_shaped)


def test_each_view_class_shows_its_own_forward_signature(generative):
    import inspect

    views = [hfx.as_model(generative(name)[1]) for name in ("llava", "whisper", "llama")]
    originals = [generative(name)[0] for name in ("llava", "whisper", "llama")]
    for view, model in zip(views, originals, strict=True):
        assert inspect.signature(view.forward) == inspect.signature(model.forward)
        assert inspect.signature(view.prepare_inputs_for_generation) == inspect.signature(model.prepare_inputs_for_generation)
