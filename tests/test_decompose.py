"""decompose: component names, the exact captured kwargs, no mutation."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import assert_same_state, state_of


@pytest.fixture(scope="module")
def llama_parts(models):
    return hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")))


def test_decoder_only_gives_prefill_and_decode(llama_parts):
    assert list(llama_parts) == ["prefill", "decode"]
    prefill, decode = llama_parts["prefill"], llama_parts["decode"]
    assert prefill.kwargs["input_ids"].shape == (2, 5)
    assert decode.kwargs["input_ids"].shape == (2, 1)
    assert decode.kwargs["attention_mask"].shape == (2, 6)
    assert decode.kwargs["past_key_values"].layers[0].keys.shape[2] == 5
    assert prefill.kwargs["use_cache"] is True and prefill.kwargs["logits_to_keep"] == 1
    assert llama_parts.meta["cache_input"] == "past_key_values"
    assert llama_parts.meta["generation_config"]["eos_token_id"] == 2


def test_prefill_keeps_the_callers_padded_mask(llama_parts):
    assert torch.equal(llama_parts["prefill"].kwargs["attention_mask"], zoo.inputs("llama", batch=2, sequence=5)["attention_mask"])


def test_decode_query_axis_is_static_past_is_dynamic(llama_parts):
    axes = llama_parts["decode"].dynamic_shapes.axes
    assert dict(axes["input_ids"]) == {0: "batch"}
    assert dict(axes["past_key_values.layers.0.keys"]) == {0: "batch", 2: "past_sequence"}
    assert dict(axes["attention_mask"]) == {0: "batch", 1: "total_sequence"}


def test_a_mask_is_added_when_the_caller_gave_none(models):
    ids = zoo.inputs("llama", batch=1, sequence=4)["input_ids"]
    parts = hfx.decompose(hfx.capture({"input_ids": ids}, models("llama")))
    assert "attention_mask" in parts["prefill"].kwargs and "attention_mask" in parts["decode"].kwargs


def test_a_one_token_prompt_still_gives_a_past_of_two(models):
    ids = zoo.inputs("llama", batch=1, sequence=1)["input_ids"]
    parts = hfx.decompose(hfx.capture({"input_ids": ids}, models("llama")))
    assert parts["decode"].kwargs["past_key_values"].layers[0].keys.shape[2] >= 2


def test_encoder_decoder_gives_encoder_prefill_decode(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("t5"), zoo.build("t5")))
    assert list(parts) == ["encoder", "prefill", "decode"]
    assert type(parts["encoder"].module).__name__ == "T5Stack"
    cache = parts["decode"].kwargs["past_key_values"]
    assert cache.self_attention_cache.layers[0].keys.shape[2] >= 2  # past >= 2: no 0/1 specialisation
    assert parts.meta["is_encoder_decoder"] and parts.meta["decoder_start_token_id"] == 0


def test_multi_token_decode_merges_two_steps(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")), multi_token_decode=True)
    assert list(parts) == ["decode"]
    decode = parts["decode"]
    assert decode.kwargs["input_ids"].shape == (2, 2)
    assert decode.dynamic_shapes.bounds["past_sequence"][0] == 0
    assert decode.kwargs["attention_mask"].shape == (2, 7)
    assert dict(decode.dynamic_shapes.axes["input_ids"]) == {0: "batch", 1: "sequence"}


def test_a_model_that_does_not_generate_is_one_component(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("bert"), models("bert")))
    assert list(parts) == ["model"]


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
