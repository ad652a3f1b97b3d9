"""``quantize_ov``: NNCF weight compression and full int8 quantization of an ``OvProgram``."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from tests.quantize.metrics import cosine, top1_agreement

pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def ov(exported):
    return hfx.lower_to_ov(exported("llama"))


def _constant_types(program):
    return {str(op.get_output_element_type(0)) for op in program.model.get_ordered_ops() if op.get_type_name() == "Constant"}


# Measured on the random-init tiny Llama: cosine 0.9999 / 0.994, top-1 0.97 / 0.76 (flat random logits).
@pytest.mark.parametrize(("mode", "weight_type", "bound", "top1"),
                         [("int8", "<Type: 'uint8_t'>", 0.999, 0.9), ("int4", "<Type: 'int4_t'>", 0.98, 0.6)])
def test_weight_compression(ov, reference, mode, weight_type, bound, top1):
    before = _constant_types(ov)
    quantized = pipe(ov, hfx.quantize_ov(mode=mode, group_size=32))
    assert isinstance(quantized, hfx.OvProgram) and quantized.io is ov.io
    assert weight_type in _constant_types(quantized) and weight_type not in before
    inputs, logits = reference
    got = quantized(**inputs).logits
    assert cosine(logits, got) > bound
    assert top1_agreement(logits, got) > top1
    assert _constant_types(ov) == before
    assert torch.allclose(ov(**inputs).logits, logits, atol=1e-4)


def test_static_int8_calibrates_and_round_trips(ov, samples, reference, tmp_path):
    quantized = hfx.quantize_ov(ov, mode="int8-static", calibration=samples)
    assert "FakeQuantize" in {op.get_type_name() for op in quantized.model.get_ordered_ops()}
    assert quantized.graph_fixes == ov.graph_fixes != ()  # what the quantized graph was lowered with
    inputs, logits = reference
    got = quantized(**inputs).logits
    assert cosine(logits, got) > 0.99  # measured 0.993
    loaded = hfx.load(hfx.save(tmp_path / "ov", quantized))
    assert torch.allclose(loaded(**inputs).logits, got, atol=1e-5)


def test_static_needs_calibration(ov):
    with pytest.raises(ValueError, match=r"quantize_ov: mode 'int8-static' .* pass calibration="):
        hfx.quantize_ov(ov, mode="int8-static")


@pytest.mark.parametrize(("options", "match"), [
    ({"mode": "int2"}, r"quantize_ov: mode must be one of \['int4', 'int8', 'int8-static'\], got 'int2'"),
    ({"mode": "int4", "ratio": 0}, r"quantize_ov: ratio must be a number in \(0, 1\]"),
    ({"mode": "int4", "group_size": 0}, r"quantize_ov: group_size must be a positive int"),
])
def test_bad_options_name_the_stage(ov, options, match):
    with pytest.raises(ValueError, match=match):
        hfx.quantize_ov(ov, **options)
