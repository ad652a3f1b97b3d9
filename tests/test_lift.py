"""per_component and by_component: one stage serves one record or many."""

from __future__ import annotations

import functools

import pytest
from toolz import curry, pipe

import hfx
from hfx import ComponentError, Components, by_component, per_component


def _double(x, /, *, by=2):
    return x * by


def test_per_component_maps_in_order_and_passes_options():
    out = per_component(_double)(Components(items={"b": 1, "a": 2}), by=10)
    assert isinstance(out, Components) and list(out.items()) == [("b", 10), ("a", 20)]


def test_per_component_gives_each_component_the_options_read_from_the_whole():
    # lower_to_pte's bounds for a beam search read the generation config; here, each component's share of the total
    def shares(subject, key, options):
        return {**options, "by": options["by"] * subject[key] / sum(subject.values())}

    out = per_component(_double, options_for=shares)(Components(items={"a": 1, "b": 3}), by=8)
    assert dict(out) == {"a": 2.0, "b": 18.0}
    assert per_component(_double, options_for=shares)(3, by=2) == 6  # a single record: the options as given


def test_per_component_leaves_a_single_record_alone():
    assert per_component(_double)(3) == 6


def test_per_component_keeps_the_error_type_and_notes_the_component():
    def fail(x, /):
        raise ValueError("bad value")

    with pytest.raises(ValueError) as info:
        per_component(fail)(Components(items={"prefill": 0, "decode": 1}))
    assert str(info.value) == "bad value"  # the message is the stage's own; the component is a note
    assert info.value.__notes__ == ["in component 'prefill' of fail"]


def test_per_component_lifts_the_last_positional_argument():
    def scale(by, x, /):
        return x * by

    out = per_component(scale)(3, Components(items={"a": 1, "b": 2}))
    assert dict(out) == {"a": 3, "b": 6}


def test_per_component_under_curry_pre_binds_data_and_options():
    stage = curry(per_component(lambda by, x, /, *, plus=0: x * by + plus))
    assert dict(pipe(Components(items={"a": 1}), stage(2, plus=1))) == {"a": 3}


def test_a_domain_error_reaches_the_caller_with_its_type():
    def fail(x, /):
        raise hfx.CaptureError("no graph")

    with pytest.raises(hfx.CaptureError) as info:
        per_component(fail, name="export")(Components(items={"decode": 1}))
    assert info.value.__notes__ == ["in component 'decode' of export"]


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
    with pytest.raises(ComponentError, match=r"^by_component has no stage for component\(s\) \['b'\]") as info:
        stage(Components(items={"a": 1, "b": 1}))
    assert info.value.components == ("b",) and isinstance(info.value, KeyError)


def test_by_component_notes_the_component_and_the_stage():
    def fail(x, /, *, why):
        raise hfx.InputError(why)

    stage = by_component({"a": lambda x: x, "b": functools.partial(fail, why="too long")})
    with pytest.raises(hfx.InputError) as info:
        stage(Components(items={"a": 1, "b": 2}))
    assert str(info.value) == "too long" and info.value.__notes__ == ["in component 'b' of fail"]


def test_components_repr_names_record_types():
    assert repr(Components(items={"a": 1})) == "Components(a=int)"
    assert hfx.Components is Components
