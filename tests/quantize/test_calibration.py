"""Calibration data: per-component inputs recorded from ``generate`` and the choice of a component's samples."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx._upstream import cache_argument
from hfx.quantize._calibration import graph_feeds, samples_for
from tests.helpers import assert_same_state, state_of


def test_calibration_inputs_record_each_component_call(generative, samples):
    model, parts = generative("llama")
    before = state_of(model)
    data = hfx.calibration_inputs(model, samples[:2], parts, max_new_tokens=3)
    assert list(parts) == ["decode"]  # one graph for prompt and steps: it is calibrated on both
    assert {name: len(calls) for name, calls in data.items()} == {"decode": 6}
    assert [int(call["input_ids"].shape[-1]) for call in data["decode"]] == [5, 1, 1, 9, 1, 1]
    for name, calls in data.items():  # every recorded call is a valid input of its graph
        feeds = graph_feeds(parts[name].io, calls, program=name)
        assert all(len(flat) == len(parts[name].io.inputs) for flat in feeds)
    assert_same_state(model, before)


def test_a_split_prefill_gets_the_prompt_and_the_decode_the_steps(models, samples):
    model = models("llama")
    parts = hfx.export(hfx.decompose(hfx.capture(samples[0], model), multi_token_decode=False))
    data = hfx.calibration_inputs(model, samples[:2], parts, max_new_tokens=3)
    assert [int(call["input_ids"].shape[-1]) for call in data["prefill"]] == [5, 9]
    assert [int(call["input_ids"].shape[-1]) for call in data["decode"]] == [1, 1, 1, 1]
    for name, calls in data.items():
        assert all(len(flat) == len(parts[name].io.inputs) for flat in graph_feeds(parts[name].io, calls, program=name))


def test_a_language_model_that_takes_the_steps_is_calibrated_on_the_prompt_and_each_step(generative):
    model, parts = generative("llava")
    sample = hfx.zoo.inputs("llava", batch=1, sequence=4)
    data = hfx.calibration_inputs(model, [sample], parts, max_new_tokens=3)
    prompt = int(sample["input_ids"].shape[-1])
    assert [int(call["inputs_embeds"].shape[1]) for call in data["language_model"]] == [prompt, 1, 1]
    assert [call[cache_argument(call)].get_seq_length() for call in data["language_model"]] == [0, prompt, prompt + 1]
    assert len(data["embed_tokens"]) == len(data["lm_head"]) == 3  # they serve every step too
    for name, calls in data.items():
        assert all(len(flat) == len(parts[name].io.inputs) for flat in graph_feeds(parts[name].io, calls, program=name))


def test_a_model_that_does_not_generate_is_calibrated_on_the_samples(exported, models):
    parts = hfx.Components(items={"model": exported("bert")})
    sample = {"input_ids": torch.ones(1, 4, dtype=torch.long)}
    assert hfx.calibration_inputs(models("bert"), [sample], parts) == {"model": [sample]}


def test_samples_for_a_component():
    one = {"input_ids": torch.ones(1, 3, dtype=torch.long)}
    assert samples_for(None, "decode", stage="s") is None
    assert samples_for([one], "decode", stage="s") == [one]
    assert samples_for({"decode": [one], "prefill": []}, "decode", stage="s") == [one]


@pytest.mark.parametrize(("calibration", "error", "match"), [
    ({"prefill": [{}]}, ValueError, r"stage: calibration has no inputs for component 'decode' \(it has \['prefill'\]\)"),
    ([], ValueError, "calibration for component 'decode' is empty"),
    ("input_ids", TypeError, "calibration must be a list of input dicts"),
])
def test_samples_for_rejects_what_it_cannot_use(calibration, error, match):
    with pytest.raises(error, match=match):
        samples_for(calibration, "decode", stage="stage")


def test_model_and_samples_give_a_stage_that_pipes(generative, samples):
    model, parts = generative("llama")
    data = pipe(parts, hfx.calibration_inputs(model, samples[:1], max_new_tokens=2))
    assert {name: len(calls) for name, calls in data.items()} == {"decode": 2}


def test_the_old_argument_order_is_a_type_error(generative, samples):
    model, parts = generative("llama")
    with pytest.raises(TypeError, match=r"components \(the last argument\) must be the Components of decompose, got list; "
                                        r"call calibration_inputs\(model, samples, components\)"):
        hfx.calibration_inputs(parts, model, samples[:1])
    with pytest.raises(TypeError, match="samples must be a list of generate-input dicts, got dict"):
        hfx.calibration_inputs(model, samples[0], parts)
