"""capture: a private copy of the inputs, checked against the model's forward."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx._capture import accepted_inputs
from hfx import zoo


def test_capture_copies_inputs_and_keeps_the_model(models):
    model = models("llama")
    inputs = zoo.inputs("llama")
    captured = hfx.capture(inputs, model)
    assert captured.source is model and captured.module is model
    assert list(captured.kwargs) == ["input_ids", "attention_mask"]
    assert captured.kwargs["input_ids"] is not inputs["input_ids"]
    assert torch.equal(captured.kwargs["input_ids"], inputs["input_ids"])


def test_capture_is_a_stage_when_given_inputs_only(models):
    stage = hfx.capture(zoo.inputs("bert"))
    assert isinstance(stage(models("bert")), hfx.Capture)


def test_capture_leaves_the_callers_dict_unchanged(models):
    inputs = zoo.inputs("llama")
    before = {k: v.clone() for k, v in inputs.items()}
    captured = hfx.capture(inputs, models("llama"))
    captured.kwargs["input_ids"].zero_()  # the record's copy, not the caller's tensor
    assert inputs.keys() == before.keys()
    assert all(torch.equal(inputs[k], before[k]) for k in before)


def test_capture_kwargs_are_read_only(models):
    captured = hfx.capture(zoo.inputs("llama"), models("llama"))
    with pytest.raises(TypeError):
        captured.kwargs["x"] = 1  # type: ignore[index]


def test_an_input_the_model_does_not_take_is_named(models):
    with pytest.raises(hfx.InputError, match=r"input_idz"):
        hfx.capture({"input_idz": torch.ones(1, 2, dtype=torch.long)}, models("llama"))


def test_typed_kwargs_are_accepted(models):
    assert "output_hidden_states" in accepted_inputs(models("llama"))
    assert accepted_inputs(torch.nn.Linear(1, 1)) == {"input"}


@pytest.mark.parametrize(("inputs", "model", "match"), [({"x": 1}, object(), "nn.Module"), ([1], torch.nn.Identity(), "mapping")])
def test_bad_arguments_are_type_errors(inputs, model, match):
    with pytest.raises(TypeError, match=match):
        hfx.capture(inputs, model)
