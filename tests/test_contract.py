"""The shared call path: inputs checked against the IoSpec, outputs rebuilt as the model's structure."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx._contract import flat_inputs, input_keys, structured_outputs


@pytest.fixture(scope="module")
def io(exported):
    return exported("llama").io


def test_inputs_come_out_in_graph_order(io):
    inputs = zoo.inputs("llama", batch=3, sequence=4)
    flat = flat_inputs(io, {"attention_mask": inputs["attention_mask"], "input_ids": inputs["input_ids"]}, program="p")
    assert torch.equal(flat[0], inputs["input_ids"]) and torch.equal(flat[1], inputs["attention_mask"])
    assert input_keys(io) == ("input_ids", "attention_mask")


def test_integer_inputs_of_another_width_are_converted(io):
    inputs = {k: v.to(torch.int32) for k, v in zoo.inputs("llama").items()}
    assert all(t.dtype == torch.int64 for t in flat_inputs(io, inputs, program="p"))


def test_float_for_int_is_refused(io):
    inputs = {**zoo.inputs("llama"), "input_ids": torch.ones(2, 7)}
    with pytest.raises(hfx.InputError, match="input_ids.*int64.*float32"):
        flat_inputs(io, inputs, program="p")


def test_missing_input_is_named_with_what_was_given(io):
    with pytest.raises(hfx.InputError, match=r"needs input\(s\) \['attention_mask'\].*was given \['input_ids'\]"):
        flat_inputs(io, {"input_ids": torch.ones(1, 2, dtype=torch.long)}, program="p")


def test_rank_and_shared_dims_are_checked(io):
    with pytest.raises(hfx.InputError, match="must have 2 dims"):
        flat_inputs(io, {"input_ids": torch.ones(2, dtype=torch.long), "attention_mask": torch.ones(2, 2)}, program="p")
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(hfx.InputError, match="sequence.*must agree"):
        flat_inputs(io, {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.long)}, program="p")


def test_static_axis_is_checked(exported):
    with pytest.raises(hfx.InputError, match="static 32"):
        exported("vit")(pixel_values=torch.randn(1, 3, 16, 16))


def test_outputs_rebuild_the_model_output(io):
    out = structured_outputs(io, [torch.zeros(1, 2, 256)])
    assert type(out).__name__ == "CausalLMOutputWithPast" and out.logits.shape == (1, 2, 256)


def test_io_spec_round_trips_through_json(io):
    assert hfx.IoSpec.from_json(io.to_json()) == io


def test_a_cache_whose_tensors_were_set_in_another_order_is_read_by_name(generative):
    # A layer flattens its tensors in the order they were set; a hybrid layer (inkling_text) sets them in
    # another order after generate's prefill than after the graph's. The call reads them by name.
    from hfx._generate import initial_cache
    from tests.helpers import CACHE_ARGUMENT

    def reverse_each_layers_attributes(cache):
        for layer in cache.layers:
            items = list(vars(layer).items())
            vars(layer).clear()
            vars(layer).update(reversed(items))  # values before keys

    decode = generative("llama")[1]["decode"]
    inputs = zoo.inputs("llama", batch=2, sequence=5)
    prompt = {**inputs, "position_ids": torch.arange(5).expand(2, 5), CACHE_ARGUMENT: initial_cache(decode, 2, CACHE_ARGUMENT)}
    cache = getattr(decode(**prompt), CACHE_ARGUMENT)
    step = {"input_ids": inputs["input_ids"][:, -1:], "attention_mask": torch.ones(2, 6, dtype=torch.long),
            "position_ids": torch.full((2, 1), 5), CACHE_ARGUMENT: cache}
    reverse_each_layers_attributes(cache)
    reordered = decode(**step).logits
    reverse_each_layers_attributes(cache)
    torch.testing.assert_close(reordered, decode(**step).logits, rtol=0, atol=0)
