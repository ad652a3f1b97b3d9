"""``lower_to_pte`` and ``PteProgram``: parity, bounds, purity, generation, save/load and errors.

Lowering a tiny transformer costs 10-30 s, so each parity model is lowered once
per module (``lowered``), and one more program, Llama's decode step lowered from
a ``Capture`` with custom ``max_sizes`` (``decode``), serves the bounds and
generation tests. Everything else lowers a ``Linear`` (about 1 s) or nothing.
"""

from __future__ import annotations

import importlib.util

import attrs
import pytest
import torch

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx import zoo  # noqa: E402
from hfx._errors import InputError, LoweringError  # noqa: E402
from hfx._save import load, save  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import _xnnpack_patches  # noqa: E402
from hfx.backends._executorch import (  # noqa: E402
    DEFAULT_MAX_SIZE,
    DEFAULT_MAX_SIZES,
    PteProgram,
    _validating_list_returns_whole,
    decomposed_for_edge,
    lower_to_pte,
    patch_edge_verifier_sym_functions,
    pte_bounds,
)
from hfx.patches._edge import exact_upper_bound  # noqa: E402
from tests.helpers import CAPTURE_SHAPE, PARITY_MODELS, eager_tokens, new_inputs  # noqa: E402

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
def decode(models):
    """The one extra lowering: Llama's decode step, from a ``Capture``, with custom ``max_sizes``."""
    parts = hfx.decompose(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), models("llama")))
    return lower_to_pte(parts["decode"], max_sizes=BOUNDED)


@pytest.fixture(scope="module")
def linear():
    return hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_parity_on_new_shapes(lowered, models, name):
    program, _ = lowered(name)
    report = verify(models(name), new_inputs(name), program)
    assert report.max_abs <= 1e-4, str(report)


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_outputs_have_the_eager_structure(lowered, models, name):
    program, _ = lowered(name)
    got = program(**new_inputs(name))
    want = models(name)(**new_inputs(name), **program.io.constants)
    assert type(got) is type(want)
    assert list(got.keys()) == [k for k, v in want.items() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_lowering_leaves_the_exported_unchanged(lowered, exported, name):
    _, before = lowered(name)
    after = _snapshot(exported(name), new_inputs(name))
    assert after["graph"] == before["graph"]
    assert after["range_constraints"] == before["range_constraints"]
    assert after["shape_env"] == before["shape_env"]
    assert after["io"] is before["io"]
    assert after["state"].keys() == before["state"].keys()
    assert all(torch.equal(after["state"][k], v) for k, v in before["state"].items())
    assert all(torch.equal(a, b) for a, b in zip(after["outputs"], before["outputs"], strict=True))


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_default_bounds_are_recorded(lowered, exported, name):
    program, _ = lowered(name)
    export_bounds = exported(name).io.bounds
    assert dict(program.io.bounds) == pte_bounds(exported(name))
    assert program.io.bounds["batch"] == (1, DEFAULT_MAX_SIZES["batch"])
    if "sequence" in export_bounds:
        assert program.io.bounds["sequence"] == (1, min(export_bounds["sequence"][1] or DEFAULT_MAX_SIZE, DEFAULT_MAX_SIZE))
    assert dict(program.max_sizes) == {k: hi for k, (_, hi) in program.io.bounds.items()}


def test_input_beyond_the_default_bound_is_an_input_error(lowered, exported):
    program, _ = lowered("llama")
    limit = DEFAULT_MAX_SIZES["batch"]
    too_big = zoo.inputs("llama", batch=limit + 1, sequence=5)
    with pytest.raises(InputError, match=rf"\(batch\) is {limit + 1}, outside the program's bounds \[1, {limit}\]") as info:
        program(**too_big)
    assert info.value.__notes__ == [
        f"This .pte was memory-planned for batch <= {limit}. Lower again with "
        f"lower_to_pte(exported, max_sizes={{'batch': {limit + 1}}}) (up to the export's own bound)."
    ]
    exported("llama")(**too_big)  # the Exported keeps its own, wider bounds


def test_a_capture_is_exported_first_and_max_sizes_are_respected(decode):
    assert isinstance(decode, PteProgram)
    assert "past_key_values.layers.0.keys" in decode.io.input_names
    assert dict(decode.max_sizes) == BOUNDED


def test_the_decode_step_generates_the_eager_tokens(decode, generative):
    model, parts = generative("llama")
    programs = attrs.evolve(parts, items={**parts, "decode": decode})  # an Exported prefill, a .pte decode
    inputs = zoo.inputs("llama", batch=BOUNDED["batch"], sequence=11)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=32), eager_tokens(model, inputs, 32))


def test_generating_past_the_planned_cache_is_an_input_error(decode, generative):
    _, parts = generative("llama")
    programs = attrs.evolve(parts, items={**parts, "decode": decode})
    past = BOUNDED["past_sequence"]
    with pytest.raises(InputError, match=rf"\(past_sequence\) is {past + 1}, outside the program's bounds"):
        hfx.generate(zoo.inputs("llama", batch=1, sequence=11), programs, max_new_tokens=past)
    with pytest.raises(InputError, match=r"\(batch\) is 4, outside"):
        hfx.generate(zoo.inputs("llama", batch=4, sequence=5), programs, max_new_tokens=2)


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


def test_components_are_mapped_and_a_dim_of_bound_one_is_static(linear):
    components = hfx.Components(items={"a": linear, "b": linear})
    programs = lower_to_pte(max_sizes={"batch": 1})(components)
    assert isinstance(programs, hfx.Components) and list(programs) == ["a", "b"]
    assert all(isinstance(p, PteProgram) and p.io.bounds["batch"] == (1, 1) for p in programs.values())
    x = torch.randn(1, 3)
    assert torch.allclose(programs["a"](input=x), linear(input=x), atol=1e-6)
    with pytest.raises(InputError, match="batch"):
        programs["b"](input=torch.randn(2, 3))
    assert f"buffer=<{len(programs['a'].buffer)} bytes>" in repr(programs["a"])  # not the bytes themselves


def test_a_failing_component_keeps_its_error_and_is_named(linear):
    with pytest.raises(ValueError, match=r"names dim\(s\) \['sequence'\]") as info:
        lower_to_pte(hfx.Components(items={"a": linear}), max_sizes={"sequence": 4})
    assert info.value.__notes__ == ["in component 'a' of lower_to_pte"]


def test_save_and_load_round_trip(lowered, tmp_path):
    program, _ = lowered("llama")
    loaded = load(save(tmp_path / "llama-pte", program))
    assert sorted(p.name for p in (tmp_path / "llama-pte").iterdir()) == ["hfx.json", "model.pte"]
    assert isinstance(loaded, PteProgram)
    assert loaded.buffer == program.buffer and loaded.io == program.io
    inputs = new_inputs("llama")
    assert torch.equal(loaded(**inputs).logits, program(**inputs).logits)


def test_lowering_is_quiet(linear, capfd):
    program = lower_to_pte(linear)
    program(input=torch.ones(3, 3))
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


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


def test_verifier_patch_adds_the_sym_functions_to_the_allowlist():
    from executorch.exir.verification import verifier

    original = vars(verifier)["_EXECUTORCH_SYM_OPS"]
    with patch_edge_verifier_sym_functions():
        assert torch.sym_min in verifier._EXECUTORCH_SYM_OPS
        assert original <= verifier._EXECUTORCH_SYM_OPS
    assert torch.sym_min not in original


def test_missing_executorch_names_the_extra(linear, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else find_spec(name, *a))
    with pytest.raises(ImportError, match=r"hfx\[executorch\]"):
        lower_to_pte(linear)


class _Conv1d(torch.nn.Module):
    """A wav2vec2-like feature extractor: a strided 1-D convolution over ``[batch, channels, frames]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 4, kernel_size=3, stride=2)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.conv(input_values).relu()


class _Chunked(torch.nn.Module):
    """A Mamba-like gated projection: ``in_proj(x).chunk(2, dim=-1)`` of a batched tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 8)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(values).chunk(2, dim=-1)
        return value * torch.sigmoid(gate)


class _TanhGelu(torch.nn.Module):
    """Gemma's MLP activation, ``gelu_pytorch_tanh``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 64)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(values), approximate="tanh")


class _Bucketed(torch.nn.Module):
    """Idefics3's patch positions: ``torch.bucketize`` of fractional coordinates into fixed boundaries."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        boundaries = torch.arange(1 / 8, 1.0, 1 / 8)
        return torch.bucketize(values, boundaries, right=True) * 2 + torch.bucketize(values, boundaries)


class _Windowed(torch.nn.Module):
    """Swin's window partition: pad to even, view as ``[batch, P // 2, P // (P // 2)]`` (always 2), then pairs."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(values, (0, values.shape[1] % 2))
        windows = padded.view(padded.shape[0], padded.shape[1] // 2, -1)
        return (windows.unsqueeze(-1) * windows.unsqueeze(-2)).sum(-1)


def _lowered_tiny(
    module: torch.nn.Module, example: torch.Tensor, axes: dict[int, str], *, name: str = "values"
) -> PteProgram:
    shapes = hfx.DynamicShapes(axes={name: axes}, bounds={dim: (1, 64) for dim in axes.values()})
    return lower_to_pte(hfx.export(hfx.capture({name: example}, module, dynamic_shapes=shapes)))


def test_a_conv1d_with_two_dynamic_dims_lowers_and_runs_at_new_sizes():
    torch.manual_seed(0)
    module = _Conv1d()
    program = _lowered_tiny(module, torch.randn(2, 2, 20), {0: "batch", 2: "frames"}, name="input_values")
    x = torch.randn(3, 2, 33)
    assert torch.allclose(program(input_values=x), module(x), atol=1e-5)


def test_a_chunk_of_the_batch_dim_keeps_the_batch_dynamic():
    torch.manual_seed(0)
    module = _Chunked()
    program = _lowered_tiny(module, torch.randn(2, 5, 4), {0: "batch"})
    assert program.io.bounds["batch"] == (1, DEFAULT_MAX_SIZES["batch"])
    x = torch.randn(3, 5, 4)
    assert torch.allclose(program(values=x), module(x), atol=1e-5)


def test_the_tanh_gelu_is_computed_as_asked():
    torch.manual_seed(0)
    module = _TanhGelu()
    program = _lowered_tiny(module, torch.randn(2, 4) * 3, {0: "batch"})
    x = torch.randn(3, 4) * 3
    hidden = module.proj(x)
    erf_gap = (torch.nn.functional.gelu(hidden) - module(x)).abs().max()
    assert erf_gap > 1e-4  # the erf GELU XNNPACK would compute is told apart at this tolerance
    assert (program(values=x) - module(x)).abs().max() < 1e-5


def _node(shape: tuple[object, ...], *args: object, **kwargs: object) -> torch.fx.Node:
    """An FX ``call_function`` node whose ``meta["val"]`` has ``shape`` (strings are symbolic dims)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten.relu.default, args, kwargs)
    sizes = [env.create_unbacked_symint() if isinstance(d, str) else d for d in shape]
    with torch._subclasses.FakeTensorMode(shape_env=env):
        node.meta["val"] = torch.empty(sizes)
    return node


def test_the_conv1d_check_refuses_two_dynamic_dims_only_for_1d_convolutions():
    check = _xnnpack_patches._conv1d_reshapes_have_one_dynamic_dim
    weight_1d, weight_2d = _node((4, 2, 3)), _node((4, 2, 3, 3))
    both = _node(("b", 2, "t"))
    assert not check(_node(("b", 4, "t"), both, weight_1d))
    assert not check(_node(("b", 4, 9), both, weight_1d))  # the input's unsqueeze has two
    assert check(_node(("b", 4, 9), _node(("b", 2, 20)), weight_1d))
    assert check(_node(("b", 4, "h", "w"), _node(("b", 2, "h", "w")), weight_2d))


def test_the_gelu_check_accepts_the_erf_gelu_only():
    x = _node((2, 3))
    assert _xnnpack_patches._is_exact_gelu(_node((2, 3), x))
    assert _xnnpack_patches._is_exact_gelu(_node((2, 3), x, approximate="none"))
    assert not _xnnpack_patches._is_exact_gelu(_node((2, 3), x, approximate="tanh"))


def test_the_validator_patch_sees_a_tensor_list_return_whole():
    from executorch.exir.dialects._ops import ops as exir_ops

    seen = []

    class Probe:
        node = _node((2, 3))

    def original(self, target, args, kwargs):
        seen.append(self.node.meta["val"])

    Probe.node.meta["val"] = [torch.empty(2, 3), torch.empty(2, 3)]
    wrapped = _validating_list_returns_whole(original)
    wrapped(Probe(), exir_ops.edge.aten.split_with_sizes_copy.default, (), {})
    wrapped(Probe(), exir_ops.edge.aten.relu.default, (), {})
    assert isinstance(seen[0], tuple) and seen[0][0] is seen[1]  # wrapped for the call, restored after
    assert isinstance(Probe.node.meta["val"], list)


def test_bucketize_is_decomposed_before_the_edge_and_computed_as_eager():
    module = _Bucketed()
    program = _lowered_tiny(module, torch.rand(2, 5), {0: "batch"})
    x = torch.cat([torch.rand(3, 3), torch.tensor([[0.0, 0.125], [0.5, 0.875], [1.0, 0.25]])], dim=1)
    assert torch.equal(program(values=x), module(x))


def test_a_program_without_those_ops_is_not_decomposed_again(linear):
    assert decomposed_for_edge(linear.program) is linear.program


def test_memory_is_planned_at_the_exact_upper_bound_of_correlated_sizes():
    module = _Windowed()
    program = _lowered_tiny(module, torch.randn(2, 10), {0: "batch", 1: "length"})
    # batch 4 x 32 windows x 2 x 2 floats per tensor; interval arithmetic planned 2 x 64 instead of 2 (>= 2 MiB)
    assert program.planned_bytes < 64 * 1024
    for length in (7, 64):
        x = torch.randn(4, length)
        assert torch.allclose(program(values=x), module(x), atol=1e-5)


def test_the_exact_upper_bound_skips_zero_divisors_and_gives_up_on_unknown_functions():
    import sympy
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.value_ranges import ValueRanges

    p = sympy.Symbol("p", integer=True, positive=True)
    assert exact_upper_bound(FloorDiv(12, FloorDiv(p, 4)), {p: ValueRanges(1, 16)}) == 12  # p < 4 divides by 0
    assert exact_upper_bound(3 * p + 1, {p: ValueRanges(1, 16)}) == 49
    assert exact_upper_bound(sympy.sin(p), {p: ValueRanges(1, 16)}) is None
    assert exact_upper_bound(p, {p: ValueRanges(1, sympy.oo)}) is None
