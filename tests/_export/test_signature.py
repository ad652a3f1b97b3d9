"""flatten_signature: one parameter per graph input, constants baked in, the model untouched."""

from __future__ import annotations

import inspect

import torch

import hfx
from hfx import zoo


def test_flat_signature_lists_the_graph_inputs(models):
    model = models("llama")
    flat = hfx.flatten_signature(hfx.capture({**zoo.inputs("llama"), "output_hidden_states": False}, model))
    assert flat.is_flat
    assert list(inspect.signature(flat.module.forward).parameters) == ["input_ids", "attention_mask"]
    assert dict(flat.constants) == {"use_cache": False, "output_hidden_states": False}


def test_flat_view_shares_weights_and_leaves_the_model_alone(models):
    model = models("llama")
    flat = hfx.flatten_signature(hfx.capture(zoo.inputs("llama"), model))
    assert "forward" not in vars(model)
    assert flat.module is not model
    assert dict(flat.module.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert next(flat.module.parameters()) is next(model.parameters())


def test_flat_view_computes_the_model(models):
    model = models("bert")
    inputs = zoo.inputs("bert")
    flat = hfx.flatten_signature(hfx.capture(inputs, model))
    with torch.no_grad():
        assert torch.equal(flat.module(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


def test_flatten_is_idempotent(models):
    flat = hfx.flatten_signature(hfx.capture(zoo.inputs("bert"), models("bert")))
    assert hfx.flatten_signature(flat) is flat


def test_an_explicit_use_cache_is_kept(models):
    flat = hfx.flatten_signature(hfx.capture({**zoo.inputs("llama"), "use_cache": True}, models("llama")))
    assert flat.constants["use_cache"] is True


def test_flatten_maps_over_components(models):
    c = hfx.Components(items={"a": hfx.capture(zoo.inputs("bert"), models("bert"))})
    assert hfx.flatten_signature(c)["a"].is_flat
