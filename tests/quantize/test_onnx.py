"""``quantize_onnx``: ONNX Runtime dynamic and static (QDQ) quantization of an ``OnnxProgram``."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from tests.quantize.metrics import cosine, top1_agreement

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def onnx(exported):
    return hfx.lower_to_onnx(exported("llama"))


def _ops(program):
    return {node.op_type for node in program.model.graph}


def _weight_bytes(program):
    return sum(v.const_value.nbytes for v in program.model.graph.initializers.values() if v.const_value is not None)


def test_dynamic_stores_int8_weights_and_keeps_the_input_program(onnx, reference):
    ops, size = _ops(onnx), _weight_bytes(onnx)
    quantized = pipe(onnx, hfx.quantize_onnx)
    assert isinstance(quantized, hfx.OnnxProgram) and quantized.io is onnx.io
    assert quantized.fixes == onnx.fixes != ()  # what the quantized graph was lowered with
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= _ops(quantized)
    assert _weight_bytes(quantized) < 0.5 * size
    inputs, logits = reference
    got = quantized(**inputs).logits
    assert cosine(logits, got) > 0.999  # measured 0.9999
    assert top1_agreement(logits, got) > 0.9
    assert _ops(onnx) == ops and _weight_bytes(onnx) == size
    assert torch.allclose(onnx(**inputs).logits, logits, atol=1e-4)


def test_static_qdq_calibrates_and_round_trips(onnx, samples, reference, tmp_path):
    quantized = hfx.quantize_onnx(mode="static", calibration=samples)(onnx)
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(quantized)
    inputs, logits = reference
    got = quantized(**inputs).logits
    assert cosine(logits, got) > 0.99  # measured 0.999
    loaded = hfx.load(hfx.save(tmp_path / "qdq", quantized))
    assert torch.equal(loaded(**inputs).logits, got)


def test_static_needs_calibration(onnx):
    with pytest.raises(ValueError, match=r"quantize_onnx: mode 'static' .* pass calibration="):
        hfx.quantize_onnx(onnx, mode="static")


def test_unknown_mode_names_the_stage_and_the_choices(onnx):
    with pytest.raises(ValueError, match=r"quantize_onnx: mode must be one of \['dynamic', 'int4', 'static'\], got 'int8'"):
        hfx.quantize_onnx(onnx, mode="int8")


def test_calibration_inputs_are_checked_against_the_graph(onnx):
    with pytest.raises(hfx.InputError, match="needs input"):
        hfx.quantize_onnx(onnx, mode="static", calibration=[{"input_ids": torch.ones(1, 4, dtype=torch.long)}])


def test_an_exported_is_refused_with_what_to_pass(exported):
    with pytest.raises(TypeError, match="quantize_onnx takes an OnnxProgram"):
        hfx.quantize_onnx(exported("llama"))


def _constant_weight_matmuls(program):
    initializers = program.model.graph.initializers
    return [n for n in program.model.graph if n.op_type == "MatMul" and n.inputs[1].name in initializers]


def test_int4_runs_every_constant_weight_matmul_as_matmulnbits(onnx, reference):
    linears = len(_constant_weight_matmuls(onnx))
    quantized = hfx.quantize_onnx(onnx, mode="int4")
    nbits = [n for n in quantized.model.graph if n.op_type == "MatMulNBits"]
    assert len(nbits) == linears == 15  # 7 linears in each of the 2 layers, and the LM head
    assert _constant_weight_matmuls(quantized) == []
    assert {n.attributes["bits"].value for n in nbits} == {4} and {n.attributes["block_size"].value for n in nbits} == {32}
    assert all("accuracy_level" not in n.attributes for n in nbits)  # float32 compute: no ISA-specific int8 path
    assert _weight_bytes(quantized) < 0.3 * _weight_bytes(onnx)
    assert quantized.fusions == onnx.fusions != {}  # the fused graph is quantized
    inputs, logits = reference
    got = quantized(**inputs).logits
    # Round-to-nearest int4 with one scale per 32 inputs (max |w| / 8) leaves each weight off by up to half a
    # step, ~8% rms of a Gaussian block: ~0.997 cosine per linear, ~0.985 through the 5 linear stages between the
    # embedding and the logits of 2 layers. Measured 0.9905. The kernel dequantizes to float32 before it multiplies
    # (accuracy_level unset), so AVX2-only and AVX-512 CPUs differ by float32 rounding only, far below this margin.
    assert cosine(logits, got) > 0.98


def test_int4_mode_is_recorded_with_its_group_size(exported):
    parts = hfx.lower_to_onnx(hfx.Components(items={"model": exported("llama")}))
    quantized = hfx.quantize_onnx(parts, mode="int4", group_size=16)
    assert quantized.meta.quantization == {"stage": "quantize_onnx", "mode": "int4", "calibrated": False, "group_size": 16}
    assert {n.attributes["block_size"].value for n in quantized["model"].model.graph if n.op_type == "MatMulNBits"} == {16}


@pytest.mark.parametrize("group_size", [0, 24, 512, "32"])
def test_int4_group_size_matmulnbits_cannot_take_is_a_value_error(onnx, group_size):
    with pytest.raises(ValueError, match="quantize_onnx: group_size must be"):
        hfx.quantize_onnx(onnx, mode="int4", group_size=group_size)
