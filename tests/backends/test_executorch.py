"""``lower_to_pte`` and ``PteProgram``: parity, bounds, purity, generation, save/load and errors.

Lowering a tiny transformer costs 10-30 s, so the module's models have one layer per
stack (``models``) and each parity model is lowered once per module (``lowered``), and one more program, Llama's decode step lowered from
a ``Capture`` with custom ``max_sizes`` (``decode``), serves the bounds and
generation tests. Everything else lowers a ``Linear`` (about 1 s) or nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

import attrs
import pytest
import torch

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx import zoo  # noqa: E402
from hfx._errors import InputError, LoweringError  # noqa: E402
from hfx._save import load, save  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import PTE_PATCHES  # noqa: E402
from hfx.backends._executorch import (  # noqa: E402
    DEFAULT_MAX_SIZE,
    DEFAULT_MAX_SIZES,
    PteProgram,
    lower_to_pte,
    pte_bounds,
)
from tests.helpers import (  # noqa: E402
    CAPTURE_SHAPE,
    PatchGrid,
    TiedHead,
    eager_tokens,
    exported_by_name,
    memoized,
    new_inputs,
    one_layer,
)
from tests.tolerances import FP32_PARITY, FP32_SAME_KERNELS  # noqa: E402

BOUNDED = {"batch": 3, "past_sequence": 48}  # the decode mask is "past_sequence + 1", bounded with it


def _snapshot(exported: hfx.Exported, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    """What lowering must leave alone: graph, bounds, weights, contract and outputs."""
    program = exported.program
    placeholder = next(n for n in program.graph.nodes if n.op == "placeholder")
    shape_env = placeholder.meta["val"].fake_mode.shape_env  # shared by every tensor of the program
    return {
        "graph": str(program.graph),
        "range_constraints": dict(program.range_constraints),
        "shape_env": (dict(shape_env.var_to_range), dict(shape_env.replacements), len(shape_env.guards)),
        "state": {k: v.detach().clone() for k, v in {**program.state_dict, **program.constants}.items()},
        "io": exported.io,
        "outputs": [t.clone() for t in torch.utils._pytree.tree_leaves(exported(**inputs))],
    }


@pytest.fixture(scope="module")
def models():
    """This module's models: the zoo's with one layer per stack (``tests.helpers.one_layer``), which ExecuTorch lowers
    in about half the time of the two-layer ones, through the same operators."""
    return memoized(one_layer)


@pytest.fixture(scope="module")
def exported(models):
    """One ``Exported`` per parity architecture of this module's ``models``, from capture-shaped inputs."""
    return exported_by_name(models)


@pytest.fixture(scope="module")
def lowered(exported):
    """name -> (PteProgram, snapshot of its Exported taken before lowering); each model lowered once."""
    cache: dict[str, tuple[PteProgram, dict[str, object]]] = {}

    def get(name: str) -> tuple[PteProgram, dict[str, object]]:
        if name not in cache:
            before = _snapshot(exported(name), new_inputs(name))
            cache[name] = (lower_to_pte(exported(name)), before)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def split(models):
    """Llama's prefill and one-token decode step (``multi_token_decode=False``), as ``Capture`` records."""
    return hfx.decompose(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), models("llama")), multi_token_decode=False)


@pytest.fixture(scope="module")
def decode(split):
    """The one extra lowering: Llama's decode step, from a ``Capture``, with custom ``max_sizes``."""
    return lower_to_pte(split["decode"], max_sizes=BOUNDED)


@pytest.fixture(scope="module")
def with_pte_decode(split, decode):
    """An exported prefill and the ``.pte`` decode step."""
    return attrs.evolve(split, items={"prefill": hfx.export(split["prefill"]), "decode": decode})


@pytest.fixture(scope="module")
def linear():
    return hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))


# Each lowering serves one test: xdist runs a module's tests on both workers, and a module-scoped program used by
# two tests would be lowered on each.


# The Llama: the other parity models' paths through ExecuTorch are lowered elsewhere, BERT- and ViT-like configs in
# tests/test_properties.py, RoBERTa and ConvNeXt in tests/test_zoo.py's representatives, Qwen3's q/k norms in the
# runner's program (tests/_package/test_families.py); each lowering here would repeat one (~15 s).
@pytest.mark.parametrize("name", ["llama"])
def test_a_lowered_model_matches_eager_keeps_its_exported_and_records_its_bounds(lowered, models, exported, name,
                                                                                 tmp_path):
    program, before = lowered(name)
    _assert_parity_and_eager_structure(program, models(name), name)
    _assert_unchanged(exported(name), before, name)
    _assert_default_bounds(program, exported(name))
    if name == "llama":
        _assert_a_batch_beyond_the_plan_is_an_input_error(program, exported(name))
        _assert_save_and_load_round_trip(program, tmp_path)


def _assert_parity_and_eager_structure(program, model, name) -> None:
    report = verify(model, new_inputs(name), program)
    assert report.max_abs <= FP32_PARITY, str(report)
    got = program(**new_inputs(name))
    want = model(**new_inputs(name), **program.io.constants)
    assert type(got) is type(want)
    assert list(got.keys()) == [k for k, v in want.items() if isinstance(v, torch.Tensor)]


def _assert_unchanged(exported, before, name) -> None:
    """Lowering left the Exported as it was: graph, ranges, shape environment, contract, weights and outputs."""
    after = _snapshot(exported, new_inputs(name))
    assert after["graph"] == before["graph"]
    assert after["range_constraints"] == before["range_constraints"]
    assert after["shape_env"] == before["shape_env"]
    assert after["io"] is before["io"]
    assert after["state"].keys() == before["state"].keys()
    assert all(torch.equal(after["state"][k], v) for k, v in before["state"].items())
    assert all(torch.equal(a, b) for a, b in zip(after["outputs"], before["outputs"], strict=True))


def _assert_default_bounds(program, exported) -> None:
    export_bounds = exported.io.bounds
    assert dict(program.io.bounds) == pte_bounds(exported)
    assert program.io.bounds["batch"] == (1, DEFAULT_MAX_SIZES["batch"])
    if "sequence" in export_bounds:
        assert program.io.bounds["sequence"] == (1, min(export_bounds["sequence"][1] or DEFAULT_MAX_SIZE, DEFAULT_MAX_SIZE))
    assert dict(program.max_sizes) == {k: hi for k, (_, hi) in program.io.bounds.items()}


def _assert_a_batch_beyond_the_plan_is_an_input_error(program, exported) -> None:
    limit = DEFAULT_MAX_SIZES["batch"]
    too_big = zoo.inputs("llama", batch=limit + 1, sequence=5)
    with pytest.raises(InputError, match=rf"\(batch\) is {limit + 1}, outside the program's bounds \[1, {limit}\]") as info:
        program(**too_big)
    assert info.value.__notes__ == [
        f"This .pte was memory-planned for batch <= {limit}. Lower again with "
        f"lower_to_pte(exported, max_sizes={{'batch': {limit + 1}}}) (up to the export's own bound)."
    ]
    exported(**too_big)  # the Exported keeps its own, wider bounds


def _assert_save_and_load_round_trip(program, tmp_path) -> None:
    loaded = load(save(tmp_path / "llama-pte", program))
    assert sorted(p.name for p in (tmp_path / "llama-pte").iterdir()) == ["hfx.json", "model.pte"]
    assert isinstance(loaded, PteProgram)
    assert loaded.buffer == program.buffer and loaded.io == program.io
    assert loaded.patches == program.patches == tuple(p.__name__ for p in PTE_PATCHES)
    inputs = new_inputs("llama")
    assert torch.equal(loaded(**inputs).logits, program(**inputs).logits)


def test_a_bounded_decode_step_from_a_capture_generates_and_refuses_what_its_plan_cannot_hold(with_pte_decode, decode,
                                                                                               models):
    # A Capture is exported first, and max_sizes are respected.
    assert isinstance(decode, PteProgram)
    assert "past_key_values.layers.0.keys" in decode.io.input_names
    assert dict(decode.max_sizes) == BOUNDED
    # The decode step generates the eager tokens.
    programs = with_pte_decode
    inputs = zoo.inputs("llama", batch=BOUNDED["batch"], sequence=11)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=32), eager_tokens(models("llama"), inputs, 32))
    # Generating past the planned cache, or with a batch beyond the plan, is an input error.
    past = BOUNDED["past_sequence"]
    with pytest.raises(InputError, match=rf"\(past_sequence\) is {past + 1}, outside the program's bounds"):
        hfx.generate(zoo.inputs("llama", batch=1, sequence=11), programs, max_new_tokens=past)
    with pytest.raises(InputError, match=r"\(batch\) is 4, outside"):
        hfx.generate(zoo.inputs("llama", batch=4, sequence=5), programs, max_new_tokens=2)


def test_a_waveform_is_planned_for_ten_seconds_or_the_samples_whose_frames_fit(exported):
    # 512 samples (the default of other dims) would refuse any real clip: 32 ms at 16 kHz. The zoo's wav2vec2 makes
    # a frame of 10 samples, so 10 s (16 000 frames of attention) would not even load: its frames stay within 512.
    lo, hi = pte_bounds(exported("wav2vec2"))["audio_length"]
    assert lo <= 20 * CAPTURE_SHAPE["sequence"] and hi // 10 - 1 == DEFAULT_MAX_SIZE and (hi + 1) // 10 - 1 > DEFAULT_MAX_SIZE
    name = "ctc:hubert"  # a 320x feature encoder, as wav2vec2-base's
    model = zoo.build(name)
    hubert = hfx.export(hfx.capture(zoo.forward_inputs(name, **CAPTURE_SHAPE), model))
    assert pte_bounds(hubert)["audio_length"][1] == DEFAULT_MAX_SIZES["audio_length"] == 160_000


def test_max_sizes_above_the_export_bound_is_a_value_error(exported):
    with pytest.raises(ValueError, match=r"max_sizes\['sequence'\] = 4096 is above the export's bound for 'sequence', 128"):
        lower_to_pte(exported("bert"), max_sizes={"sequence": 4096})


@pytest.mark.parametrize(
    ("max_sizes", "match"),
    [
        ({"seqeunce": 8}, r"names dim\(s\) \['seqeunce'\] that 'model' does not have; its dynamic dims are"),
        ({"batch": 0}, r"max_sizes\['batch'\] must be an int >= 1"),
        ({"batch": 2.5}, r"max_sizes\['batch'\] must be an int"),
    ],
)
def test_bad_max_sizes_are_value_errors(exported, max_sizes, match):
    with pytest.raises(ValueError, match=match):
        pte_bounds(exported("bert"), max_sizes=max_sizes)


def test_a_dim_the_bounded_export_pins_keeps_the_one_size_it_runs_at():
    # RADIO (issue 19): exported with [32, 39] px, of which 32 alone runs; lowering exports again with those bounds,
    # where torch pins the dim. The program keeps 32 px and refuses 36 with the bounds (eager's reshape fails there).
    model = PatchGrid()
    exported = hfx.export(hfx.capture({"pixel_values": torch.randn(2, 3, 32, 32)}, model))
    assert exported.io.bounds["height"][0] <= 32 <= exported.io.bounds["height"][1]
    program = lower_to_pte(exported)
    assert program.io.bounds["height"] == program.io.bounds["width"] == (32, 32)
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(program(pixel_values=x), model(x), rtol=0, atol=FP32_SAME_KERNELS)
    with pytest.raises(InputError, match=r"is 36, outside the program's bounds \[32, 32\]"):
        program(pixel_values=torch.randn(1, 3, 36, 32))


def test_components_are_mapped_and_a_dim_of_bound_one_is_static(linear):
    components = hfx.Components(items={"a": linear, "b": linear})
    programs = lower_to_pte(max_sizes={"batch": 1})(components)
    assert isinstance(programs, hfx.Components) and list(programs) == ["a", "b"]
    assert all(isinstance(p, PteProgram) and p.io.bounds["batch"] == (1, 1) for p in programs.values())
    x = torch.randn(1, 3)
    assert torch.allclose(programs["a"](input=x), linear(input=x), atol=FP32_SAME_KERNELS)  # 3 terms
    with pytest.raises(InputError, match="batch"):
        programs["b"](input=torch.randn(2, 3))
    assert f"buffer=<{len(programs['a'].buffer)} bytes>" in repr(programs["a"])  # not the bytes themselves


def test_a_failing_component_keeps_its_error_and_is_named(linear):
    with pytest.raises(ValueError, match=r"names dim\(s\) \['sequence'\]") as info:
        lower_to_pte(hfx.Components(items={"a": linear}), max_sizes={"sequence": 4})
    assert info.value.__notes__ == ["in component 'a' of lower_to_pte"]


def test_lowering_is_quiet(linear, capfd):
    lower_to_pte(linear)
    capfd.readouterr()
    program = lower_to_pte(linear)
    program(input=torch.ones(3, 3))
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_the_runtime_log_is_collected_from_fd_2_and_from_sys_stderr(capfd):
    # ExecuTorch's bindings write part of the native log (XNNPACK's CPU probe on the first load in a process) to
    # sys.stderr, which under pytest or in a notebook is not fd 2: both are collected, the probe kept back.
    from hfx.backends._executorch import _native_stderr

    with _native_stderr() as log:
        sys.stderr.write("[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version\n")
        os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file\n")
        sys.stderr.write("a line of the runtime's own\n")
    assert capfd.readouterr().err == "a line of the runtime's own\n"
    assert log.getvalue().count("cpuinfo_utils") == 2


def test_a_broken_buffer_is_a_lowering_error(linear):
    with pytest.raises(LoweringError, match=r"PteProgram\(model\): the ExecuTorch runtime could not load the program"):
        PteProgram(buffer=b"not a pte", io=linear.io)


def test_an_executorch_failure_is_a_lowering_error(linear, monkeypatch):
    import executorch.exir

    def fail(*args, **kwargs):
        raise RuntimeError("no kernel for aten::frobnicate")

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", fail)
    with pytest.raises(LoweringError, match=r"\[lower_to_pte\] component 'model' of Linear: .*aten::frobnicate") as info:
        lower_to_pte(linear)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_executorch_names_the_extra(linear, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else find_spec(name, *a))
    with pytest.raises(ImportError, match=r"hfx\[executorch\]"):
        lower_to_pte(linear)


def test_the_patches_option_enters_an_extra_patch_around_the_lowering(linear, monkeypatch):
    import executorch.exir

    events = []
    lower = executorch.exir.to_edge_transform_and_lower

    def spied(*args, **kwargs):
        events.append("lowering")
        return lower(*args, **kwargs)

    @contextlib.contextmanager
    def my_patch():
        events.append("enter")
        yield
        events.append("exit")

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", spied)
    program = lower_to_pte(linear, patches=(*PTE_PATCHES, my_patch))
    assert events == ["enter", "lowering", "exit"]
    assert program.patches == (*(p.__name__ for p in PTE_PATCHES), "my_patch")
    assert torch.allclose(program(input=torch.ones(3, 3)), linear(input=torch.ones(3, 3)), atol=FP32_SAME_KERNELS)


def test_a_patches_option_that_is_not_a_tuple_of_callables_is_a_type_error(linear):
    with pytest.raises(TypeError, match=r"lower_to_pte: patches must be a tuple of callables, such as "
                                        r"\(\*hfx\.backends\.PTE_PATCHES, my_fix\)"):
        lower_to_pte(linear, patches=PTE_PATCHES[0])


def test_constant_methods_are_carried_saved_and_loaded(linear, tmp_path):
    from executorch.runtime import Runtime

    program = lower_to_pte(linear, constant_methods={"get_answer": 42, "get_ids": [1, 2], "is_tiny": True})
    assert dict(program.constant_methods) == {"get_answer": 42, "get_ids": [1, 2], "is_tiny": True}
    loaded = Runtime.get().load_program(program.buffer)
    assert loaded.load_method("get_ids").execute([]) == [1, 2] and loaded.load_method("is_tiny").execute([]) == [True]
    assert "aten::linear" not in program.operators  # delegated to XNNPACK
    assert program.weights is None  # nothing tied: the weights stay in the .pte
    again = hfx.load(hfx.save(tmp_path / "p", program))
    assert dict(again.constant_methods) == dict(program.constant_methods)


@pytest.mark.parametrize("methods", [{"forward": 1}, {"get_name": "llama"}, {"get_ids": []}])
def test_bad_constant_methods_are_value_errors(linear, methods):
    with pytest.raises(ValueError, match="constant_methods"):
        lower_to_pte(linear, constant_methods=methods)


@pytest.mark.fresh_exports  # the weights file's folder goes with the last program: the suite's store would keep it
def test_a_tied_embedding_is_stored_once_in_a_weights_file_beside_the_pte(tmp_path):
    """ExecuTorch's portable ``embedding`` kernel and XNNPACK's matmul would each store a tied weight in the ``.pte``;
    kept apart in one ``.ptd``, equal bytes are stored once (Gemma's through ExecuTorch's LLM runner:
    tests/_package/test_families.py)."""
    import gc

    torch.manual_seed(0)
    model = TiedHead().eval()
    exported = hfx.export(hfx.capture({"input_ids": torch.randint(0, 512, (2, 7))}, model))
    program = lower_to_pte(exported)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    embedding = model.embed.weight.numel() * model.embed.weight.element_size()
    assert embedding > 0.8 * weights  # a second copy would make the file > 1.8x
    # The file holds the weights once plus its header and alignment; the .pte only the program.
    assert weights <= program.weights.size < 1.1 * weights
    assert len(program.buffer) < 0.2 * embedding
    directory = hfx.save(tmp_path / "tied", program)
    assert sorted(p.name for p in directory.iterdir()) == ["hfx.json", "model.ptd", "model.pte"]
    ids = torch.randint(0, 512, (3, 5))  # another batch and length than the capture's
    with torch.no_grad():
        expected = model(ids)
    torch.testing.assert_close(hfx.load(directory)(input_ids=ids), expected, atol=FP32_PARITY, rtol=0)
    # The lowering's temporary weights file lives as long as a program refers to it.
    folder = program.weights.path.parent
    evolved = attrs.evolve(program, name="renamed")
    del program
    gc.collect()
    assert folder.is_dir()
    torch.testing.assert_close(evolved(input_ids=ids), expected, atol=FP32_PARITY, rtol=0)
    del evolved
    gc.collect()
    assert not folder.exists()


def test_weights_apart_is_an_option_of_every_program(linear):
    program = lower_to_pte(linear, weights_apart=True)
    assert program.weights is not None and program.weights.size >= 4 * 3 * 4
    weight, bias = linear.program.state_dict.values()
    torch.testing.assert_close(program(input=torch.ones(3, 3)), torch.ones(3, 3) @ weight.T + bias, atol=1e-6, rtol=0)
    with pytest.raises(TypeError, match="weights_apart must be True, False or None"):
        lower_to_pte(linear, weights_apart="yes")


class _Counter(torch.nn.Module):
    """State kept from call to call: a step that starts at 5 and a total that starts at zero."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.full((1,), 5.0), persistent=False)
        self.register_buffer("total", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step.add_(1.0)
        self.total.add_(2.0)
        return x + self.step + self.total


def test_a_buffer_the_model_writes_starts_at_its_eager_value_and_keeps_its_state():
    from hfx.backends._executorch import written_buffers_with_state

    exported = hfx.export(hfx.capture({"x": torch.ones(2, 3)}, _Counter()))
    assert written_buffers_with_state(exported.program.run_decompositions({})) == ["b_step"]  # not the zero total
    program, eager = lower_to_pte(exported), _Counter()
    for _ in range(2):  # ExecuTorch starts a written buffer at zero unless told its value: 3 and 6 here
        torch.testing.assert_close(program(x=torch.zeros(3, 3)), eager(torch.zeros(3, 3)), rtol=0, atol=0)


def test_a_buffer_recast_to_itself_keeps_its_values_on_executorch():
    from tests._export.test_self_writes import _Recast

    model = _Recast()
    program = lower_to_pte(hfx.export(hfx.capture({"x": torch.ones(2, 5)}, model)))
    report = verify(model, {"x": torch.randn(3, 5)}, program)  # zeroed as state, the table read 0 (CTRL: 3.7)
    assert report.passed and report.max_abs == 0, str(report)
