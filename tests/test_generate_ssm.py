"""State-space models (Mamba, Mamba 2, the Bamba hybrid): decompose, export, generate the eager greedy tokens."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx._upstream import graph_name
from hfx import zoo
from tests.helpers import CAPTURE_SHAPE, SSM_CACHE_ARGUMENT, eager_tokens

SSM_MODELS = ("mamba", "mamba2", "bamba")
NEW_TOKENS = 16


@pytest.mark.parametrize("name", SSM_MODELS)
@pytest.mark.parametrize(("batch", "sequence"), [(1, 6), (2, 9)])  # the capture is (2, 7); row 0 of a batch is left-padded
def test_greedy_matches_eager(generative, name, batch, sequence):
    model, parts = generative(name)
    inputs = zoo.inputs(name, batch=batch, sequence=sequence)
    expected = eager_tokens(model, inputs, NEW_TOKENS)
    assert int(expected[:, sequence:].unique().numel()) > 4  # a degenerate model would make the comparison meaningless
    assert torch.equal(hfx.generate(inputs, parts, max_new_tokens=NEW_TOKENS), expected)


@pytest.mark.parametrize("name", SSM_MODELS)
def test_prefill_keeps_batch_and_sequence_dynamic(generative, name):
    _, parts = generative(name)
    io = parts["prefill"].io
    shapes = {spec.name: spec.shape for spec in io.inputs}
    assert shapes["input_ids"] == ("batch", "sequence")
    assert shapes["attention_mask"] == ("batch", "sequence")
    assert io.bounds["batch"][0] == 1 and io.bounds["sequence"][0] == 1


@pytest.mark.parametrize(("name", "batch", "sequence"), [
    ("mamba", 1, 1), ("mamba", 3, 4), ("mamba2", 1, 1), ("mamba2", 2, 8), ("mamba2", 2, 16), ("mamba2", 1, 17),
])
def test_prompts_shorter_than_the_kernel_and_across_chunks_match_eager(generative, name, batch, sequence):
    model, parts = generative(name)  # conv kernel 4, Mamba 2 chunks of 8
    inputs = zoo.inputs(name, batch=batch, sequence=sequence)
    assert torch.equal(hfx.generate(inputs, parts, max_new_tokens=8), eager_tokens(model, inputs, 8))


def test_mamba_decode_takes_the_states_and_no_mask(generative):
    _, parts = generative("mamba")
    assert parts.meta.roles.cache_input == SSM_CACHE_ARGUMENT
    names = [spec.name for spec in parts["decode"].io.inputs]
    assert "attention_mask" not in names  # generate() passes attention_mask=None after the prefill
    top = graph_name(SSM_CACHE_ARGUMENT)  # cache_params up to transformers 5.23; 5.24's ``cache`` is past_key_values
    assert {f"{top}.layers.0.conv_states.0", f"{top}.layers.0.recurrent_states.0"} <= set(names)


def test_a_left_padded_row_generates_what_it_generates_alone(generative):
    _, parts = generative("mamba")  # the prefill zeroes padded positions, so the states start as for the row alone
    inputs = zoo.inputs("mamba", batch=2, sequence=9)
    padding = int((inputs["attention_mask"][0] == 0).sum())
    assert padding > 0
    padded = hfx.generate(inputs, parts, max_new_tokens=8)[0, 9:]
    alone = hfx.generate({"input_ids": inputs["input_ids"][:1, padding:]}, parts, max_new_tokens=8)[0, 9 - padding:]
    assert torch.equal(padded, alone)


def test_export_does_not_write_into_the_captured_cache(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("mamba", **CAPTURE_SHAPE), models("mamba")))
    layer = parts["prefill"].kwargs[SSM_CACHE_ARGUMENT].layers[0]
    before = (dict(layer.has_previous_state), dict(layer.conv_states), dict(layer.recurrent_states))
    hfx.export(parts["prefill"])
    assert (layer.has_previous_state, layer.conv_states, layer.recurrent_states) == before


def test_mamba_prefill_has_no_loop_and_records_how_long_a_prompt_it_takes(generative):
    from hfx.patches._ssm import DEFAULT_PREFIX_SCAN_LENGTH

    _, parts = generative("mamba")  # a loop-free prefix scan: every runtime lowers it
    prefill = parts["prefill"]
    assert not [n for n in prefill.program.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert prefill.io.bounds["sequence"] == (1, DEFAULT_PREFIX_SCAN_LENGTH)  # hfx._contract rejects a longer prompt
