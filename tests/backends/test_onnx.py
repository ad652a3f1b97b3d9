"""lower_to_onnx and OnnxProgram: parity on new shapes, graph names, purity, save/load and errors."""

from __future__ import annotations

import importlib.util
import io
import logging
import re
import shutil
import warnings

import pytest
import torch

pytest.importorskip("onnxruntime")

import onnx_ir as ir  # noqa: E402 - after the importorskip
import onnxruntime  # noqa: E402

import hfx  # noqa: E402
from hfx import zoo  # noqa: E402
from hfx._save import load, save  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import ONNX_FIXES, _onnx  # noqa: E402
from hfx.backends._onnx import OnnxProgram, lower_to_onnx  # noqa: E402
from tests.helpers import PARITY_MODELS, new_inputs  # noqa: E402
from tests.tolerances import FP32_PARITY, FP32_SAME_KERNELS  # noqa: E402


@pytest.fixture(scope="module")
def lowered(lowered_onnx):
    """One ``OnnxProgram`` per parity architecture, lowered once per session."""
    return lowered_onnx


@pytest.fixture(scope="module")
def linear():
    """A tiny model, its capture and its export, for the cheap tests."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4).eval()
    capture = hfx.capture({"input": torch.randn(2, 3)}, model)
    return model, capture, hfx.export(capture)


def _dims(value) -> list[int | str]:
    return [d.value if isinstance(d, ir.SymbolicDim) else d for d in value.shape]


# --- output -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_parity_on_new_shapes(name, models, lowered):
    program = lowered(name)
    report = verify(models(name), new_inputs(name), program)
    assert report.max_abs <= FP32_PARITY, str(report)
    with torch.no_grad():
        eager = models(name)(**new_inputs(name), **program.io.constants)
    assert type(program(**new_inputs(name))) is type(eager)


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_graph_has_the_iospec_names_and_dims(name, lowered):
    program = lowered(name)
    graph = program.model.graph
    assert [v.name for v in graph.inputs] == list(program.io.input_names)
    assert [v.name for v in graph.outputs] == list(program.io.output_names)
    for value, spec in zip([*graph.inputs, *graph.outputs], [*program.io.inputs, *program.io.outputs]):
        assert _dims(value) == list(spec.shape), value.name
    assert _dims(graph.inputs[0])[0] == "batch"
    if name != "vit":
        assert _dims(graph.inputs[0]) == ["batch", "sequence"]
    symbols = {d.value for node in graph for v in node.outputs if v.shape for d in v.shape if isinstance(d, ir.SymbolicDim)}
    assert not any(re.search(r"\bs\d+\b", str(s)) for s in symbols), symbols  # no torch symbol is left


def test_output_dim_expressions_follow_the_iospec():
    class Shift(torch.nn.Module):
        def forward(self, input_ids):
            return {"shifted": input_ids[:, 1:] * 2}

    exported = hfx.export(hfx.capture({"input_ids": torch.ones(2, 7)}, Shift()), bounds={"sequence": (3, 64)})
    program = lower_to_onnx(exported)
    assert _dims(program.model.graph.outputs[0]) == ["batch", "sequence - 1"] == list(exported.io.outputs[0].shape)
    assert program(input_ids=torch.ones(3, 5))["shifted"].shape == (3, 4)


def test_capture_is_exported_first(linear):
    model, capture, _ = linear
    program = lower_to_onnx(capture)
    assert isinstance(program, OnnxProgram)
    x = torch.randn(5, 3)
    torch.testing.assert_close(program(input=x), model(x).detach(), atol=FP32_SAME_KERNELS, rtol=0)


def test_components_are_mapped_and_options_curried(linear):
    _, _, exported = linear
    lowered_parts = lower_to_onnx(opset=18)(hfx.Components(items={"a": exported}))
    assert isinstance(lowered_parts, hfx.Components)
    assert list(lowered_parts) == ["a"]
    assert isinstance(lowered_parts["a"], OnnxProgram)
    assert lowered_parts["a"].opset == 18


def test_lowering_is_quiet(linear, capfd):
    _, _, exported = linear
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower_to_onnx(exported)
    out, err = capfd.readouterr()
    assert (out, err, caught) == ("", "", [])


def test_quietly_keeps_prints_warnings_and_logs(capfd):
    logger = logging.getLogger("torch.onnx")
    buffer = io.StringIO()
    with pytest.raises(RuntimeError, match="boom"), _onnx._quietly(buffer):
        print("a print")
        warnings.warn("a warning", UserWarning, stacklevel=1)
        logger.warning("a log record")
        raise RuntimeError("boom")
    assert all(text in buffer.getvalue() for text in ("a print", "a warning", "a log record"))
    assert capfd.readouterr() == ("", "")


# --- the input left unchanged -----------------------------------------------------------------


def test_exported_is_unchanged_by_lowering(exported):
    ex = exported("vit")
    inputs = new_inputs("vit")
    graph, state = str(ex.program.graph), {k: v.clone() for k, v in ex.program.state_dict.items()}
    before, fresh_before = ex(**inputs), ex.program.module()(**inputs)
    lower_to_onnx(ex)
    assert str(ex.program.graph) == graph
    assert all(torch.equal(ex.program.state_dict[k], v) for k, v in state.items())
    assert torch.equal(ex(**inputs).logits, before.logits)
    assert torch.equal(ex.program.module()(**inputs).logits, fresh_before.logits)


# --- save and load ----------------------------------------------------------------------------


def test_save_load_round_trip(lowered, tmp_path):
    program = lowered("llama")
    assert program.fixes == tuple(fix.__name__ for fix in ONNX_FIXES)
    path = save(tmp_path / "llama", program)
    assert {p.name for p in path.iterdir()} == {"hfx.json", "model.onnx", "model.onnx.data"}
    inputs = new_inputs("llama")
    raw = onnxruntime.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    (raw_logits,) = raw.run(["logits"], {k: v.numpy() for k, v in inputs.items()})  # any ONNX tool opens the files
    loaded = load(path)
    shutil.rmtree(path)  # weights under the in-memory limit are read in: the program outlives its files
    assert isinstance(loaded, OnnxProgram)
    assert (loaded.name, loaded.opset, loaded.io, loaded.fixes) == (program.name, program.opset, program.io,
                                                                    program.fixes)
    assert torch.equal(loaded(**inputs).logits, program(**inputs).logits)
    assert torch.equal(torch.from_numpy(raw_logits), program(**inputs).logits)
    assert _dims(loaded.model.graph.inputs[0]) == ["batch", "sequence"]


def test_large_models_go_through_files(lowered, tmp_path, monkeypatch):
    program = lowered("vit")
    save(tmp_path / "vit", program)
    # 10 kB: above the small inline tensors of the saved graph, below vit's ~320 kB of weights.
    monkeypatch.setattr(_onnx, "_IN_MEMORY_LIMIT", 10_000)
    folders, add_entry = [], onnxruntime.SessionOptions.add_session_config_entry

    def record(options, key, value):
        folders.append(value)
        add_entry(options, key, value)

    monkeypatch.setattr(onnxruntime.SessionOptions, "add_session_config_entry", record)
    from_temp_file = OnnxProgram(model=program.model, io=program.io)
    from_saved_files = load(tmp_path / "vit")
    assert any(isinstance(v.const_value, ir.ExternalTensor) for v in from_saved_files.model.graph.initializers.values())
    assert folders == [str((tmp_path / "vit").resolve())]  # the saved files are read in place, not copied
    inputs = new_inputs("vit")
    for candidate in (from_temp_file, from_saved_files):
        assert torch.equal(candidate(**inputs).logits, program(**inputs).logits)


def test_a_loaded_program_over_the_load_limit_reads_its_weights_from_the_saved_file(lowered, tmp_path, monkeypatch):
    program = lowered("vit")
    save(tmp_path / "vit", program)
    monkeypatch.setattr(_onnx, "_LOAD_IN_MEMORY_LIMIT", 10_000)  # below vit's ~320 kB of weights
    loaded = load(tmp_path / "vit")
    weights = [v.const_value for v in loaded.model.graph.initializers.values() if v.const_value is not None]
    assert sum(t.nbytes for t in weights if isinstance(t, ir.ExternalTensor)) > 10_000  # not read into Python
    inputs = new_inputs("vit")
    assert torch.equal(loaded(**inputs).logits, program(**inputs).logits)


# --- errors -----------------------------------------------------------------------------------


def test_missing_runtime_names_the_extra(linear, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else find_spec(name, *a))
    with pytest.raises(ImportError, match=re.escape("hfx[onnx]")):
        lower_to_onnx(linear[2])


def test_unknown_input_is_named(lowered):
    with pytest.raises(hfx.InputError, match="bogus"):
        lowered("llama")(**new_inputs("llama"), bogus=torch.ones(1))


def test_non_exported_subject_is_a_type_error():
    with pytest.raises(TypeError, match="lower_to_onnx takes an Exported or a Capture"):
        lower_to_onnx(torch.nn.Linear(1, 1))


@pytest.mark.parametrize("opset", [17, "18", 999])
def test_bad_opset_is_a_value_error(linear, opset):
    with pytest.raises(ValueError, match="opset"):
        lower_to_onnx(linear[2], opset=opset)


@torch.library.custom_op("hfx_test::no_onnx", mutates_args=())
def _no_onnx(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_no_onnx.register_fake
def _(x):
    return torch.empty_like(x)


class _Untranslatable(torch.nn.Module):
    def forward(self, x):
        return _no_onnx(x) + 1


def test_lowering_failure_names_stage_component_and_model(capfd):
    exported = hfx.export(hfx.capture({"x": torch.ones(2, 3)}, _Untranslatable()))
    with pytest.raises(hfx.LoweringError, match=r"\[lower_to_onnx\] component 'model' of _Untranslatable") as info:
        lower_to_onnx(exported)
    assert "hfx_test.no_onnx" in str(info.value)
    assert info.value.__cause__ is not None
    assert capfd.readouterr() == ("", "")  # the exporter's output went into the error, not the console


def test_model_the_runtime_rejects_is_a_lowering_error():
    model = torch.nn.Linear(3, 4).to(torch.bfloat16)  # ONNX Runtime has no bfloat16 Gemm on CPU
    capture = hfx.capture({"input": torch.ones(2, 3, dtype=torch.bfloat16)}, model)
    with pytest.raises(hfx.LoweringError, match="of Linear: ONNX Runtime could not load the lowered model"):
        lower_to_onnx(capture)


def test_lowers_transformers_experts():
    model = zoo.build("mixtral")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("mixtral", batch=2, sequence=7), model))
    new = zoo.forward_inputs("mixtral", batch=3, sequence=11)
    report = verify(model, new, lower_to_onnx(exported))
    assert report.max_abs <= FP32_PARITY, str(report)


def test_the_fixes_option_wraps_the_export_in_an_extra_fix(linear):
    model, _, exported = linear
    seen = []

    def documented(convert):
        converted = convert()
        seen.append([v.name for v in converted.graph.inputs])  # the fixes before it ran, hfx's names are given
        converted.doc_string = "a Linear"
        return converted

    program = lower_to_onnx(exported, fixes=(*ONNX_FIXES, documented))
    assert seen == [["input"]]
    assert program.model.doc_string == "a Linear"
    assert program.fixes == (*(fix.__name__ for fix in ONNX_FIXES), "documented")
    x = torch.randn(4, 3)
    torch.testing.assert_close(program(input=x), model(x).detach(), atol=FP32_SAME_KERNELS, rtol=0)


def test_no_fixes_lowers_a_plain_model_alike(linear):
    _, _, exported = linear
    program = lower_to_onnx(exported, fixes=())
    assert program.fixes == ()
    x = torch.randn(4, 3)
    assert torch.equal(program(input=x), lower_to_onnx(exported)(input=x))


def test_a_fixes_option_that_is_not_a_tuple_of_callables_is_a_type_error(linear):
    with pytest.raises(TypeError, match=r"lower_to_onnx: fixes must be a tuple of callables, such as "
                                        r"\(\*hfx\.backends\.ONNX_FIXES, my_fix\)"):
        lower_to_onnx(linear[2], fixes=(ONNX_FIXES[0], "bfloat16"))
