"""patch_wkv_scan: RWKV's WKV recurrence for every token at once, with the loop's values and state."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.rwkv import modeling_rwkv

import hfx
from hfx import zoo
from hfx.patches import parallel_wkv, patch_wkv_scan
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY


def _wkv_inputs(length: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    channels = 5
    return (torch.randn(channels, generator=generator), torch.randn(channels, generator=generator),
            torch.randn(2, length, channels, generator=generator) * 3,  # keys far apart: the max matters
            torch.randn(2, length, channels, generator=generator))


@pytest.mark.parametrize("length", [1, 9])
def test_parallel_wkv_equals_transformers_loop_from_zero_and_from_a_state(length):
    time_decay, time_first, key, value = _wkv_inputs(9, seed=0)
    want, want_state = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, key, value, return_state=True)
    got, got_state = parallel_wkv(time_decay, time_first, key, value, return_state=True)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    for got_part, want_part in zip(got_state, want_state, strict=True):  # transformers' scaled representation
        torch.testing.assert_close(got_part, want_part, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    _, _, more_keys, more_values = _wkv_inputs(length, seed=1)
    want, want_next = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, more_keys, more_values,
                                                              state=want_state)
    got, got_next = parallel_wkv(time_decay, time_first, more_keys, more_values, state=got_state)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    for got_part, want_part in zip(got_next, want_next, strict=True):
        torch.testing.assert_close(got_part, want_part, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_no_state_is_returned_unless_asked():
    assert parallel_wkv(*_wkv_inputs(3, seed=2))[1] is None


def test_is_a_no_op_for_a_model_without_wkv():
    before = modeling_rwkv.rwkv_linear_attention
    with patch_wkv_scan(zoo.build("llama")):
        assert modeling_rwkv.rwkv_linear_attention is before


def test_rwkv_keeps_its_sequence_dynamic_and_matches_eager_on_a_new_shape():
    name = "causal-lm:rwkv"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7))(model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    report = hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported)
    assert report.passed, report


def _rwkv_past_its_rescale_block() -> torch.nn.Module:
    """Seven blocks, rescale_every 6: eager's first eval forward halves block 6's output weights in place."""
    import transformers

    torch.manual_seed(0)
    config = transformers.RwkvConfig(vocab_size=64, hidden_size=32, num_hidden_layers=7, attention_hidden_size=32,
                                     intermediate_size=64, context_length=64, rescale_every=6)
    return transformers.RwkvForCausalLM(config).eval()


@pytest.mark.parametrize("ran_eagerly", [False, True], ids=["fresh", "already-rescaled"])
def test_rwkv_past_its_rescale_block_gives_eager_logits_on_every_run_without_mutating_weights(ran_eagerly):
    model = _rwkv_past_its_rescale_block()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    if ran_eagerly:
        with torch.no_grad():
            model(input_ids=ids)
    reference = copy.deepcopy(model)  # the program shares the model's weights, which eager rescales in place
    exported = hfx.export(hfx.capture({"input_ids": ids}, model))
    assert not exported.program.graph_signature.buffers_to_mutate
    assert not any(node.target == torch.ops.aten.div_.Tensor for node in exported.program.graph.nodes)
    new = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference(input_ids=new).logits
    for _ in range(2):  # a program that divided its weights again on each run would drift
        torch.testing.assert_close(exported(input_ids=new).logits, want, rtol=FP32_PARITY, atol=FP32_PARITY)
