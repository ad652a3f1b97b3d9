"""torch_shapes: DynamicShapes as torch.export Dims, and the parser of torch's suggested fixes."""

from __future__ import annotations

import torch

import hfx
from hfx._export.torch_shapes import derived_dim, refine, to_torch, widen_unit_axes


def test_refine_applies_static_and_bound_fixes():
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 2: "height"}}, bounds={"batch": (1, None), "height": (1, None)})
    message = "Constraints violated\nSuggested fixes:\n  height = 32\n  batch = Dim('batch', min=3, max=16)\n\nmore text"
    refined = refine(shapes, message)
    assert dict(refined.axes["x"]) == {0: "batch"}
    assert refined.bounds == {"batch": (3, 16)}


def test_refine_keeps_a_derived_dim_dynamic_with_the_guards_range():
    shapes = hfx.DynamicShapes(axes={"x": {0: "w"}}, bounds={"w": (1, None)})
    message = ("Constraints violated (w)!\n  - Not all values of w = L['x'].size()[0] in the specified range satisfy "
               "the generated guard 4 <= L['x'].size()[0] and L['x'].size()[0] <= 64\n"
               "Suggested fixes:\n  _w = Dim('_w', min=1, max=16)\n  w = 4*_w\n")
    refined = refine(shapes, message)
    assert dict(refined.axes["x"]) == {0: "w"} and refined.bounds == {"w": (4, 64)}


def test_refine_derives_a_dim_torch_relates_to_another():
    shapes = hfx.DynamicShapes(axes={"k": {2: "past_sequence"}, "attention_mask": {1: "total_sequence"}},
                               bounds={"past_sequence": (1, 2048), "total_sequence": (1, 2048)})
    message = ("Constraints violated (past_sequence, total_sequence)!\nSuggested fixes:\n"
               "  past_sequence = Dim('past_sequence', max=2047)\n  total_sequence = past_sequence + 1\n")
    refined = refine(shapes, message)
    assert dict(refined.axes["attention_mask"]) == {1: "past_sequence + 1"}
    assert refined.bounds == {"past_sequence": (1, 2047)}
    spec = to_torch(refined, {"k": torch.ones(1, 1, 4), "attention_mask": torch.ones(1, 5)})
    assert str(spec["attention_mask"][1]) == str(spec["k"][2] + 1)


def test_refine_makes_an_axis_named_by_a_static_dim_static_too():
    """A one-token step's mask axis is named ``past_sequence + 1`` by decompose; a model whose cache keeps a fixed
    length (HY-V4) makes ``past_sequence`` static, and the mask's axis is then static too, not a dangling name."""
    shapes = hfx.DynamicShapes(axes={"k": {0: "batch", 2: "past_sequence"}, "attention_mask": {1: "past_sequence + 1"}},
                               bounds={"batch": (1, None), "past_sequence": (1, 2048)})
    refined = refine(shapes, "Constraints violated (past_sequence)!\nSuggested fixes:\n  past_sequence = 8\n")
    assert dict(refined.axes["k"]) == {0: "batch"} and dict(refined.axes["attention_mask"]) == {}
    assert refined.bounds == {"batch": (1, None)}
    to_torch(refined, {"k": torch.ones(2, 1, 8), "attention_mask": torch.ones(2, 9)})  # every name is a dim


def test_derived_dim_reads_base_and_offset():
    assert derived_dim("past_sequence + 1") == ("past_sequence", 1)
    assert derived_dim("total_sequence - 2") == ("total_sequence", -2)
    assert derived_dim("batch") == ("batch", 0)


def test_refine_gives_up_without_a_fix_it_can_apply():
    shapes = hfx.DynamicShapes(axes={"x": {0: "w"}}, bounds={"w": (1, None)})
    assert refine(shapes, "Suggested fixes:\n  w = 2*_w\n") is None  # derived, but no guard states its range
    assert refine(shapes, "no fixes here") is None


def test_unit_axes_are_widened_for_tracing_only():
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch"}}, bounds={"batch": (1, None)})
    original = {"x": torch.arange(3.0).reshape(1, 3)}
    widened = widen_unit_axes(shapes, original)
    assert widened["x"].shape == (2, 3) and original["x"].shape == (1, 3)


def test_to_torch_shares_one_dim_per_name():
    shapes = hfx.DynamicShapes(axes={"a": {0: "batch"}, "b": {0: "batch"}}, bounds={"batch": (1, 8)})
    spec = to_torch(shapes, {"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2)})
    assert spec["a"][0] is spec["b"][0] and spec["c"] is None
