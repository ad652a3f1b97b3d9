"""``ONNX_FIXES``: what each ONNX workaround does, and the canaries that fail once upstream fixes its bug.

``convert_under_no_grad``: SDPA whose mask is built from a parameter (T5's relative
position bias). torch.export drops the no-op ``.transpose(1, 2).contiguous()`` after
CPU SDPA's flash kernel; torch.onnx's fake re-run with grad enabled takes the math
kernel instead, and the ``view`` after it failed ("Cannot view a tensor with shape
..."). The fix lowers under ``no_grad``, as ``export`` traced.

``unused_assert_conditions_dropped``: the comparisons torch.onnx leaves behind when it erases runtime asserts,
one of which held a bound past int64 on Idefics3 and SmolVLM (transformers 5.22).

``bfloat16_arithmetic_in_float32``: bfloat16 elementwise ops in a float32 model
(Falcon's ALiBi slopes), which ONNX Runtime's CPU provider cannot load.

``no_op_rules_match_exact_constants``: onnxscript's optimizer took ``x + 1e-8`` for ``x + 0`` and
dropped an RMSNorm's epsilon (MuSE Spark), so a row of zeros came out ``0 * inf = NaN``.
"""

from __future__ import annotations

import operator

import pytest
import torch

pytest.importorskip("onnxruntime")

import onnx_ir as ir  # noqa: E402 - after the importorskip
import onnxruntime  # noqa: E402

import hfx  # noqa: E402
from hfx._capture.cross_cache import EncoderWithCrossCache  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import ONNX_FIXES  # noqa: E402
from hfx.backends._onnx import OnnxProgram, lower_to_onnx  # noqa: E402
from hfx.backends._onnx_fixes import (  # noqa: E402
    _numbers_made_tensors,
    bfloat16_arithmetic_in_float32,
    convert_under_no_grad,
    exact_no_op_constants,
    no_op_rules_match_exact_constants,
    scalar_first_operands_as_tensors,
    torchlib_registry_built_once,
    type_promotion_reads_recorded_values,
    unused_assert_conditions_dropped,
    zero_size_views_as_new_tensors,
)
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, new_inputs  # noqa: E402
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY  # noqa: E402


def _without(fix) -> tuple:
    return tuple(f for f in ONNX_FIXES if f is not fix)


class _BiasedAttention(torch.nn.Module):
    """T5 attention in small: a float mask plus a learned bias into SDPA, then ``transpose(1, 2).contiguous()``."""

    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.position_bias = torch.nn.Parameter(torch.randn(heads, 1, 1))

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        shape = (*inputs_embeds.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(inputs_embeds).view(shape).transpose(1, 2) for proj in (self.q, self.k, self.v))
        padding = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding + self.position_bias)
        return self.o(out.transpose(1, 2).contiguous().reshape(*inputs_embeds.shape[:-1], -1))


def _biased_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, : sequence // 3] = 0
    return {"inputs_embeds": torch.randn(batch, sequence, 32), "attention_mask": mask}


@pytest.fixture(scope="module")
def biased():
    """The small model and its export, captured at the usual shape."""
    torch.manual_seed(0)
    model = _BiasedAttention().eval()
    return model, hfx.export(hfx.capture(_biased_inputs(**CAPTURE_SHAPE), model))


# --- output -----------------------------------------------------------------------------------


def test_t5_encoder_lowers_and_matches_eager_on_new_shapes(generative):
    model, parts = generative("t5")
    program = lower_to_onnx(parts["encoder"])
    # The encoder component also computes the decoder's cross-attention cache (hfx._capture.cross_cache).
    report = verify(EncoderWithCrossCache(model, start_token=0), new_inputs("t5"), program)
    assert report.passed, str(report)
    assert report.max_abs <= FP32_PARITY, str(report)


def test_biased_sdpa_lowers_and_matches_eager_on_new_shapes(biased):
    model, exported = biased
    torch.manual_seed(1)
    report = verify(model, _biased_inputs(**NEW_SHAPE), lower_to_onnx(exported))
    assert report.max_abs <= FP32_ONE_BLOCK, str(report)


# --- the input and the process left unchanged --------------------------------------------------


def test_exported_and_grad_mode_are_unchanged_by_lowering(biased):
    _, exported = biased
    graph = str(exported.program.graph)
    assert torch.is_grad_enabled()
    assert isinstance(lower_to_onnx(exported), OnnxProgram)
    assert torch.is_grad_enabled()
    assert str(exported.program.graph) == graph


# --- the failure the fix removes ----------------------------------------------------------------


def test_without_no_grad_torch_onnx_still_cannot_view(biased):
    """Canary, and the option honoured: when this fails, torch.onnx keeps the traced strides and the fix can go.
    The type promotion fix runs no SDPA again either (it reads the traced values), so it is left out here too."""
    _, exported = biased
    with pytest.raises(hfx.LoweringError, match="Cannot view a tensor with shape"):
        lower_to_onnx(exported, fixes=tuple(f for f in _without(convert_under_no_grad)
                                            if f is not type_promotion_reads_recorded_values))


def test_either_fix_alone_keeps_the_traced_strides(biased):
    model, exported = biased
    torch.manual_seed(1)
    for fix in (convert_under_no_grad, type_promotion_reads_recorded_values):
        report = verify(model, _biased_inputs(**NEW_SHAPE), lower_to_onnx(exported, fixes=_without(fix)))
        assert report.max_abs <= FP32_ONE_BLOCK, (fix.__name__, str(report))


def test_the_grad_mode_fix_runs_the_conversion_under_no_grad():
    assert torch.is_grad_enabled()
    assert convert_under_no_grad(torch.is_grad_enabled) is False
    assert torch.is_grad_enabled()


# --- bfloat16 arithmetic ---------------------------------------------------------------------------


class _Bfloat16Arithmetic(torch.nn.Module):
    """A float32 model with bfloat16 arithmetic inside (Falcon's ALiBi slopes) and a bfloat16 output."""

    def forward(self, x):
        scaled = x.to(torch.bfloat16) * torch.tensor([0.25, 0.0625, 0.015625], dtype=torch.bfloat16)
        return {"inside": scaled.float() + x, "rounded": scaled / 3}


def test_bfloat16_elementwise_ops_run_in_float32_and_round_like_torch():
    program = lower_to_onnx(hfx.capture({"x": torch.randn(2, 3)}, _Bfloat16Arithmetic()))
    graph = program.model.graph
    ops = [(node.op_type, node.outputs[0].dtype) for node in graph]
    assert ("Mul", ir.DataType.FLOAT) in ops and ("Div", ir.DataType.FLOAT) in ops
    rounded = graph.outputs[1]  # a bfloat16 graph output keeps its name and becomes the Cast of the float32 Div
    assert (rounded.name, rounded.dtype, rounded.producer().op_type) == ("rounded", ir.DataType.BFLOAT16, "Cast")
    assert rounded.producer().inputs[0].producer().op_type == "Div"
    x = torch.randn(5, 3) * 100
    # OnnxProgram hands outputs over through numpy, which has no bfloat16: run the float32 output only.
    session = onnxruntime.InferenceSession(ir.to_proto(program.model).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    (inside,) = session.run(["inside"], {"x": x.numpy()})
    assert torch.equal(torch.from_numpy(inside), _Bfloat16Arithmetic()(x)["inside"])


def test_without_the_bfloat16_fix_onnx_runtime_still_refuses_bfloat16_arithmetic():
    """Canary, and the option honoured: when this fails, ONNX Runtime runs bfloat16 Mul and the fix can go."""
    capture = hfx.capture({"x": torch.randn(2, 3)}, _Bfloat16Arithmetic())
    with pytest.raises(hfx.LoweringError, match=r"Could not find an implementation for Mul"):
        lower_to_onnx(capture, fixes=_without(bfloat16_arithmetic_in_float32))


def test_the_bfloat16_fix_leaves_a_float32_model_as_it_is():
    model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    model.graph.inputs.append(x)
    node = ir.Node("", "Mul", [x, x], num_outputs=1)
    model.graph.append(node)
    model.graph.outputs.append(node.outputs[0])
    assert bfloat16_arithmetic_in_float32(lambda: model) is model
    assert [n.op_type for n in model.graph] == ["Mul"]



class _OneMinusMask(torch.nn.Module):
    """XLNet's and ProphetNet's ``1.0 - attention_mask`` on an integer mask, scaled by a float input."""

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (1.0 - attention_mask) * x


def _one_minus_mask() -> hfx.Capture:
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    axes = {0: "batch", 1: "sequence"}
    return hfx.capture({"x": torch.randn(2, 7), "attention_mask": mask}, _OneMinusMask(),
                       dynamic_shapes=hfx.DynamicShapes(axes={"x": axes, "attention_mask": axes},
                                                         bounds={"batch": (1, None), "sequence": (1, None)}))


def test_a_number_minus_an_integer_mask_lowers_and_matches_eager_at_a_new_shape():
    x, mask = torch.randn(3, 5), torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    program = lower_to_onnx(_one_minus_mask())
    assert "scalar_first_operands_as_tensors" in program.fixes
    got = program(x=x, attention_mask=mask)
    assert got.dtype == torch.float32 and torch.equal(got, _OneMinusMask()(x, mask))


def test_without_the_number_fix_torch_onnx_still_finds_no_sub_for_a_number_first():
    """Canary (pytorch/pytorch#194381): when this fails, torch.onnx materialises the number and the fix can go."""
    with pytest.raises(hfx.LoweringError, match=r"Cannot find a compatible OpOverload for aten.sub"):
        lower_to_onnx(_one_minus_mask(), fixes=_without(scalar_first_operands_as_tensors))


def test_the_number_fix_makes_0d_tensors_of_the_dtype_a_number_promotes_as():
    graph = torch.fx.Graph()
    mask = graph.placeholder("mask")
    graph.output(graph.call_function(torch.ops.aten.sub.Tensor, (1.0, mask)))
    other = graph.call_function(torch.ops.aten.add.Tensor, (mask, 2))
    assert _numbers_made_tensors(graph) == 2
    made = [node for node in graph.nodes if node.target is torch.ops.aten.scalar_tensor.default]
    assert [(node.args, node.kwargs["dtype"]) for node in made] == [((1.0,), torch.float32), ((2,), torch.int64)]
    assert other.args[1] is made[1]
    assert _numbers_made_tensors(graph) == 0  # nothing left to replace


def _asserted_beyond_int64() -> torch.fx.GraphModule:
    """``x``'s first size checked against a bound past int64, as torch derives for Idefics3's image-token count."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    size = graph.call_function(torch.ops.aten.sym_size.int, (x, 0))
    condition = graph.call_function(operator.le, (size, 147573952589676412896))
    graph.call_function(torch.ops.aten._assert_scalar.default, (condition, "u1 <= 147573952589676412896"))
    graph.output(x)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _targets(module: torch.fx.GraphModule) -> list:
    return [node.target for node in module.graph.nodes if node.op == "call_function"]


def test_torch_onnx_still_leaves_the_conditions_of_the_asserts_it_removes():
    """Canary: when this fails, torch.onnx drops dead conditions and ``unused_assert_conditions_dropped`` can go."""
    from torch.onnx._internal.exporter import _fx_passes

    assert operator.le in _targets(_fx_passes.remove_assertion_nodes(_asserted_beyond_int64()))


def test_the_assert_fix_drops_the_conditions_while_converting_and_puts_the_pass_back():
    from torch.onnx._internal.exporter import _fx_passes

    original, seen = _fx_passes.remove_assertion_nodes, []

    def convert():
        seen.append(_targets(_fx_passes.remove_assertion_nodes(_asserted_beyond_int64())))
        return "model"

    assert unused_assert_conditions_dropped(convert) == "model"
    assert seen == [[]]  # the comparison, and the size only it read, went with the assert
    assert _fx_passes.remove_assertion_nodes is original
    with pytest.raises(RuntimeError, match="boom"):
        unused_assert_conditions_dropped(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert _fx_passes.remove_assertion_nodes is original


# --- type promotion over the recorded values -------------------------------------------------------


class _MixedDtypes(torch.nn.Module):
    """Float arithmetic that needs no cast, then across dtypes that torch promotes: float32 times int32, plus int64,
    compared with a float."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = (x.tanh() * x.sigmoid() - x.exp()).abs().sqrt()
        mixed = x * ids.to(torch.int32) + ids
        return torch.where(ids > 2.5, mixed, x.sum(-1, keepdim=True) / ids.shape[-1])


def _mixed_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(batch, sequence), "ids": torch.arange(batch * sequence).reshape(batch, sequence) % 5}


def _mixed_dtypes() -> hfx.Capture:
    axes = {0: "batch", 1: "sequence"}
    return hfx.capture(_mixed_inputs(2, 7), _MixedDtypes(),
                       dynamic_shapes=hfx.DynamicShapes(axes={"x": axes, "ids": axes},
                                                        bounds={"batch": (1, None), "sequence": (1, None)}))


def _promotion_pass_runs(monkeypatch, fix) -> tuple[str, int, int, int, int]:
    """``(graph after, ops run, ops in the graph before, ops of them without a recorded value, ops it added)`` of
    torch.onnx's type promotion pass on the decomposed ``_MixedDtypes`` graph, run inside ``fix``."""
    from torch.onnx._internal.exporter import _fx_passes

    program = torch.export.export(_MixedDtypes(), (), _mixed_inputs(2, 7),
                                  dynamic_shapes={"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
                                                  "ids": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}})
    module = program.run_decompositions().graph_module
    before = sum(node.op == "call_function" for node in module.graph.nodes)
    unvalued = sum(node.op == "call_function" and node.meta.get("val") is None for node in module.graph.nodes)
    runs, call_function = [], torch.fx.Interpreter.call_function
    monkeypatch.setattr(torch.fx.Interpreter, "call_function",
                        lambda self, *args: runs.append(args[0]) or call_function(self, *args))
    fix(lambda: _fx_passes.insert_type_promotion_nodes(module))
    monkeypatch.undo()
    after = sum(node.op == "call_function" for node in module.graph.nodes)
    return str(module.graph), len(runs), before, unvalued, after - before


def test_the_promotion_fix_inserts_the_same_casts_and_runs_only_the_ops_it_promotes(monkeypatch):
    fixed, runs, before, unvalued, casts = _promotion_pass_runs(monkeypatch, type_promotion_reads_recorded_values)
    plain = _promotion_pass_runs(monkeypatch, lambda convert: convert())[0]
    assert fixed == plain and casts >= 2  # the casts torch's pass inserts
    # Each cast runs once and each op it promotes (at most one per cast) twice, as in torch's pass, and the ops that
    # recorded no value (a metadata assert) once; not the ~20 float ops that need no cast.
    assert 0 < runs <= 3 * casts + unvalued < before - 15
    program = lower_to_onnx(_mixed_dtypes())
    assert "type_promotion_reads_recorded_values" in program.fixes
    inputs = _mixed_inputs(3, 11)
    got = program(**inputs)
    assert got.dtype == torch.float32 and torch.allclose(got, _MixedDtypes()(**inputs), atol=FP32_ONE_BLOCK)


def test_torch_onnx_still_runs_every_op_again_to_promote_types(monkeypatch):
    """Canary: when this fails, torch.onnx's pass reads the recorded values and the fix can go."""
    _, runs, before, _, _ = _promotion_pass_runs(monkeypatch, lambda convert: convert())
    assert runs >= before


def test_the_promotion_fix_puts_the_interpreter_back():
    from torch.onnx._internal.fx.passes import type_promotion

    original = type_promotion._TypePromotionInterpreter
    assert type_promotion_reads_recorded_values(lambda: type_promotion._TypePromotionInterpreter) is not original
    assert type_promotion._TypePromotionInterpreter is original
    with pytest.raises(RuntimeError, match="boom"):
        type_promotion_reads_recorded_values(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert type_promotion._TypePromotionInterpreter is original


# --- the torchlib registry ---------------------------------------------------------------------------


def _counted_registry_builds(monkeypatch) -> list:
    """A list that gets one item each time torch.onnx builds its registry from torchlib."""
    from torch.onnx._internal.exporter import _registration

    builds = []
    build = vars(_registration.ONNXRegistry)["from_torchlib"]
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib",
                        classmethod(lambda cls, *a, **k: builds.append(a) or build.__func__(cls, *a, **k)))
    return builds


def test_the_registry_is_built_once_per_opset_and_each_export_gets_its_own_copy(monkeypatch):
    from torch.onnx._internal.exporter import _registration

    from hfx.backends import _onnx_fixes

    monkeypatch.setattr(_onnx_fixes, "_TORCHLIB_REGISTRIES", {})
    builds = _counted_registry_builds(monkeypatch)
    got = torchlib_registry_built_once(lambda: [_registration.ONNXRegistry.from_torchlib() for _ in range(3)])
    assert len(builds) == 1 and got[0] is not got[1]
    target = next(iter(got[0].functions))
    got[0].register_op(target, lambda x: x)  # what a custom_translation_table does to one export's registry
    assert len(got[0].functions[target]) == len(got[1].functions[target]) + 1


def test_torch_onnx_still_builds_its_registry_for_every_export(monkeypatch):
    """Canary: when this fails, torch.onnx keeps its registry between exports and the fix can go."""
    builds = _counted_registry_builds(monkeypatch)
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    for _ in range(2):
        torch.onnx.export(program, dynamo=True, optimize=False, verbose=False)
    assert len(builds) == 2


class _TinyEpsilonNorm(torch.nn.Module):
    """MuSE Spark's post-attention norm: ``x * pow(mean(x**2) + 1e-8, -0.5)`` after a projection, padded rows 0."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.proj(x) * attention_mask[..., None]
        return hidden * torch.pow(hidden.pow(2).mean(-1, keepdim=True) + 1e-8, -0.5)


def _tiny_epsilon_norm() -> tuple[hfx.Exported, dict[str, torch.Tensor]]:
    inputs = {"x": torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)),
              "attention_mask": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])}
    return hfx.export(hfx.capture(inputs, _TinyEpsilonNorm())), inputs


@pytest.mark.parametrize("fusions", [(), None], ids=["plain", "fused"])
def test_an_epsilon_of_1e_8_is_kept_and_a_zero_row_stays_zero(fusions):
    exported, inputs = _tiny_epsilon_norm()
    program = lower_to_onnx(exported) if fusions is None else lower_to_onnx(exported, fusions=fusions)
    got = program(**inputs)
    assert torch.isfinite(got).all() and torch.equal(got[0, :2], torch.zeros(2, 8))
    torch.testing.assert_close(got, exported(**inputs), rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_without_the_no_op_fix_onnxscript_still_drops_the_epsilon():
    """Canary: when this fails, onnxscript's no-op rules match exact constants only and the fix can go."""
    exported, inputs = _tiny_epsilon_norm()
    program = lower_to_onnx(exported, fixes=_without(no_op_rules_match_exact_constants), fusions=())
    assert torch.isnan(program(**inputs)[0, :2]).all()


def test_the_no_op_constants_are_exact_inside_and_tolerant_again_after():
    from onnxscript.rewriter._pattern_ir import Constant

    from hfx.backends._onnx_fixes import _tolerant_no_op_constants

    constants = _tolerant_no_op_constants()
    assert constants and all(isinstance(c, Constant) for c in constants)
    before = [(c._abs_tol, c._rel_tol) for c in constants]  # noqa: SLF001
    with exact_no_op_constants():
        assert all(c._abs_tol == c._rel_tol == 0.0 for c in constants)  # noqa: SLF001
    assert [(c._abs_tol, c._rel_tol) for c in constants] == before  # noqa: SLF001


class _NoRopeKeys(torch.nn.Module):
    """A no-RoPE layer's decode-step keys in small (Mistral Large 4): the rotary half, split off with 0 columns,
    viewed with the step's static length of 1, as ``k_rot.view(batch, 1, seq_length, 0)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, step = x.shape[:2]
        keys, rotary = torch.split(x, [x.shape[-1], 0], dim=-1)
        return keys.view(batch, 1, step, -1).sum(-1) + rotary.view(batch, 1, step, 0).sum(-1)


def _no_rope_keys() -> hfx.Exported:
    exported = hfx.export(hfx.capture({"x": torch.randn(2, 1, 8)}, _NoRopeKeys()))
    assert exported.io.inputs[0].shape == ("batch", 1, 8)  # one symbolic dim: onnxscript writes it as -1
    return exported


def test_a_view_to_zero_columns_loads_and_runs_at_another_batch():
    program = lower_to_onnx(_no_rope_keys())
    x = torch.randn(3, 1, 8)
    torch.testing.assert_close(program(x=x), _NoRopeKeys()(x))


def test_without_the_zero_size_fix_onnx_runtime_still_refuses_the_reshape():
    """Canary: when this fails, onnxscript writes a reshape to zero columns ONNX Runtime loads, and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="Product cannot be 0 in combination with -1"):
        lower_to_onnx(_no_rope_keys(), fixes=_without(zero_size_views_as_new_tensors))
