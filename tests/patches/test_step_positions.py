"""patch_symbolic_step_positions: ProphetNet's decode-step positions kept symbolic (no int())."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

import hfx
from hfx import zoo
from hfx.patches import patch_symbolic_step_positions
from tests.helpers import assert_eager_tokens, assert_leaves_forwards, decomposed

PROPHETNET = "causal-lm:prophetnet"


def _positional(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if type(m).__name__ == "ProphetNetPositionalEmbeddings")


def test_a_steps_position_is_the_originals():
    model = zoo.build(PROPHETNET)
    positions = _positional(model)
    cache = DynamicCache()
    cache.update(torch.zeros(2, 1, 5, 4), torch.zeros(2, 1, 5, 4), 0)
    with torch.no_grad():
        want = positions((2, 1), "cpu", None, cache)
        with patch_symbolic_step_positions(model):
            got = positions((2, 1), "cpu", None, cache)
            prompt = positions((2, 3), "cpu")  # no cache: the original's branch
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)) and int(got[1]) == positions.padding_idx + 6
    assert torch.equal(prompt[1], positions((2, 3), "cpu")[1])
    assert_leaves_forwards(patch_symbolic_step_positions, zoo.build("llama"))


def test_prophetnet_keeps_a_prefill_and_generates_eagers_tokens():
    # its decoder asserts one token per cached step, so decompose does not merge the steps into one graph (the
    # encoder-decoder's cells pass on every runtime in benchmarks/results/coverage-generated.json)
    name = PROPHETNET
    model, parts = decomposed(name)
    step = parts["decode"].kwargs
    assert "prefill" in parts and step.get("decoder_input_ids", step.get("input_ids")).shape[1] == 1
    assert_eager_tokens(model, hfx.export(parts), name)
