"""per_component and by_component: one stage serves one record or many."""

from __future__ import annotations

import pytest

import hfx
from hfx import ComponentError, Components, by_component, per_component


def _double(x, /, *, by=2):
    return x * by


def test_per_component_maps_in_order_and_passes_options():
    out = per_component(_double)(Components(items={"b": 1, "a": 2}), by=10)
    assert isinstance(out, Components) and list(out.items()) == [("b", 10), ("a", 20)]


def test_per_component_leaves_a_single_record_alone():
    assert per_component(_double)(3) == 6


def test_per_component_names_the_failing_component():
    def fail(x, /):
        raise ValueError("bad value")

    with pytest.raises(ComponentError, match=r"fail failed on component 'decode': bad value") as info:
        per_component(fail)(Components(items={"decode": 1}))
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.component == "decode"


def test_components_is_read_only_and_input_unchanged():
    source = {"a": 1}
    parts = Components(items=source)
    per_component(_double)(parts)
    assert dict(parts) == {"a": 1} and source == {"a": 1}
    with pytest.raises(TypeError):
        parts["b"] = 2  # type: ignore[index]


def test_by_component_runs_one_stage_per_name_and_rejects_unknown():
    stage = by_component({"a": lambda x: x + 1})
    assert dict(stage(Components(items={"a": 1}))) == {"a": 2}
    with pytest.raises(KeyError, match="no stage for component"):
        stage(Components(items={"b": 1}))


def test_components_repr_names_record_types():
    assert repr(Components(items={"a": 1})) == "Components(a=int)"
    assert hfx.Components is Components
