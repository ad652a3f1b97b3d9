"""ORT_FUSIONS: ONNX Runtime's fused operators in hfx's decoder graphs, op by op, with eager's values and tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")

import hfx  # noqa: E402
from hfx import zoo  # noqa: E402
from hfx.backends import ORT_ATTENTION_FUSIONS, ORT_FUSIONS  # noqa: E402
from hfx.backends._onnx_fusions import _causal_inputs_only, _gqa, _standard_attention  # noqa: E402
from hfx._generate import initial_cache  # noqa: E402
from hfx.backends._onnx import default_providers, default_threads  # noqa: E402
from tests.helpers import NEW_SHAPE, eager_tokens, one_layer  # noqa: E402
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY  # noqa: E402

DECODERS = ("llama", "qwen2", "mistral")  # mistral: a sliding window shorter than the prompts
FUSED = {"RotaryEmbedding", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
# The graph that reads a cache gets GroupQueryAttention; the prefill, with none, MultiHeadAttention (a graph
# without a cache may be a bidirectional encoder, which GQA's causal masking would break).
ATTENTION = {"prefill": "MultiHeadAttention", "decode": "GroupQueryAttention"}
# Per graph of the one-layer decoders (tests.helpers.one_layer: the zoo's with one layer, the same fusions in fewer
# nodes): the input norm, the post-attention norm and the final norm (the first fused alone, the others with the
# residual add before them), q and k rotated, one attention.
COUNTS = {"rms_normalization": 3, "skip_rms_normalization": 2, "rotary_embedding": 2, "attention": 1}


@pytest.fixture(scope="module")
def lowered():
    """``(model, programs)`` per decoder and decomposition, lowered once per module."""
    cache: dict[tuple[str, bool], tuple[torch.nn.Module, hfx.Components]] = {}

    def get(name: str, multi_token_decode: bool = False) -> tuple[torch.nn.Module, hfx.Components]:
        if (name, multi_token_decode) not in cache:
            model = one_layer(name)
            parts = hfx.decompose(hfx.capture(zoo.inputs(name), model), multi_token_decode=multi_token_decode)
            cache[name, multi_token_decode] = model, hfx.lower_to_onnx(parts)  # ORT_FUSIONS
        return cache[name, multi_token_decode]

    return get


def _ops(program) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in program.model.graph:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_graphs_hold_the_fused_operators(lowered, name):
    _, programs = lowered(name)
    for program in programs.values():
        ops = _ops(program)
        assert FUSED | {ATTENTION[program.name]} <= set(ops), (program.name, ops)
        assert ops[ATTENTION[program.name]] == 1 and ops["RotaryEmbedding"] == 2, ops
        assert not {"Softmax", "Pow", "ReduceMean", "Neg", "Trilu"} & set(ops), ops  # nothing left unfused
        assert program.fusions == COUNTS
        assert [v.name for v in program.model.graph.outputs] == list(program.io.output_names)


@pytest.mark.parametrize("name", DECODERS)
def test_generate_gives_eager_tokens_over_left_padding(lowered, name):
    model, programs = lowered(name)
    inputs = zoo.inputs(name, **NEW_SHAPE)  # another batch and length than the capture, row 0 left-padded
    assert int(inputs["attention_mask"][0].sum()) < NEW_SHAPE["sequence"]
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=16), eager_tokens(model, inputs, 16))


def test_prefill_logits_and_cache_match_eager(lowered):
    model, programs = lowered("llama")
    inputs = zoo.inputs("llama", **NEW_SHAPE)
    prefill = programs["prefill"]
    positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    got = prefill(**inputs, position_ids=positions, past_key_values=initial_cache(prefill, NEW_SHAPE["batch"],
                                                                                   "past_key_values"))
    with torch.no_grad():
        want = model(**inputs, position_ids=positions, use_cache=True)
    torch.testing.assert_close(got.logits[:, -1], want.logits[:, -1], atol=FP32_PARITY, rtol=0)
    valid = inputs["attention_mask"].bool()[:, None, :, None]  # padded positions' keys are never read
    for layer, (ours, theirs) in enumerate(zip(got.past_key_values.layers, want.past_key_values.layers)):
        torch.testing.assert_close(ours.keys * valid, theirs.keys * valid, atol=FP32_ONE_BLOCK, rtol=0, msg=f"layer {layer}")
        torch.testing.assert_close(ours.values * valid, theirs.values * valid, atol=FP32_ONE_BLOCK, rtol=0)


def test_multi_token_decode_takes_a_block_over_a_past(lowered):
    model, programs = lowered("llama", multi_token_decode=True)
    decode = programs["decode"]
    assert set(_ops(decode)) >= FUSED | {"GroupQueryAttention"}
    inputs = zoo.inputs("llama", batch=2, sequence=12)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = model(**inputs, position_ids=positions).logits
        past = model(input_ids=ids[:, :8], attention_mask=mask[:, :8], position_ids=positions[:, :8]).past_key_values
    got = decode(input_ids=ids[:, 8:], attention_mask=mask, position_ids=positions[:, 8:], past_key_values=past)
    torch.testing.assert_close(got.logits, want[:, 8:], atol=FP32_PARITY, rtol=0)  # 4 tokens at once over 8, batch 2
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=12), eager_tokens(model, inputs, 12))


def _assert_matches_bert(program, bert) -> None:
    """``program`` (of the zoo's BERT) gives eager's last hidden state at another batch and length than the capture."""
    inputs = zoo.inputs("bert", **NEW_SHAPE)
    with torch.no_grad():
        want = bert(**inputs).last_hidden_state
    torch.testing.assert_close(program(**inputs).last_hidden_state, want, atol=FP32_PARITY, rtol=0)


def test_an_encoders_attention_becomes_multi_head_attention_and_keeps_eagers_values(lowered_onnx, models):
    program = lowered_onnx("bert")  # ORT_FUSIONS; the zoo's test checks every representative's parity too
    ops = _ops(program)
    assert ops.get("MultiHeadAttention") == program.fusions["attention"] == 2 and "Softmax" not in ops, ops
    _assert_matches_bert(program, models("bert"))


def _mask_reading(values: tuple[str, ...], sizes: tuple[str, ...] = ()):
    """A mask value built from the graph inputs ``values`` and from the shapes of ``sizes`` (never computed)."""
    import onnx_ir as ir

    inputs = [ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2, 7]))
              for name in (*values, *sizes)]
    parts = [ir.Node("", "Cast", [value], attributes=[ir.AttrInt64("to", 1)]) for value in inputs[:len(values)]]
    parts += [ir.Node("", "Shape", [value]) for value in inputs[len(values):]]
    mask = ir.Node("", "Concat", [part.outputs[0] for part in parts], attributes=[ir.AttrInt64("axis", 0)])
    ir.Graph(inputs, [mask.outputs[0]], nodes=[*parts, mask])
    return mask.outputs[0]


def test_gqa_takes_only_a_graph_with_a_cache_whose_mask_is_causal(lowered_onnx):
    # GroupQueryAttention masks causally on top of its bias. A graph without a cache may be a bidirectional
    # encoder: the Llama forward (no cache input) gets MultiHeadAttention. A mask that reads other inputs may let a
    # block attend both ways (PaliGemma's prefix by token_type_ids, Gemma 3's image tokens by input_ids).
    forward = _ops(lowered_onnx("llama"))
    assert "GroupQueryAttention" not in forward and forward["MultiHeadAttention"] == 2
    assert _causal_inputs_only(_mask_reading(("attention_mask", "position_ids"), sizes=("input_ids",)))
    assert not _causal_inputs_only(_mask_reading(("attention_mask", "token_type_ids")))
    assert not _causal_inputs_only(_mask_reading(("input_ids",)))


def test_an_attention_no_fused_operator_takes_goes_back_to_standard_ops(exported, models):
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa

    def intermediate_sdpa(model):
        return fuse_sdpa(model)

    def standard_attention(model):
        return _standard_attention().apply_to_model(model)

    program = hfx.lower_to_onnx(exported("bert"), fusions=(intermediate_sdpa, standard_attention))
    assert program.fusions == {"intermediate_sdpa": 2, "standard_attention": 2}
    ops = _ops(program)
    assert ops["Softmax"] == 2 and all(node.domain in ("", "ai.onnx") for node in program.model.graph), ops
    _assert_matches_bert(program, models("bert"))


def test_the_attention_rule_matches_from_one_output():
    # onnxscript's matcher tries every combination of candidate nodes for each further output node of a
    # pattern, a time cubic in the graph (over 20 minutes at 30 layers); one output node is matched from there.
    assert all(rule._target_pattern.has_single_output_node for rule in _gqa([]).rules)
    assert ORT_ATTENTION_FUSIONS == ORT_FUSIONS  # the name of the time the attention fusion was opt-in


def test_no_fusions_keeps_standard_onnx(lowered_onnx):
    program = lowered_onnx("llama", fusions=())
    assert program.fusions == {}
    assert all(node.domain in ("", "ai.onnx") for node in program.model.graph)


def test_a_failing_fusion_is_a_lowering_error_naming_it(exported):
    def broken(model):
        raise RuntimeError("no pattern today")

    with pytest.raises(hfx.LoweringError, match=r"the fusion 'broken' failed: .*no pattern today.*fusions=\(\)"):
        hfx.lower_to_onnx(exported("llama"), fusions=(*ORT_FUSIONS, broken))


def test_fusions_are_saved_and_loaded(lowered, tmp_path):
    _, programs = lowered("llama")
    loaded = hfx.load(hfx.save(tmp_path / "llama", programs))
    assert {name: dict(p.fusions) for name, p in loaded.items()} == {name: COUNTS for name in programs}


# --- threads and providers ----------------------------------------------------------------------


def test_sessions_run_on_the_given_threads_and_providers(lowered_onnx):
    program = lowered_onnx("llama", threads=1, providers=("CPUExecutionProvider",), fusions=())
    options = program._session.get_session_options()
    assert (program.threads, options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1, 1)
    assert program._session.get_providers() == ["CPUExecutionProvider"]
    import attrs

    wider = attrs.evolve(program, threads=2)
    assert wider._session.get_session_options().intra_op_num_threads == 2
    inputs = zoo.inputs("llama", **NEW_SHAPE)
    assert torch.equal(wider(**inputs).logits, program(**inputs).logits)


def test_default_threads_and_providers_are_explicit(lowered_onnx):
    program = lowered_onnx("llama", fusions=())
    import onnxruntime

    assert program.threads == default_threads() >= 1
    assert program._session.get_session_options().intra_op_num_threads == program.threads
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert program.providers == default_providers() == (("CUDAExecutionProvider",) if cuda else ()) + ("CPUExecutionProvider",)


@pytest.mark.parametrize(("option", "value", "match"), [
    ("threads", 0, "threads must be a positive int"),
    ("threads", True, "threads must be a positive int"),
    ("providers", ("NoSuchExecutionProvider",), "providers must be a non-empty tuple of ONNX Runtime execution providers"),
    ("providers", "CPUExecutionProvider", "providers must be a non-empty tuple"),
])
def test_bad_threads_or_providers_are_value_errors(exported, option, value, match):
    with pytest.raises(ValueError, match=f"lower_to_onnx: {match}"):
        hfx.lower_to_onnx(exported("llama"), **{option: value})
