"""lower_to_ov and OvProgram: parity with eager, names and shapes, purity, save/load and errors."""

from __future__ import annotations

import importlib.util
import json
import operator
import shutil
import warnings

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from hfx._save import load, save
from hfx._verify import verify
from tests.helpers import PARITY_MODELS, new_inputs

openvino = pytest.importorskip("openvino")

from hfx.backends._openvino import OvProgram, lower_to_ov  # noqa: E402


@pytest.fixture(scope="module")
def lowered(exported):
    """Each parity model lowered once, with the ``Exported``'s outputs on new inputs taken just before."""
    cache: dict[str, tuple[OvProgram, object]] = {}

    def get(name: str) -> tuple[OvProgram, object]:
        if name not in cache:
            before = exported(name)(**new_inputs(name))
            cache[name] = (lower_to_ov(exported(name)), before)
        return cache[name]

    return get


def _linear(out_features: int = 2) -> hfx.Capture:
    torch.manual_seed(0)
    return hfx.capture({"input": torch.randn(2, 3)}, torch.nn.Linear(3, out_features))


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_matches_eager_on_new_shapes(name, models, lowered):
    program, _ = lowered(name)
    report = verify(models(name), new_inputs(name), program)
    assert report.max_abs <= 1e-4, str(report)
    with torch.no_grad():
        assert type(program(**new_inputs(name))) is type(models(name)(**new_inputs(name)))


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_ports_carry_the_iospec_names_and_f32_precision(name, lowered):
    program, _ = lowered(name)
    assert [port.get_names() for port in program.model.inputs] == [{n} for n in program.io.input_names]
    assert [port.get_names() for port in program.model.outputs] == [{n} for n in program.io.output_names]
    assert program._compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32


def test_dynamic_axes_are_bounded_and_static_axes_static(lowered):
    llama, _ = lowered("llama")
    lower, upper = llama.io.bounds["sequence"]
    ids = llama.model.inputs[0].get_partial_shape()
    assert ids[0].is_dynamic and ids[0].get_min_length() == llama.io.bounds["batch"][0]
    assert (ids[1].get_min_length(), ids[1].get_max_length()) == (lower, upper)
    vit, _ = lowered("vit")
    assert str(vit.model.inputs[0].get_partial_shape()) == "[1..,3,32,32]"


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_leaves_the_exported_unchanged(name, exported, lowered):
    _, before = lowered(name)
    after = exported(name)(**new_inputs(name))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)


def test_owns_its_weights():
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4)  # the compiled CPU Gather reads its table in place
    program = lower_to_ov(hfx.capture({"input": torch.tensor([[1, 2, 3]])}, embedding))
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    before = program(input=ids)
    with torch.no_grad():
        embedding.weight.mul_(2)  # training the eager model after lowering must not reach the program
    assert torch.equal(program(input=ids), before)


def test_accepts_a_capture_and_curries():
    program = pipe(_linear(), lower_to_ov(device="CPU"))
    assert isinstance(program, OvProgram) and program.device == "CPU"
    assert program(input=torch.ones(5, 3)).shape == (5, 2)


def test_maps_over_components():
    parts = hfx.Components(items={"a": hfx.export(_linear(2)), "b": _linear(4)})
    programs = lower_to_ov(parts)
    assert isinstance(programs, hfx.Components) and list(programs) == ["a", "b"]
    assert all(isinstance(p, OvProgram) for p in programs.values())
    assert programs["b"](input=torch.ones(1, 3)).shape == (1, 4)


def test_is_quiet(capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower_to_ov(_linear())
    assert [str(w.message) for w in caught] == []
    assert capfd.readouterr() == ("", "")


class _Repeats(torch.nn.Module):
    def forward(self, x, mask):
        doubled = x * 2
        return {"doubled": doubled, "again": doubled, "x": x, "mask": mask}


def test_repeated_and_passed_through_outputs_get_their_own_ports():
    inputs = {"x": torch.randn(2, 3), "mask": torch.tensor([[True, False, True]] * 2)}
    program = lower_to_ov(hfx.capture(inputs, _Repeats()))
    assert [p.get_names() for p in program.model.inputs] == [{"x"}, {"mask"}]
    assert [p.get_names() for p in program.model.outputs] == [{n} for n in program.io.output_names]
    new = {"x": torch.randn(4, 3), "mask": torch.tensor([[False, True, True]] * 4)}
    got = program(**new)
    assert torch.equal(got["doubled"], new["x"] * 2) and torch.equal(got["again"], new["x"] * 2)
    assert torch.equal(got["x"], new["x"]) and torch.equal(got["mask"], new["mask"])


def test_runs_bfloat16_inputs_and_outputs():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    program = lower_to_ov(hfx.capture({"input": torch.randn(2, 3, dtype=torch.bfloat16)}, model))
    x = torch.randn(4, 3, dtype=torch.bfloat16)
    got = program(input=x)
    assert got.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(got.float(), model.float()(x.float()), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("name", ["llama", "vit"])
def test_save_load_round_trip(name, lowered, tmp_path):
    program, _ = lowered(name)
    path = save(tmp_path / name, program)
    manifest = json.loads((path / "hfx.json").read_text())
    entry = manifest["components"]["model"]
    assert entry["runtime"] == "openvino" and entry["files"] == ["openvino_model.xml", "openvino_model.bin"]
    loaded = load(path)
    shutil.rmtree(path)  # the IR's weights are memory-mapped: on Linux the program outlives its files
    assert isinstance(loaded, OvProgram)
    assert (loaded.name, loaded.device, loaded.source_class) == (program.name, program.device, program.source_class)
    assert [p.get_names() for p in loaded.model.outputs] == [p.get_names() for p in program.model.outputs]
    want, got = program(**new_inputs(name)), loaded(**new_inputs(name))
    assert all(torch.equal(want[key], got[key]) for key in want)


def test_missing_openvino_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"hfx\[openvino\]"):
        lower_to_ov(_linear())


def test_unknown_input_is_an_input_error():
    program = lower_to_ov(_linear())
    with pytest.raises(hfx.InputError, match="inptu"):
        program(inptu=torch.ones(1, 3))


def test_rejects_what_it_cannot_lower():
    with pytest.raises(TypeError, match="Exported or a Capture"):
        lower_to_ov(torch.nn.Linear(3, 2))
    with pytest.raises(TypeError, match="device"):
        lower_to_ov(_linear(), device=0)


class _Histogram(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4, min=0, max=1)


def test_conversion_failure_names_stage_component_model_and_op(capfd):
    with pytest.raises(hfx.LoweringError, match=r"\[lower_to_ov\] component 'model' of _Histogram") as info:
        lower_to_ov(hfx.capture({"x": torch.rand(2, 3)}, _Histogram()))
    assert "No conversion rule found for operations: aten.histc.default" in str(info.value)
    assert info.value.__cause__ is not None
    assert capfd.readouterr() == ("", "")


def test_unknown_device_is_a_lowering_error():
    with pytest.raises(hfx.LoweringError, match="of Linear: .*'NO_SUCH_DEVICE'.*Available devices"):
        lower_to_ov(_linear(), device="NO_SUCH_DEVICE")


class _PadToWindow(torch.nn.Module):
    """Pads the last axis to a multiple of 4, as Swin pads to its window: ``operator.mod`` on a dynamic size."""

    def forward(self, x):
        return torch.nn.functional.pad(x, (0, (4 - x.shape[-1] % 4) % 4)) * 2


def test_size_arithmetic_with_mod_converts():
    shapes = hfx.DynamicShapes(axes={"x": {1: "width"}}, bounds={"width": (2, 64)})
    exported = hfx.export(hfx.capture({"x": torch.randn(2, 5)}, _PadToWindow(), dynamic_shapes=shapes))
    assert any(node.target is operator.mod for node in exported.program.graph.nodes)
    program = lower_to_ov(exported)
    for width in (5, 8, 11):
        x = torch.randn(2, width)
        assert torch.equal(program(x=x), _PadToWindow()(x))


def test_lowers_transformers_experts():
    model = zoo.build("mixtral")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("mixtral", batch=2, sequence=7), model))
    report = verify(model, zoo.forward_inputs("mixtral", batch=3, sequence=11), lower_to_ov(exported))
    assert report.max_abs <= 1e-4, str(report)


class _AlibiReshape(torch.nn.Module):
    """Falcon's decode pattern: a [batch * heads, 1, keys] bias viewed back as (batch, -1, 1, keys)."""

    heads = 4

    def forward(self, x, mask):
        bias = (x.repeat_interleave(self.heads, 0)[:, None, :] * mask[:, None, :].repeat_interleave(self.heads, 0))
        return bias.reshape(x.shape[0], -1, 1, x.shape[-1]) + mask[:, None, None, :]


def test_a_view_whose_inferred_size_is_static_keeps_it():
    from hfx.backends._openvino import _static_view_sizes

    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "keys"}, "mask": {0: "batch", 1: "keys"}},
                               bounds={"batch": (1, 8), "keys": (2, 64)})
    exported = hfx.export(hfx.capture({"x": torch.randn(2, 5), "mask": torch.ones(2, 5)}, _AlibiReshape(),
                                      dynamic_shapes=shapes))
    module = exported.program.module()
    _static_view_sizes(module.graph)
    targets = [n.args[1] for n in module.graph.nodes if n.target in (torch.ops.aten.view.default,
                                                                     torch.ops.aten.reshape.default)]
    assert targets and all(-1 not in list(t) for t in targets)
    program = lower_to_ov(exported)
    for batch, keys in ((3, 6), (1, 2)):
        x, mask = torch.randn(batch, keys), torch.rand(batch, keys)
        torch.testing.assert_close(program(x=x, mask=mask), _AlibiReshape()(x, mask))
