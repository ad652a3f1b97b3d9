"""verify: per-output differences against eager on new inputs."""

from __future__ import annotations

import torch

import hfx
from hfx._verify import OutputDiff, Report
from tests.helpers import assert_same_state, new_inputs, state_of


def test_report_lists_every_output(exported, models):
    report = hfx.verify(exported("llama"), models("llama"), new_inputs("llama"))
    assert [d.name for d in report.diffs] == ["logits"]
    assert report.diffs[0].shape == (3, 11, 256)
    assert "PASS" in str(report)


def test_a_difference_beyond_atol_fails():
    report = Report(program="p", atol=1e-4, diffs=[OutputDiff(name="x", shape=(1,), max_abs=1e-3, max_rel=1.0)])
    assert not report.passed and "FAIL" in str(report)


def test_rtol_scales_with_the_outputs_magnitude():
    diff = OutputDiff(name="logits", shape=(1,), max_abs=1.2e-4, max_rel=1e-6, scale=360.0)
    assert not Report(program="p", atol=1e-4, diffs=[diff]).passed
    assert Report(program="p", atol=1e-4, rtol=1e-6, diffs=[diff]).passed  # 1e-4 + 3.6e-4
    assert "rtol 1e-06" in str(Report(program="p", atol=1e-4, rtol=1e-6, diffs=[diff]))


def test_nan_fails():
    report = Report(program="p", atol=1e-4, diffs=[OutputDiff(name="x", shape=(1,), max_abs=float("nan"), max_rel=0.0)])
    assert not report.passed


def test_verify_detects_a_wrong_program(models):
    model = models("bert")
    other = hfx.export(hfx.capture(new_inputs("bert"), hfx.zoo.build("bert", seed=1)))
    assert not hfx.verify(other, model, new_inputs("bert")).passed


def test_verify_changes_nothing(exported, models):
    model = models("bert")
    inputs = new_inputs("bert")
    before = state_of(model)
    copies = {k: v.clone() for k, v in inputs.items()}
    hfx.verify(exported("bert"), model, inputs)
    assert_same_state(model, before)
    assert all(torch.equal(inputs[k], copies[k]) for k in inputs)


def test_verify_maps_over_components(exported, models):
    parts = hfx.Components(items={"m": exported("bert")})
    reports = hfx.verify(parts, models("bert"), {"m": new_inputs("bert")})
    assert reports["m"].passed


class _PerItem(torch.nn.Module):
    """Returns one tensor per batch row in a list, like SmolVLM's image_hidden_states.pooler_output."""

    def forward(self, x):
        return {"y": x * 2, "rows": list(x.split([1, 2]))}  # prompt 0 has one image, prompt 1 two


class _Joined:
    """A program that returns those rows joined, the way a dynamic-batch graph has to."""

    class io:  # noqa: N801
        constants: dict = {}

    def __init__(self, offset: float = 0.0, as_list: bool = False):
        self.offset, self.as_list = offset, as_list

    def __call__(self, x):
        rows = x + self.offset
        return {"y": x * 2, "rows": [rows] if self.as_list else rows}


def test_a_per_item_list_is_compared_with_the_joined_tensor():
    x = torch.randn(3, 4)
    report = hfx.verify(_Joined(), _PerItem(), {"x": x})
    assert [d.name for d in report.diffs] == ["y", "rows"] and report.passed
    assert hfx.verify(_Joined(as_list=True), _PerItem(), {"x": x}).passed
    assert not hfx.verify(_Joined(offset=1.0), _PerItem(), {"x": x}).passed
