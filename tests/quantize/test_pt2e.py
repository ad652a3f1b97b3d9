"""``quantize_pt2e``: PT2E quantization of an exported graph, alone and piped into ``lower_to_pte``."""

from __future__ import annotations

import attrs
import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, assert_same_state, one_layer, state_of
from tests.quantize.metrics import CHANNEL, cosine, cosine_bound, rounding_rms, top1_agreement

# XNNPACK's schemes quantize activations per token (64 values, asymmetric int8) when the linear runs; the weights
# are int4 per group of 32 inputs (15 steps) or int8 per output channel (254 steps). Its integer sums are exact
# on every x86 ISA (int16 products added into int32 without VNNI), so the bounds hold on AVX2 and AVX-512 alike.
TOKEN = rounding_rms(255, CHANNEL)
INT4_BOUND = cosine_bound(rounding_rms(15, 32), TOKEN)  # 0.948
INT8_BOUND = cosine_bound(rounding_rms(254, CHANNEL), TOKEN)  # 0.9996

pytest.importorskip("executorch")
pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def int4(exported):
    return hfx.quantize_pt2e(exported("llama"))


def _targets(program):
    return {str(node.target) for node in program.graph.nodes if node.op == "call_function"}


def test_8da4w_is_an_exported_with_the_same_contract_and_int4_weights(exported, int4, reference):
    source = exported("llama")
    assert isinstance(int4, hfx.Exported)
    assert int4.io is source.io and int4.dynamic_shapes is source.dynamic_shapes
    assert "torchao.dequantize_affine.default" in _targets(int4.program)
    weights = [t for k, t in int4.program.state_dict.items() if k.startswith("_frozen_param")]  # convert_pt2e's folded weights
    assert all(t.dtype == torch.int8 for t in weights)
    assert len(weights) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert all(int(t.min()) >= -8 and int(t.max()) <= 7 for t in weights)
    inputs, logits = reference
    got = int4(**inputs).logits
    assert got.shape == logits.shape
    assert cosine(logits, got) > INT4_BOUND
    assert top1_agreement(logits, got) > 0.6  # flips where the top two of 256 flat logits are within the ~10% error


def test_8da8w_curried_keeps_the_input_record_unchanged(exported, models, reference):
    source = exported("llama")
    code, state, model_state = source.program.graph_module.code, dict(source.program.state_dict), state_of(models("llama"))
    int8 = pipe(source, hfx.quantize_pt2e(scheme="8da8w"))
    assert "quantized_decomposed.dequantize_per_channel.default" in _targets(int8.program)
    inputs, logits = reference
    assert cosine(logits, int8(**inputs).logits) > INT8_BOUND
    assert source.program.graph_module.code == code
    assert all(source.program.state_dict[k] is v for k, v in state.items())
    assert_same_state(models("llama"), model_state)
    assert "quantize" not in " ".join(_targets(source.program))


def test_pipe_to_pte_runs_on_xnnpack_and_round_trips(tmp_path):
    # A one-layer Llama: the same quantized linears, norms and attention as the two-layer one that the tests above
    # quantize, lowered to XNNPACK in about half the time (ExecuTorch lowers ~12 s per decoder layer here).
    model = one_layer("llama")
    int4 = hfx.quantize_pt2e(hfx.export(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), model)))
    program = pipe(int4, hfx.lower_to_pte)
    fp32_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert len(program.buffer) < 0.5 * fp32_bytes
    inputs = zoo.inputs("llama", **NEW_SHAPE)
    with torch.no_grad():
        logits = model(**inputs).logits
    got = program(**inputs).logits
    assert cosine(logits, got) > INT4_BOUND
    # The .pte runs the same quantized arithmetic as the Exported; an activation that lands on a rounding tie
    # can take the next step in one of them: one step of a token's range (~2% of its spread) on one input.
    assert torch.allclose(got, int4(**inputs).logits, atol=0.05)
    loaded = hfx.load(hfx.save(tmp_path / "pte", program))
    assert torch.equal(loaded(**inputs).logits, got)
    reloaded = hfx.load(hfx.save(tmp_path / "pt2", int4))
    assert torch.equal(reloaded(**inputs).logits, int4(**inputs).logits)


def test_components_take_per_component_calibration(generative, samples):
    model, parts = generative("llama")
    calibration = hfx.calibration_inputs(model, samples[:1], parts, max_new_tokens=3)
    quantized = hfx.quantize_pt2e(parts, scheme="8da8w", calibration=calibration)
    assert list(quantized) == list(parts)
    assert dict(quantized.meta.quantization) == {"stage": "quantize_pt2e", "scheme": "8da8w", "calibrated": True}
    assert not parts.meta.quantization
    prompt = samples[2]
    with torch.no_grad():
        eager = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(hfx.generate(prompt, quantized, max_new_tokens=4)[:, :-2], eager[:, :-2])


def test_static_int8_needs_calibration(exported):
    with pytest.raises(ValueError, match=r"quantize_pt2e: scheme 'int8' .* pass calibration="):
        hfx.quantize_pt2e(exported("llama"), scheme="int8")


def test_unknown_scheme_names_the_stage_and_the_choices(exported):
    with pytest.raises(ValueError, match=r"quantize_pt2e: scheme must be one of \['8da4w', '8da8w', 'int8'\], got 'int4'"):
        hfx.quantize_pt2e(exported("llama"), scheme="int4")


def test_group_size_must_divide_the_linear_inputs(exported):
    with pytest.raises(ValueError, match=r"group_size=48 does not divide .* pick a divisor of \[64, 128\]"):
        hfx.quantize_pt2e(exported("llama"), group_size=48)


def test_a_capture_is_refused_with_what_to_pass():
    capture = hfx.capture({"input": torch.ones(2, 64)}, torch.nn.Linear(64, 8))
    with pytest.raises(TypeError, match="quantize_pt2e takes an Exported"):
        hfx.quantize_pt2e(capture)


def test_calibration_must_be_input_dicts(exported):
    with pytest.raises(TypeError, match="calibration must be a list of input dicts"):
        hfx.quantize_pt2e(exported("llama"), scheme="int8", calibration=[torch.ones(2, 3)])


def test_records_stay_frozen(int4):
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        int4.program = None
