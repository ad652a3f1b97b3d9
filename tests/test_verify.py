"""verify: per-output differences against eager on new inputs."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx._verify import OutputDiff, Report
from tests.helpers import assert_same_state, new_inputs, state_of
from tests.tolerances import FP32_PARITY


def test_report_lists_every_output(exported, models):
    report = hfx.verify(models("llama"), new_inputs("llama"), exported("llama"))
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


def test_equal_infinities_and_nans_are_no_difference_but_one_sided_ones_fail():
    from hfx._verify import _diff

    want = torch.tensor([1.0, -float("inf"), float("nan"), 2.0])
    same = _diff("logits", want.clone(), want)
    assert same.max_abs == 0.0 and same.scale == 2.0  # the scale is the largest finite magnitude, not inf
    assert Report(program="p", atol=1e-4, diffs=[same]).passed
    for wrong in (torch.tensor([1.0, float("nan"), float("nan"), 2.0]),  # NaN where eager masks
                  torch.tensor([1.0, -float("inf"), 0.5, 2.0]),  # a number where eager has NaN
                  torch.tensor([1.0, 0.0, float("nan"), 2.0])):  # a number where eager has -inf
        assert not Report(program="p", atol=1e-4, rtol=1e-3, diffs=[_diff("logits", wrong, want)]).passed


def test_verify_detects_a_wrong_program(models):
    model = models("bert")
    other = hfx.export(hfx.capture(new_inputs("bert"), hfx.zoo.build("bert", seed=1)))
    assert not hfx.verify(model, new_inputs("bert"), other).passed


def test_verify_changes_nothing(exported, models):
    model = models("bert")
    inputs = new_inputs("bert")
    before = state_of(model)
    copies = {k: v.clone() for k, v in inputs.items()}
    hfx.verify(model, inputs, exported("bert"))
    assert_same_state(model, before)
    assert all(torch.equal(inputs[k], copies[k]) for k in inputs)


def test_verify_maps_over_components(exported, models):
    parts = hfx.Components(items={"m": exported("bert")})
    reports = hfx.verify(models("bert"), {"m": new_inputs("bert")}, parts)
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
    report = hfx.verify(_PerItem(), {"x": x}, _Joined())
    assert [d.name for d in report.diffs] == ["y", "rows"] and report.passed
    assert hfx.verify(_PerItem(), {"x": x}, _Joined(as_list=True)).passed
    assert not hfx.verify(_PerItem(), {"x": x}, _Joined(offset=1.0)).passed


def test_verify_model_inputs_is_a_stage_that_pipes(exported, models):
    report = pipe(exported("bert"), hfx.verify(models("bert"), new_inputs("bert"), atol=FP32_PARITY))
    assert isinstance(report, Report) and report.passed


def test_the_old_argument_order_is_a_type_error(exported, models):
    with pytest.raises(TypeError, match=r"program \(the last argument\) must be .*got dict; call verify\(model, inputs, program\)"):
        hfx.verify(exported("bert"), models("bert"), new_inputs("bert"))


def test_a_model_as_the_last_argument_says_so(models):
    with pytest.raises(TypeError, match=r"not the model or its inputs, got BertModel"):
        hfx.verify(models("bert"), new_inputs("bert"), models("bert"))


def test_a_component_without_inputs_is_a_component_error(exported, models):
    parts = hfx.Components(items={"m": exported("bert"), "n": exported("bert")})
    with pytest.raises(hfx.ComponentError, match=r"inputs has no entry for component\(s\) \['n'\]") as info:
        hfx.verify(models("bert"), {"m": new_inputs("bert")}, parts)
    assert info.value.components == ("n",)
