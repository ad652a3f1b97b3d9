"""lower_to_ov and OvProgram: parity with eager, names and shapes, purity, save/load and errors."""

from __future__ import annotations

import importlib.util
import json
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
from tests.tolerances import FP32_PARITY

openvino = pytest.importorskip("openvino")

from hfx.backends import OV_GRAPH_FIXES  # noqa: E402
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
    assert report.max_abs <= FP32_PARITY, str(report)
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


def test_threads_and_the_latency_hint_reach_the_compiled_model():
    import attrs

    from hfx.backends._common import default_threads

    program = lower_to_ov(_linear())
    assert program.threads == default_threads() >= 1
    assert program._compiled.get_property("INFERENCE_NUM_THREADS") == program.threads  # noqa: SLF001
    assert str(program._compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"  # noqa: SLF001
    one = attrs.evolve(lower_to_ov(_linear(), threads=2), threads=1)  # evolve compiles again
    assert one._compiled.get_property("INFERENCE_NUM_THREADS") == 1  # noqa: SLF001
    assert torch.equal(one(input=torch.ones(4, 3)), program(input=torch.ones(4, 3)))
    with pytest.raises(ValueError, match=r"lower_to_ov: threads must be a positive int"):
        lower_to_ov(_linear(), threads=0)


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


def test_runs_bfloat16_inputs_and_outputs():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    program = lower_to_ov(hfx.capture({"input": torch.randn(2, 3, dtype=torch.bfloat16)}, model))
    x = torch.randn(4, 3, dtype=torch.bfloat16)
    got = program(input=x)
    assert got.dtype == torch.bfloat16
    with torch.no_grad():
        # bfloat16 keeps 8 significant bits: each rounding is off by up to 2**-8 = 0.4% of the value, a few of
        # them in series and a sum over the inputs in bf16: 5% of the output's magnitude.
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
    assert loaded.graph_fixes == program.graph_fixes == tuple(fix.__name__ for fix in OV_GRAPH_FIXES)
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


def test_lowers_transformers_experts():
    model = zoo.build("mixtral")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("mixtral", batch=2, sequence=7), model))
    report = verify(model, zoo.forward_inputs("mixtral", batch=3, sequence=11), lower_to_ov(exported))
    assert report.max_abs <= FP32_PARITY, str(report)


def test_the_graph_fixes_option_applies_an_extra_fix_to_the_decomposed_copy():
    capture = _linear()
    seen = []

    def doubled(graph):
        """Double every output: the fix's effect is visible in the program."""
        seen.append(graph)
        output = next(node for node in graph.nodes if node.op == "output")
        with graph.inserting_before(output):
            values = [graph.call_function(torch.ops.aten.mul.Tensor, (value, 2)) for value in output.args[0]]
        output.args = (type(output.args[0])(values),)

    exported = hfx.export(capture)
    program = lower_to_ov(exported, graph_fixes=(*OV_GRAPH_FIXES, doubled))
    assert len(seen) == 1 and seen[0] is not exported.program.graph
    assert program.graph_fixes == (*(fix.__name__ for fix in OV_GRAPH_FIXES), "doubled")
    x = torch.randn(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(program(input=x), 2 * capture.module(x))
        torch.testing.assert_close(exported(input=x), capture.module(x))


def test_a_graph_fixes_option_that_is_not_a_tuple_of_callables_is_a_type_error():
    with pytest.raises(TypeError, match=r"lower_to_ov: graph_fixes must be a tuple of callables, such as "
                                        r"\(\*hfx\.backends\.OV_GRAPH_FIXES, my_fix\)"):
        lower_to_ov(_linear(), graph_fixes=OV_GRAPH_FIXES[0])



def test_an_image_encoder_whose_sizes_input_only_torchs_guards_read_converts():
    # torch 2.14's ExportedProgram.module() adds an input-guard call that reads every input. Qwen2.5-VL's image
    # encoder reads grid_thw only there; OpenVINO dropped it, and counted as read it made the converted model's 5
    # inputs mismatch the program's 6 (newest end of the window).
    from tests.helpers import one_layer

    encoder = hfx.decompose(hfx.capture(zoo.inputs("qwen2_5_vl"), one_layer("qwen2_5_vl")))["image_encoder"]
    exported = hfx.export(encoder)
    program = lower_to_ov(exported)
    got, want = program(**encoder.kwargs), exported(**encoder.kwargs)
    torch.testing.assert_close(dict(got), dict(want), rtol=0, atol=FP32_PARITY)


def _wide_head_llama() -> tuple[torch.nn.Module, hfx.Exported]:
    """A one-layer Llama with 4 heads of 128 (the size of Llama 3 8B's heads), exported at 2 x 7."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=512, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 7))
    return model, hfx.export(hfx.capture({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, model))


def test_attention_with_128_wide_heads_gives_eagers_logits_on_this_cpu():
    from hfx.backends._openvino import compile_options
    from hfx.backends._openvino_probes import snippets_miscompute_zeroed_attention

    model, exported = _wide_head_llama()
    program = lower_to_ov(exported)
    # Snippets are off exactly where the probe finds them computing this attention wrong, and not for the
    # stateful form, whose attention runs in the plugin's cache-fused node.
    assert ("SNIPPETS_MODE" in compile_options(stateful=False)) is snippets_miscompute_zeroed_attention()
    assert "SNIPPETS_MODE" not in compile_options(stateful=True)
    assert "SNIPPETS_MODE" not in compile_options(stateful=False, device="GPU")
    ids = torch.randint(0, 128, (3, 11))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: rows that attend to nothing come out as zeros, as in eager
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(program(input_ids=ids, attention_mask=mask).logits, want, rtol=FP32_PARITY,
                               atol=FP32_PARITY)


def test_the_snippets_probe_agrees_with_the_llama_compiled_with_snippets():
    """Canary both ways: the probe finds the fault exactly where the plugin's snippets get the Llama wrong; when an
    OpenVINO release computes it right, the probe says so and the workaround goes away by itself."""
    from hfx.backends._openvino_probes import snippets_miscompute_zeroed_attention

    model, exported = _wide_head_llama()
    program = lower_to_ov(exported)
    with_snippets = openvino.Core().compile_model(program.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ids = torch.randint(0, 128, (2, 7))
    request = with_snippets.create_infer_request()
    request.infer({"input_ids": ids.numpy(), "attention_mask": torch.ones_like(ids).numpy()})
    got = torch.from_numpy(request.get_output_tensor(0).data.copy())
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (not torch.allclose(got, want, rtol=1e-3, atol=1e-3)) is snippets_miscompute_zeroed_attention()


def test_the_kept_inputs_are_matched_by_name_where_openvino_keeps_an_unread_one():
    # PP-FormulaNet's forward reads neither input_ids nor attention_mask; OpenVINO dropped the first and kept the second
    from types import SimpleNamespace

    from hfx._records import IoSpec, TensorSpec
    from hfx.backends._openvino import _kept_input_specs

    specs = tuple(TensorSpec(name=name, dtype="int64", shape=("batch", "sequence"))
                  for name in ("input_ids", "attention_mask", "decoder_input_ids"))
    io = IoSpec(inputs=specs, outputs=specs[:1], in_spec="", out_spec="")
    placeholders = [SimpleNamespace(name=spec.name, users={} if spec.name != "decoder_input_ids" else {"embedding": None})
                    for spec in specs]
    model = SimpleNamespace(inputs=[SimpleNamespace(get_names=lambda name=name: {name})
                                    for name in ("attention_mask", "decoder_input_ids")])
    assert _kept_input_specs(model, io, placeholders) == [specs[1], specs[2]]
    unnamed = SimpleNamespace(inputs=[SimpleNamespace(get_names=set)])
    assert _kept_input_specs(unnamed, io, placeholders) == [specs[2]]  # the read one, where names do not tell
