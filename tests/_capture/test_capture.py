"""capture: a private copy of the inputs, checked against the model's forward."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx._capture.capture import accepted_inputs


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


def test_a_packed_image_models_precomputed_inputs_are_accepted_and_their_axes_named(models):
    inputs = zoo.forward_inputs("qwen2_5_vl")
    captured = hfx.capture(inputs, models("qwen2_5_vl"))
    axes = captured.dynamic_shapes.axes
    assert dict(axes["pixel_values"]) == dict(axes["image_position_ids"]) == {0: "image_patches"}
    assert dict(axes["image_grid_thw"]) == {0: "image_count"}
    assert dict(axes["image_cu_window_seqlens"]) == {0: "image_window_boundaries"}
    assert dict(axes["mm_token_type_ids"]) == {0: "batch", 1: "sequence"}
    assert captured.dynamic_shapes.bounds["image_boundaries"] == (2, None)  # at least one image


def test_without_precomputed_inputs_the_shapes_are_left_to_export(models):
    assert hfx.capture(zoo.inputs("qwen2_vl"), models("qwen2_vl")).dynamic_shapes is None
    explicit = hfx.DynamicShapes(axes={"input_ids": {0: "batch"}}, bounds={"batch": (1, 8)})
    given = hfx.capture(zoo.forward_inputs("qwen2_vl"), models("qwen2_vl"), dynamic_shapes=explicit)
    assert given.dynamic_shapes is explicit


def test_a_precomputed_input_the_tower_does_not_read_is_named(models):
    window = torch.zeros(4, dtype=torch.long)  # Qwen2-VL has no windowed layers
    with pytest.raises(hfx.InputError, match=r"image_window_index"):
        hfx.capture({**zoo.inputs("qwen2_vl"), "image_window_index": window}, models("qwen2_vl"))
