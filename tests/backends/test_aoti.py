"""lower_to_aoti and AotiProgram: parity on new shapes, eager's tokens, purity, threads, save/load and errors.

AOTInductor compiles C++ (tens of seconds a graph, growing with the layers): the one-layer Llama's forward and
its decomposed graphs are compiled once per module, with one thread, and shared by the tests.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import attrs
import pytest
import torch
from toolz import curry
from torch.utils import _pytree as pytree

import hfx
from hfx import zoo
from hfx._contract import flat_inputs
from hfx._pytree import spec_caches
from hfx._cpu import isa_flags
from hfx.backends._aoti import AotiProgram, built_for, lower_to_aoti
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, eager_tokens, new_inputs, one_layer
from tests.tolerances import FP32_PARITY

PROMPT = {"batch": 2, "sequence": 9}
NEW_TOKENS = 8


def _snapshot(exported: hfx.Exported) -> tuple[str, dict[str, torch.Tensor], torch.Tensor, object]:
    """What lowering must leave as it was: the graph, the weights, the outputs on new inputs and the example inputs."""
    state = {k: v.clone() for k, v in exported.program.state_dict.items()}
    return str(exported.program.graph), state, exported(**new_inputs("llama")).logits, exported.program.example_inputs


@pytest.fixture(scope="module")
def small_llama():
    return one_layer("llama")


@pytest.fixture(scope="module")
def forward(small_llama):
    """``(Exported, its snapshot before lowering, AotiProgram)`` of the one-layer Llama's forward, compiled once."""
    ex = hfx.export(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), small_llama))
    before = _snapshot(ex)
    return ex, before, lower_to_aoti(ex, threads=1)


@pytest.fixture(scope="module")
def decomposed(generative_one_layer):
    """``(model, exported Components, compiled Components)`` of the one-layer Llama, compiled once, curried."""
    model, parts = generative_one_layer("llama")
    return model, parts, lower_to_aoti(threads=1)(parts)


# --- output -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [NEW_SHAPE, {"batch": 1, "sequence": 3}])
def test_forward_matches_eager_on_new_shapes(forward, small_llama, shape):
    _, _, program = forward
    inputs = zoo.inputs("llama", **shape)
    report = hfx.verify(small_llama, inputs, program)
    assert report.passed and report.max_abs <= FP32_PARITY, str(report)
    with torch.no_grad():
        eager = small_llama(**inputs, **program.io.constants)
    assert type(program(**inputs)) is type(eager)


def test_decomposed_llama_generates_eager_tokens_and_matches_eager_on_new_shapes(decomposed):
    model, parts, programs = decomposed
    assert isinstance(programs, hfx.Components) and list(programs) == list(parts)
    assert all(isinstance(p, AotiProgram) and p.threads == 1 for p in programs.values())
    for shape in (PROMPT, {"batch": 1, "sequence": 5}):
        prompt = zoo.inputs("llama", **shape)
        assert torch.equal(hfx.generate(prompt, programs, max_new_tokens=NEW_TOKENS),
                           eager_tokens(model, prompt, NEW_TOKENS))
    new = hfx.decompose(hfx.capture(zoo.inputs("llama", **NEW_SHAPE), model))
    reports = hfx.verify(model, {name: dict(new[name].kwargs) for name in programs}, programs)
    assert all(r.passed and r.max_abs <= FP32_PARITY for r in reports.values()), [str(r) for r in reports.values()]


def test_the_flat_call_is_the_decode_on_its_flat_inputs(decomposed):
    model, _, programs = decomposed
    kwargs = dict(hfx.decompose(hfx.capture(zoo.inputs("llama", **NEW_SHAPE), model))["decode"].kwargs)
    call = programs["decode"].flat_call()
    assert call.io is programs["decode"].io
    with spec_caches(call.io):
        flat = flat_inputs(call.io, kwargs, program="test")
        want = pytree.tree_leaves(programs["decode"](**kwargs))
    got = call.run([call.to_runtime(tensor) for tensor in flat])
    assert len(got) == len(want) == len(call.io.outputs)
    assert all(torch.equal(call.to_torch(g), w) for g, w in zip(got, want, strict=True))


def test_threads_are_the_compiled_ones_and_the_callers_pool_is_restored(forward):
    _, _, program = forward
    assert program.threads == 1
    assert program.one_row_matmuls == "aten"  # "auto": the one-layer Llama's weights stay in cache, not measured
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        program(**new_inputs("llama"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(TypeError, match="threads"):
        attrs.evolve(program, threads=2)  # compiled in: another count is another lowering


def test_the_stage_is_curried_with_the_subject_positional_and_options_keyword_only():
    assert isinstance(lower_to_aoti, curry) and hfx.lower_to_aoti is lower_to_aoti
    kinds = [p.kind for p in inspect.signature(lower_to_aoti.func).parameters.values()]
    assert kinds == [inspect.Parameter.POSITIONAL_ONLY] + [inspect.Parameter.KEYWORD_ONLY] * 3


# --- the input left unchanged -----------------------------------------------------------------


def test_lowering_leaves_the_exported_unchanged(forward):
    ex, (graph, state, logits, examples), _ = forward
    assert str(ex.program.graph) == graph
    assert ex.program.state_dict.keys() == state.keys()
    assert all(torch.equal(ex.program.state_dict[k], v) for k, v in state.items())
    assert torch.equal(ex(**new_inputs("llama")).logits, logits)
    assert ex.program.example_inputs is examples  # AOTInductor's example inputs went on a copy


# --- save and load ----------------------------------------------------------------------------


def test_save_writes_the_package_and_load_refuses_it_without_trust(decomposed, tmp_path):
    _, _, programs = decomposed
    path = hfx.save(tmp_path / "llama", programs)
    assert {p.name for p in path.iterdir()} == {"hfx.json", *(f"{name}{suffix}" for name in programs
                                                             for suffix in (".pt2", ".safetensors"))}
    entry = json.loads((path / "hfx.json").read_text())["components"]["decode"]
    assert (entry["runtime"], entry["record"], entry["threads"], entry["inductor_configs"]) == (
        "aoti", "AotiProgram", 1, {})
    with pytest.raises(ValueError, match=re.escape(
            f"load: {path / 'hfx.json'}: component 'decode': decode.pt2 is a compiled package: loading it runs its "
            "native code (")) as info:
        hfx.load(path)
    assert str(info.value).endswith("Pass trust=True (CLI: --trust) only if you trust where the export came from")
    assert ".so" in str(info.value)
    # Its kernels were generated for one thread: loading it for another number is refused, its own is taken.
    with pytest.raises(ValueError, match=r"load: component 'decode' is an AOTInductor package compiled for 1 threads, "
                                         r"not 2; load it with threads=1 \(or None\), or compile it again with "
                                         r"lower_to_aoti\(exported, threads=2\)$"):
        hfx.load(path, trust=True, threads=2)
    assert hfx.load(path, trust=True, threads=1)["decode"].threads == 1


def test_a_package_records_the_cpus_instruction_sets_and_a_cpu_without_one_is_refused_before_loading(forward, tmp_path):
    # Inductor builds with -march=native: an AVX-512 package on an AVX2-only CPU would die on an illegal instruction
    _, _, program = forward
    assert program.cpu_flags == isa_flags() and "sse2" in program.cpu_flags
    path = hfx.save(tmp_path / "forward", program)
    manifest = json.loads((path / "hfx.json").read_text())
    assert manifest["components"]["model"]["cpu_flags"] == sorted(isa_flags())
    assert hfx.load(path, trust=True).cpu_flags == isa_flags()
    manifest["components"]["model"]["cpu_flags"] += ["avx1024_future"]
    (path / "hfx.json").write_text(json.dumps(manifest))
    with pytest.raises(hfx.InputError, match=re.escape(
            "load: component 'model' is an AOTInductor package built for a CPU with avx1024_future, which this CPU "
            "lacks: its native code would stop the process with an illegal instruction. Lower it again")):
        hfx.load(path, trust=True)
    assert built_for({"cpp.march": "x86-64-v3"}) == frozenset()  # an architecture the caller chose: not recorded


def test_the_weights_are_the_programs_own_tensors_and_saved_once_beside_the_package(forward, tmp_path):
    exported, _, program = forward
    state = exported.program.state_dict
    assert program.constants and all(program.constants[name] is tensor for name, tensor in state.items()
                                     if name in program.constants)  # the runner reads them, no copy
    archive = zipfile.ZipFile(io.BytesIO(bytes(program.package)))
    library = b"".join(archive.read(info) for info in archive.infolist() if info.filename.endswith(".so"))
    random = [t for t in state.values() if t.is_floating_point() and t.numel() >= 16 and t.std() > 0]
    assert library and random and not any(t.detach().numpy().tobytes()[:64] in library
                                          for t in random)  # no weight's bytes inside the library
    path = hfx.save(tmp_path / "llama", program)
    entry = json.loads((path / "hfx.json").read_text())["components"]["model"]
    assert entry["files"] == ["model.pt2", "model.safetensors"]
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as weights:
        stored = set(weights.keys())  # noqa: SIM118
    assert stored | set(entry["aliases"]) == set(program.constants) and not stored & set(entry["aliases"])
    loaded = hfx.load(path, trust=True)
    assert all(torch.equal(loaded.constants[name], tensor) for name, tensor in program.constants.items())
    inputs = new_inputs("llama")
    assert torch.equal(loaded(**inputs).logits, program(**inputs).logits)


_FRESH = textwrap.dedent(
    """
    import json, sys
    import torch
    import hfx

    root = sys.argv[1]
    expected = torch.load(root + "/expected.pt", weights_only=True)
    forward, decode = hfx.load(root + "/forward", trust=True), hfx.load(root + "/decode", trust=True)
    logits = forward(**expected["inputs"]).logits
    tokens = hfx.generate(expected["prompt"], decode, max_new_tokens=expected["tokens"].shape[1] - 9)
    print(json.dumps({"record": type(forward).__name__, "threads": forward.threads,
                      "same_logits": bool(torch.equal(logits, expected["logits"])),
                      "same_tokens": bool(torch.equal(tokens, expected["tokens"]))}))
    """
)


def test_a_saved_package_loads_in_a_fresh_process_and_gives_the_same_outputs(forward, decomposed, tmp_path):
    _, _, program = forward
    model, _, programs = decomposed
    inputs, prompt = new_inputs("llama"), zoo.inputs("llama", **PROMPT)
    expected = {"inputs": inputs, "logits": program(**inputs).logits, "prompt": prompt,
                "tokens": eager_tokens(model, prompt, NEW_TOKENS)}
    assert PROMPT["sequence"] == 9  # the child reads the new tokens off the prompt's length
    torch.save(expected, tmp_path / "expected.pt")
    hfx.save(tmp_path / "forward", program)
    hfx.save(tmp_path / "decode", programs)
    result = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path)], capture_output=True, text=True,
                            timeout=600, cwd=Path(__file__).parents[2], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "record": "AotiProgram", "threads": 1, "same_logits": True, "same_tokens": True}


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [0, -1, True, "2"])
def test_bad_threads_is_a_value_error(threads):
    linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
    message = f"lower_to_aoti: threads must be a positive int (the threads the runtime computes on), got {threads!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lower_to_aoti(linear, threads=threads)


def test_settings_lower_to_aoti_makes_are_refused_in_inductor_configs():
    linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
    message = ("lower_to_aoti: inductor_configs must not set 'cpp.threads', which lower_to_aoti sets; "
               "pass threads=n instead")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lower_to_aoti(linear, inductor_configs={"cpp.threads": 4})


def test_inductor_configs_that_are_not_json_are_a_type_error():
    linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
    with pytest.raises(TypeError, match=re.escape(
            "lower_to_aoti: inductor_configs must map torch._inductor.config setting names to JSON values")):
        lower_to_aoti(linear, inductor_configs={"max_autotune": object()})


def test_non_exported_subject_is_a_type_error():
    with pytest.raises(TypeError, match=re.escape(
            "lower_to_aoti takes an Exported or a Capture (or Components of them), got Linear")):
        lower_to_aoti(torch.nn.Linear(1, 1))


def test_compiler_failure_is_a_lowering_error_naming_stage_component_and_model():
    linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
    expected = "[lower_to_aoti] component 'model' of Linear: AOTInductor failed: InductorError: InvalidCxxCompiler"
    with pytest.raises(hfx.LoweringError, match=re.escape(expected)) as info:
        lower_to_aoti(linear, threads=1, inductor_configs={"cpp.cxx": [None, "hfx-no-such-compiler"]})
    assert "It needs a C++ compiler" in str(info.value)
    assert info.value.__cause__ is not None


def test_unknown_input_is_an_input_error(forward):
    _, _, program = forward
    with pytest.raises(hfx.InputError, match=re.escape("AotiProgram(model) does not take input(s) ['bogus']")):
        program(**new_inputs("llama"), bogus=torch.ones(1))


def test_an_input_captured_as_a_slice_runs_on_contiguous_and_sliced_tensors():
    # LLaVA's projector takes the image features without the class token: a slice, stride 17 x 32 per image. The
    # compiled code assumed that stride and read past each image of a contiguous input (garbage, ~1e34).
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).eval()
    dims = hfx.DynamicShapes(axes={"input": {0: "image_count"}}, bounds={"image_count": (1, 8)})
    exported = hfx.export(hfx.capture({"input": torch.randn(2, 17, 32)[:, 1:]}, model, dynamic_shapes=dims))
    placeholder = [n for n in exported.program.graph.nodes if n.op == "placeholder"][-1]
    program = lower_to_aoti(exported, threads=1)
    assert placeholder.meta["val"].stride() == (544, 32, 1)  # the Exported is left as it was
    for input in (torch.randn(3, 16, 32), torch.randn(3, 17, 32)[:, 1:], torch.randn(3, 16, 64)[..., ::2]):
        with torch.no_grad():
            want = model(input)
        torch.testing.assert_close(program(input=input), want, rtol=FP32_PARITY, atol=FP32_PARITY)
