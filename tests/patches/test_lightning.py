"""patch_lightning_attention: MiniMax's decayed linear attention without loops over the length."""

from __future__ import annotations

import copy

import torch
import transformers

import hfx
from hfx import zoo
from hfx.patches import decayed_linear_attention, patch_lightning_attention
from tests.helpers import assert_leaves_forwards
from tests.tolerances import FP32_ONE_BLOCK

MINIMAX = "causal-lm:minimax"


def _recurrence(query, key, value, state, slope):
    """The recurrence token by token, as transformers' step branch computes it."""
    ratio, outputs = torch.exp(-slope), []
    for t in range(query.shape[2]):
        state = ratio * state + key[:, :, t:t + 1].transpose(-1, -2) @ value[:, :, t:t + 1]
        outputs.append(query[:, :, t:t + 1] @ state)
    return torch.cat(outputs, dim=2), state


def test_the_parallel_form_equals_the_recurrence_from_any_state():
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 3, 9, 4, generator=generator) for _ in range(3))
    state, slope = torch.randn(2, 3, 4, 4, generator=generator), torch.rand(3, 1, 1, generator=generator)
    for start in (torch.zeros_like(state), state):
        got, want = decayed_linear_attention(query, key, value, start, slope), _recurrence(query, key, value, start, slope)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def _minimax(block_size: int) -> torch.nn.Module:
    config = zoo.entry(MINIMAX).config()
    config.block_size = block_size  # several blocks in a prompt of 11 tokens
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_the_patched_model_gives_transformers_logits_over_blocks_and_cached_steps():
    model = _minimax(block_size=4)
    ids = torch.randint(3, 200, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    more = torch.cat([mask, torch.ones(2, 3, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=True)
        want_step = model(input_ids=ids[:, :3], attention_mask=more, past_key_values=copy.deepcopy(want.past_key_values))
        with patch_lightning_attention(model):
            got = model(input_ids=ids, attention_mask=mask, use_cache=True)
            got_step = model(input_ids=ids[:, :3], attention_mask=more, past_key_values=copy.deepcopy(want.past_key_values))
    torch.testing.assert_close(got.logits, want.logits, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    torch.testing.assert_close(got_step.logits, want_step.logits, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_an_export_keeps_the_sequence_dynamic():
    model = _minimax(block_size=4)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(MINIMAX, batch=2, sequence=7))(model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    report = hfx.verify(model, zoo.forward_inputs(MINIMAX, batch=3, sequence=11), exported)
    assert report.passed, report


def test_is_a_no_op_for_other_attention():
    assert_leaves_forwards(patch_lightning_attention, zoo.build("llama"))
