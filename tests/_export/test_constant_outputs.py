"""``None`` among a model's outputs: kept in the contract, out of the graph, put back by every runtime's call."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx._export.constant_outputs import constant_outputs, with_constants, without_constant_outputs
from hfx._records import IoSpec


class WithNone(torch.nn.Module):
    """Returns a tuple whose first and third entries are ``None`` (LLaVA's tower ``hidden_states`` at transformers 5.24)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, input: torch.Tensor) -> dict:  # noqa: A002 - the zoo's name for a plain input
        hidden = self.linear(input)
        return {"logits": hidden.relu(), "hidden_states": (None, hidden, None)}


@pytest.fixture(scope="module")
def exported():
    return hfx.export(hfx.capture({"input": torch.ones(2, 3)}, WithNone()))


def test_the_constants_are_in_the_contract_and_the_graph_returns_tensors_only(exported):
    assert exported.io.constant_outputs == ((1, None), (3, None))
    assert exported.io.output_names == ("logits", "hidden_states.1")
    assert constant_outputs(exported.program) == ()
    assert IoSpec.from_json(exported.io.to_json()) == exported.io


def test_with_constants_puts_each_back_at_its_index():
    assert with_constants(["a", "b"], ((1, None), (3, None))) == ["a", None, "b", None]
    assert with_constants(["a"], ()) == ["a"]


def test_a_program_without_constants_is_left_as_it_is():
    program = torch.export.export(torch.nn.Linear(3, 4), (torch.ones(2, 3),))
    assert without_constant_outputs(program) is program


@pytest.mark.parametrize("runtime", ["pt2", "onnx", "ov", "pte"])
def test_every_runtime_returns_the_none_where_eager_has_it(exported, runtime, tmp_path):
    lower = {"pt2": lambda e: e, "onnx": hfx.lower_to_onnx, "ov": hfx.lower_to_ov, "pte": hfx.lower_to_pte}[runtime]
    model, inputs = WithNone(), {"input": torch.randn(3, 3)}
    model.load_state_dict(exported.program.state_dict)
    for program in (lower(exported), hfx.load(hfx.save(tmp_path / runtime, lower(exported)))):
        got, want = program(**inputs), model(**inputs)
        assert got["hidden_states"][0] is None and got["hidden_states"][2] is None
        assert torch.allclose(got["hidden_states"][1], want["hidden_states"][1], atol=1e-6)
        assert torch.allclose(got["logits"], want["logits"], atol=1e-6)
        assert hfx.verify(model, inputs, program).passed
