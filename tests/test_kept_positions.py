"""logits_to_keep: the positions a multi-token decode graph returns logits for, on every runtime and in the packages."""

from __future__ import annotations

import copy

import pytest
import torch

import hfx
from hfx import zoo
from hfx._kept_positions import KEPT_INPUT, with_every_position
from hfx._package.every_position import every_position
from tests.tolerances import FP32_PARITY, FP32_PARITY_RTOL


@pytest.fixture(scope="module")
def llama_onnx(generative):
    model, parts = generative("llama")
    return model, hfx.lower_to_onnx(parts)


def _eager_logits(model, inputs, **kwargs):
    with torch.no_grad():
        return model(**inputs, use_cache=True, **kwargs).logits


def test_a_multi_token_decode_takes_the_positions_as_an_input_of_their_own_dim(models):
    parts = hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), models("llama")))
    decode = parts["decode"]
    assert torch.equal(decode.kwargs[KEPT_INPUT], torch.arange(2))  # the merged step's two tokens
    assert dict(decode.dynamic_shapes.axes[KEPT_INPUT]) == {0: "kept"}
    assert decode.dynamic_shapes.bounds["kept"] == decode.dynamic_shapes.bounds["sequence"]


def test_a_model_that_does_not_honour_a_tensor_of_positions_keeps_every_position(models):
    model = copy.deepcopy(models("llama"))
    base = type(model)

    class EveryPosition(base):
        def forward(self, *args, logits_to_keep=0, **kwargs):  # noqa: ARG002 - a model that reads no positions
            return base.forward(self, *args, logits_to_keep=0, **kwargs)

    model.__class__ = EveryPosition
    decode = hfx.decompose(hfx.capture(zoo.inputs("llama", batch=2, sequence=5), model))["decode"]
    assert decode.kwargs[KEPT_INPUT] == 0  # a constant of the graph, as before
    assert KEPT_INPUT not in decode.dynamic_shapes.axes


@pytest.mark.parametrize("keep", [None, 0, 1, 3, "tensor"])
def test_the_decode_graph_returns_the_positions_transformers_would(llama_onnx, keep):
    # through as_model's forward (an empty cache: the graph prefills), on another batch and length than the capture
    model, programs = llama_onnx
    inputs = zoo.inputs("llama", batch=3, sequence=6)
    given = {} if keep is None else {KEPT_INPUT: torch.tensor([0, 4]) if keep == "tensor" else keep}
    got = hfx.as_model(programs)(**inputs, **given).logits
    want = _eager_logits(model, inputs, **given)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=FP32_PARITY, rtol=FP32_PARITY_RTOL)


def test_generate_asks_the_prompt_for_its_last_position_only(llama_onnx, monkeypatch):
    model, programs = llama_onnx
    seen = []
    run = type(programs["decode"])._run

    def recording(self, flat):
        outputs = run(self, flat)
        seen.append(tuple(outputs[0].shape))
        return outputs

    monkeypatch.setattr(type(programs["decode"]), "_run", recording)
    inputs = zoo.inputs("llama", batch=3, sequence=6)
    tokens = hfx.generate(inputs, programs, max_new_tokens=3)
    assert seen[0] == (3, 1, model.config.vocab_size)  # not the prompt's 6 positions
    expected = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert torch.equal(tokens, expected)


def test_a_call_without_the_positions_gets_every_one():
    keys = ("input_ids", KEPT_INPUT)
    filled = with_every_position(keys, {"input_ids": torch.ones(2, 4, dtype=torch.long)})
    assert torch.equal(filled[KEPT_INPUT], torch.arange(4))
    given = {"input_ids": torch.ones(2, 4, dtype=torch.long), KEPT_INPUT: torch.tensor([3])}
    assert with_every_position(keys, given) is given
    assert KEPT_INPUT not in with_every_position(("input_ids",), {"input_ids": torch.ones(2, 4)})


def test_every_position_takes_the_input_out_of_the_graph_for_a_pipeline_that_feeds_none(llama_onnx):
    model, programs = llama_onnx
    decode = programs["decode"]
    graph = every_position(decode)
    assert KEPT_INPUT in decode.io.input_names  # the program given is not changed
    assert KEPT_INPUT not in graph.io.input_names
    assert KEPT_INPUT not in [value.name for value in graph.model.graph.inputs]
    logits = next(spec for spec in graph.io.outputs if spec.name == "logits")
    assert logits.shape[:2] == ("batch", "sequence")
    assert every_position(graph) is graph
    inputs = zoo.inputs("llama", batch=3, sequence=6)
    got = hfx.as_model(hfx.Components(items={"decode": graph}, meta=programs.meta))(**inputs).logits
    torch.testing.assert_close(got, _eager_logits(model, inputs), atol=FP32_PARITY, rtol=FP32_PARITY_RTOL)


def test_a_stateful_openvino_decode_takes_no_positions(generative):
    _, parts = generative("llama")
    plain = hfx.lower_to_ov(parts["decode"])
    stateful = hfx.lower_to_ov(parts["decode"], stateful=True)
    assert KEPT_INPUT in plain.io.input_names
    assert KEPT_INPUT not in stateful.io.input_names
    assert KEPT_INPUT not in {name for p in stateful.model.get_parameters() for name in p.output(0).get_names()}
    assert not any(name.startswith(KEPT_INPUT) for name in stateful.state)


def test_an_executorch_program_plans_the_kept_positions_for_no_more_than_its_new_tokens(generative):
    from hfx.backends._executorch import pte_bounds

    _, parts = generative("llama")
    assert pte_bounds(parts["decode"], max_sizes={"sequence": 16})["kept"] == (1, 16)
    assert pte_bounds(parts["decode"])["kept"] == (1, pte_bounds(parts["decode"])["sequence"][1])
    assert pte_bounds(parts["decode"], max_sizes={"sequence": 16, "kept": 1})["kept"] == (1, 1)
