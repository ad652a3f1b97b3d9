"""decompose: component names, the exact captured kwargs, no mutation."""

from __future__ import annotations

import copy

import pytest
import torch

import hfx
from hfx import zoo
from hfx._upstream import cache_argument
from tests.helpers import CACHE_ARGUMENT, assert_same_state, state_of
from tests.tolerances import FP32_ONE_BLOCK


@pytest.fixture(scope="module")
def llama_parts(models):
    return hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")), multi_token_decode=False)


def test_decoder_only_gives_prefill_and_decode_when_asked(llama_parts):
    assert list(llama_parts) == ["prefill", "decode"]
    prefill, decode = llama_parts["prefill"], llama_parts["decode"]
    assert prefill.kwargs["input_ids"].shape == (2, 5)
    assert decode.kwargs["input_ids"].shape == (2, 1)
    assert decode.kwargs["attention_mask"].shape == (2, 6)
    assert decode.kwargs[CACHE_ARGUMENT].layers[0].keys.shape[2] == 5
    assert prefill.kwargs["use_cache"] is True and prefill.kwargs["logits_to_keep"] == 1
    assert llama_parts.meta.roles.cache_input == CACHE_ARGUMENT
    assert llama_parts.meta.generation.config["eos_token_id"] == 2


def test_prefill_keeps_the_callers_padded_mask(llama_parts):
    assert torch.equal(llama_parts["prefill"].kwargs["attention_mask"], zoo.inputs("llama", batch=2, sequence=5)["attention_mask"])


def test_decode_query_axis_is_static_past_is_dynamic(llama_parts):
    axes = llama_parts["decode"].dynamic_shapes.axes
    assert dict(axes["input_ids"]) == {0: "batch"}
    assert dict(axes["past_key_values.layers.0.keys"]) == {0: "batch", 2: "past_sequence"}
    assert dict(axes["attention_mask"]) == {0: "batch", 1: "past_sequence + 1"}


def test_a_mask_is_added_when_the_caller_gave_none(models):
    ids = zoo.inputs("llama", batch=1, sequence=4)["input_ids"]
    parts = hfx.decompose(hfx.capture({"input_ids": ids}, models("llama")), multi_token_decode=False)
    assert "attention_mask" in parts["prefill"].kwargs and "attention_mask" in parts["decode"].kwargs
    assert "attention_mask" in hfx.decompose(hfx.capture({"input_ids": ids}, models("llama")))["decode"].kwargs


def test_a_one_token_prompt_still_gives_a_past_of_two(models):
    ids = zoo.inputs("llama", batch=1, sequence=1)["input_ids"]
    parts = hfx.decompose(hfx.capture({"input_ids": ids}, models("llama")))
    assert parts["decode"].kwargs[CACHE_ARGUMENT].layers[0].keys.shape[2] >= 2


def test_an_encoder_decoder_gives_an_encoder_with_the_cross_attention_cache_and_one_decode(models):
    from hfx._capture.cross_cache import EncoderWithCrossCache

    model = zoo.build("t5")
    parts = hfx.decompose(hfx.capture(zoo.inputs("t5"), model))
    assert list(parts) == ["encoder", "decode"]
    assert isinstance(parts["encoder"].module, EncoderWithCrossCache) and parts["encoder"].module.model is model
    decode = parts["decode"]
    cache = decode.kwargs[CACHE_ARGUMENT]
    assert cache.self_attention_cache.layers[0].keys.shape[2] >= 2  # past >= 2: no 0/1 specialisation
    assert decode.dynamic_shapes.bounds["past_sequence"][0] == 0  # and the first step's empty past
    assert parts.meta.generation.is_encoder_decoder and parts.meta.generation.decoder_start_token_id == 0
    # The encoder's cross-attention cache is the one generate() built for the decode step.
    states, cross = parts["encoder"].module(**parts["encoder"].kwargs)
    for ours, theirs in zip(cross.layers, cache.cross_attention_cache.layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys)
        torch.testing.assert_close(ours.values, theirs.values)
    split = hfx.decompose(hfx.capture(zoo.inputs("t5"), model), multi_token_decode=False)
    assert list(split) == ["encoder", "prefill", "decode"]
    assert type(split["encoder"].module).__name__ == "T5Stack"


def test_an_encoder_decoder_whose_first_step_does_more_keeps_its_prefill(models, monkeypatch):
    from hfx._capture import cross_cache

    monkeypatch.setattr(cross_cache, "reproduces_cross_cache", lambda *args: False)
    assert list(hfx.decompose(hfx.capture(zoo.inputs("t5"), models("t5")))) == ["encoder", "prefill", "decode"]
    with pytest.raises(ValueError, match="does more than fill the cross-attention cache"):
        hfx.decompose(hfx.capture(zoo.inputs("t5"), models("t5")), multi_token_decode=True)


def test_a_cross_attention_cache_that_differs_is_not_reproduced(models):
    from hfx._capture.cross_cache import EncoderWithCrossCache, reproduces_cross_cache

    model = models("whisper")
    parts = hfx.decompose(hfx.capture(zoo.inputs("whisper"), model))
    encoder, cache = EncoderWithCrossCache(model, 0), parts["decode"].kwargs[CACHE_ARGUMENT]
    inputs = parts["encoder"].kwargs
    assert reproduces_cross_cache(encoder, inputs, cache)
    shifted = copy.deepcopy(cache)
    shifted.cross_attention_cache.layers[0].keys += 1e-3  # another projection than the encoder's
    assert not reproduces_cross_cache(encoder, inputs, shifted)
    assert not reproduces_cross_cache(encoder, inputs, cache.self_attention_cache)  # no cross-attention part


def test_multi_token_decode_merges_two_steps(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")), multi_token_decode=True)
    assert list(parts) == ["decode"]
    assert list(hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")))) == ["decode"]
    decode = parts["decode"]
    assert decode.kwargs["input_ids"].shape == (2, 2)
    assert decode.dynamic_shapes.bounds["past_sequence"][0] == 0
    assert decode.kwargs["attention_mask"].shape == (2, 7)
    assert dict(decode.dynamic_shapes.axes["input_ids"]) == {0: "batch", 1: "sequence"}


@pytest.mark.parametrize(("name", "why"), [
    ("gemma2", "sliding-window layers trim their past inside the graph"),
    ("mamba", "a state-space layer takes one token per step"),
    ("paligemma", "a multimodal forward that builds its language model's mask takes the features whole"),
])
def test_by_default_a_model_whose_steps_one_graph_cannot_take_keeps_a_prefill(models, name, why):
    parts = hfx.decompose(hfx.capture(zoo.inputs(name), models(name)))
    assert "decode" in parts and "prefill" in parts, why


def test_a_multimodal_model_asked_for_one_graph_it_cannot_have_is_refused(models):
    with pytest.raises(ValueError, match=r"multi_token_decode=True.*PaliGemma.*multi_token_decode=None or False"):
        hfx.decompose(hfx.capture(zoo.inputs("paligemma"), models("paligemma")), multi_token_decode=True)


def test_a_split_prefill_keeps_its_decode_when_asked(models):
    inputs = zoo.inputs("llava", batch=2, sequence=5)
    parts = hfx.decompose(hfx.capture(inputs, models("llava")), multi_token_decode=False)
    assert list(parts) == ["image_encoder", "projector", "embed_tokens", "language_model", "lm_head", "decode"]
    assert parts["language_model"].kwargs["inputs_embeds"].shape[:2] == inputs["input_ids"].shape  # the prompt's call


def test_a_static_cache_keeps_its_prefill(models):
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=24)
    assert "prefill" in hfx.decompose(hfx.capture(zoo.inputs("llama"), models("llama")), generation_config=config)


def test_a_model_that_does_not_generate_is_one_component(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("bert"), models("bert")))
    assert list(parts) == ["model"]
    assert parts.meta.model.class_name == "BertModel" and parts.meta.model.config["model_type"] == "bert"
    assert not parts.meta.generation.config  # nothing to generate with


def test_decompose_changes_nothing(models):
    model = models("llama")
    inputs = zoo.inputs("llama")
    copies = {k: v.clone() for k, v in inputs.items()}
    before = state_of(model)
    hooks = (dict(model._forward_pre_hooks), dict(model._forward_hooks))
    hfx.decompose(hfx.capture(inputs, model))
    assert_same_state(model, before)
    assert (dict(model._forward_pre_hooks), dict(model._forward_hooks)) == hooks
    assert all(torch.equal(inputs[k], copies[k]) for k in inputs)


def test_decompose_error_names_the_stage():
    class NoDecode(torch.nn.Module):
        config = type("C", (), {"is_encoder_decoder": False})()

        def can_generate(self):
            return True

        def generate(self, **kwargs):
            return torch.zeros(1, 1)

    with pytest.raises(hfx.CaptureError, match=r"\[decompose\]"):
        hfx.decompose(hfx.capture({}, NoDecode()))


@pytest.fixture(scope="module")
def llava_parts(models):
    return hfx.decompose(hfx.capture(zoo.inputs("llava", batch=2, sequence=5), models("llava")))


def test_multimodal_splits_into_encoder_projector_embedding_language_model_head(llava_parts, models):
    assert list(llava_parts) == ["image_encoder", "projector", "embed_tokens", "language_model", "lm_head"]
    model = models("llava")
    assert llava_parts["language_model"].module is model.get_decoder()
    assert llava_parts["lm_head"].module is model.get_output_embeddings()
    assert llava_parts["projector"].module is model.model.multi_modal_projector
    assert llava_parts.meta.roles.projectors == {"image": "projector"}
    assert llava_parts.meta.roles.placeholder_tokens == {"image": model.config.image_token_id}


def test_multimodal_parts_take_what_generate_passed_them(llava_parts, models):
    image_tokens = (lambda v: (v.image_size // v.patch_size) ** 2)(models("llava").config.vision_config)
    assert llava_parts["image_encoder"].kwargs["pixel_values"].shape[0] == 2  # every image: the graph is not per image
    assert llava_parts["projector"].kwargs["image_features"].shape[:2] == (2, image_tokens)
    prompt = zoo.inputs("llava", batch=2, sequence=5)["input_ids"]
    assert llava_parts["embed_tokens"].kwargs["input"].shape == prompt.shape
    # Two steps merged, over the past of the prompt and its image tokens; the same graph prefills from an empty cache.
    language_model = llava_parts["language_model"]
    assert language_model.kwargs["inputs_embeds"].shape[:2] == (2, 2)
    assert language_model.kwargs["attention_mask"].shape[1] == language_model.kwargs[cache_argument(language_model.kwargs)].get_seq_length() + 2
    assert language_model.dynamic_shapes.bounds["past_sequence"][0] == 0
    assert dict(language_model.dynamic_shapes.axes["inputs_embeds"]) == {0: "batch", 1: "sequence"}
    assert llava_parts["lm_head"].kwargs["input"].shape[:2] == (2, 1)  # generate keeps the last position's logits
    assert dict(llava_parts["lm_head"].dynamic_shapes.axes["input"]) == {0: "batch", 1: "sequence"}
    assert dict(llava_parts["projector"].dynamic_shapes.axes["image_features"]) == {0: "image_count"}


def test_image_encoder_stops_at_the_projector_and_holds_only_its_weights(llava_parts, models):
    exported = hfx.export(llava_parts["image_encoder"])
    model = models("llava")
    pixels = zoo.inputs("llava", batch=3, sequence=4)["pixel_values"]
    with torch.no_grad():
        hidden = model.model.vision_tower(pixels, output_hidden_states=True).hidden_states[model.config.vision_feature_layer]
    assert torch.allclose(exported(pixel_values=pixels), hidden[:, 1:], atol=FP32_ONE_BLOCK)  # "default": the CLS row dropped
    vision = sum(p.numel() for p in model.model.vision_tower.parameters())
    assert sum(v.numel() for v in exported.program.state_dict.values()) <= vision


def test_packed_image_tower_takes_positions_and_boundaries_computed_outside_the_graph(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("qwen2_vl", batch=2, sequence=5), models("qwen2_vl")))
    assert list(parts) == ["image_encoder", "embed_tokens", "language_model", "lm_head"]
    encoder = parts["image_encoder"]
    assert encoder.module is models("qwen2_vl").model.visual  # no projector child: the tower's merger projects
    assert {"hidden_states", "grid_thw", "position_ids", "cu_seqlens"} <= set(encoder.kwargs)
    how = parts.meta.encoder_inputs["image_encoder"]
    assert how.names == {"hidden_states": "pixel_values", "grid_thw": "image_grid_thw"}
    assert set(how.computed) == {"get_vision_position_ids", "get_vision_attention_seqlens"}
    axes = encoder.dynamic_shapes.axes
    assert axes["hidden_states"] == {0: "image_patches"} and axes["cu_seqlens"] == {0: "image_boundaries"}
    assert parts["language_model"].kwargs["position_ids"].shape[0] == 4  # M-RoPE: text row + (t, h, w)


def test_a_language_model_given_a_mask_built_by_forward_keeps_the_prefill_whole(models):
    # PaliGemma builds a 4D mask (bidirectional over the image prefix) before calling its language model.
    parts = hfx.decompose(hfx.capture(zoo.inputs("paligemma", batch=2, sequence=5), models("paligemma")))
    assert list(parts) == ["image_encoder", "prefill", "decode"]
    assert parts.meta.roles.projectors == {}  # the encoder returns what the prefill reads: the projected features
    encoded = parts["prefill"].kwargs["mm_encoder_outputs"]["image"]
    assert encoded.pooler_output.shape[-1] == models("paligemma").config.text_config.hidden_size
    assert parts["prefill"].kwargs["attention_mask"].ndim == 2


def test_only_a_2d_or_absent_language_model_mask_is_one_generate_can_give():
    from hfx._capture.recording import _takes_prompt_mask

    assert _takes_prompt_mask([{"attention_mask": torch.ones(2, 5)}]) and _takes_prompt_mask([{}])
    assert not _takes_prompt_mask([{"attention_mask": torch.ones(2, 1, 5, 5)}])
    assert not _takes_prompt_mask([{"attention_mask": {"full_attention": torch.ones(2, 1, 5, 5)}}])
