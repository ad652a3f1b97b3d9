"""Every stage leaves the model (parameters, buffers, eager outputs) and the caller's inputs as they were."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import hfx
from tests.helpers import assert_same_state, state_of


class Tiny(torch.nn.Module):
    """A model with a buffer, dropout and a cached attribute, the things tracing tends to leave behind."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.dropout = torch.nn.Dropout(0.5)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = x.shape[0]
        return self.dropout(self.linear(x)) * self.scale


def _stages():
    def lowering(name: str, module: str):
        def run(model, inputs):
            pytest.importorskip(module)
            return getattr(hfx, name)(hfx.capture(inputs, model))

        return run

    return {
        "capture": lambda model, inputs: hfx.capture(inputs, model),
        "flatten_signature": lambda model, inputs: hfx.flatten_signature(hfx.capture(inputs, model)),
        "infer_dynamic_shapes": lambda model, inputs: hfx.infer_dynamic_shapes(hfx.capture(inputs, model)),
        "export": lambda model, inputs: hfx.export(hfx.capture(inputs, model)),
        "lower_to_onnx": lowering("lower_to_onnx", "onnxruntime"),
        "lower_to_pte": lowering("lower_to_pte", "executorch"),
        "lower_to_ov": lowering("lower_to_ov", "openvino"),
        "verify": lambda model, inputs: hfx.verify(model, inputs, hfx.export(hfx.capture(inputs, model))),
    }


@pytest.mark.parametrize("stage", list(_stages()))
def test_stage_leaves_model_and_inputs_unchanged(stage):
    torch.manual_seed(0)
    model = Tiny().train()
    inputs = {"x": torch.randn(2, 4)}
    before_inputs = {k: v.clone() for k, v in inputs.items()}
    before_state = state_of(model)
    with torch.no_grad():
        eager = model.eval()(x=torch.ones(5, 4))
    model.train()
    keys = set(vars(model))
    _stages()[stage](model, inputs)
    assert model.training and set(vars(model)) == keys
    assert_same_state(model, before_state)
    assert inputs.keys() == before_inputs.keys() and all(torch.equal(inputs[k], before_inputs[k]) for k in inputs)
    with torch.no_grad():
        assert torch.equal(model.eval()(x=torch.ones(5, 4)), eager)


def test_a_failing_stage_leaves_model_and_inputs_unchanged():
    class Failing(Tiny):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.scale.add_(1)  # would change the buffer, were it not a fake tensor under tracing
            self.seen = x
            return self.linear(x).nonzero().float().sum() if x.sum() > 0 else x

    model = Failing()
    inputs = {"x": torch.randn(2, 4)}
    before = state_of(model)
    keys = set(vars(model))
    with pytest.raises(hfx.CaptureError):
        hfx.export(hfx.capture(inputs, model))
    assert_same_state(model, before)
    assert set(vars(model)) == keys


def test_hfx_never_imports_the_peer_exporters():
    source = "\n".join(p.read_text() for p in pathlib.Path(hfx.__file__).parent.rglob("*.py"))
    assert not re.search(r"^\s*(from|import)\s+(optimum|transformers\.exporters)", source, re.MULTILINE)
