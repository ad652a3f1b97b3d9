"""Every public stage has the one calling convention: data, then the subject last (positional-only), options keyword-only, curried."""

from __future__ import annotations

import inspect

import pytest
import torch
from toolz import curry, pipe

import hfx

STAGES = (
    "capture", "decompose", "export", "flatten_signature", "infer_dynamic_shapes", "vision_inputs",
    "lower_to_onnx", "lower_to_pte", "lower_to_ov", "quantize_onnx", "quantize_ov", "quantize_pt2e",
    "calibration_inputs", "verify", "generate", "save",
)


@pytest.mark.parametrize("name", STAGES)
def test_a_stage_is_curried_with_positional_data_and_keyword_options(name):
    stage = getattr(hfx, name)
    assert isinstance(stage, curry), f"{name} is not curried"
    kinds = [p.kind for p in inspect.signature(stage.func).parameters.values()]
    assert kinds, name
    assert inspect.Parameter.VAR_POSITIONAL not in kinds and inspect.Parameter.VAR_KEYWORD not in kinds, name
    assert inspect.Parameter.POSITIONAL_OR_KEYWORD not in kinds, name
    positional = [k for k in kinds if k is inspect.Parameter.POSITIONAL_ONLY]
    assert kinds[: len(positional)] == positional, f"{name}: options come after the positional arguments"


def test_pre_binding_everything_but_the_subject_gives_a_stage_that_pipes(tmp_path):
    model = torch.nn.Linear(3, 2)
    inputs, new = {"input": torch.ones(2, 3)}, {"input": torch.ones(5, 3)}
    report = pipe(model, hfx.capture(inputs), hfx.export(bounds={"batch": (1, 8)}), hfx.verify(model, new))
    assert report.passed
    path = pipe(model, hfx.capture(inputs), hfx.export, hfx.save(tmp_path / "linear"))
    assert hfx.load(path)(**new).shape == (5, 2)
