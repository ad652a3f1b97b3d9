"""Cache-layer patches: sliding-window models generate eager's tokens (their contract: test_contract.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicSlidingWindowLayer

import hfx
from hfx import zoo
from hfx.patches import default_patches, patch_sliding_window_cache
from tests.helpers import CACHE_ARGUMENT

METHODS = ("update", "get_mask_sizes", "get_seq_length")
ORIGINAL = {name: vars(DynamicSlidingWindowLayer)[name] for name in METHODS}
WINDOW, PROMPT, NEW_TOKENS = 3, 5, 6  # the window is shorter than the prompt and than prompt + new tokens


def _assert_restored() -> None:
    for name in METHODS:
        assert vars(DynamicSlidingWindowLayer)[name] is ORIGINAL[name], name


@pytest.fixture(scope="module")
def mistral():
    """One Mistral layer with a 3-token sliding window."""
    config = transformers.MistralConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        sliding_window=WINDOW, initializer_range=0.2)
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval()


def _eager(model, prompt):
    with torch.no_grad():
        return model.generate(**copy.deepcopy(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              do_sample=False)


def test_sliding_window_cache_is_a_default_patch():
    assert patch_sliding_window_cache in default_patches(torch.nn.Linear(1, 1))


def test_patched_cache_keeps_every_token_and_gives_eager_tokens(mistral):
    prompt = zoo.inputs("mistral", batch=2, sequence=PROMPT)
    expected = _eager(mistral, prompt)
    with patch_sliding_window_cache(), torch.no_grad():
        output = mistral.generate(**copy.deepcopy(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False, return_dict_in_generate=True)
    assert torch.equal(output.sequences, expected)
    layer = output.past_key_values.layers[0]
    assert isinstance(layer, DynamicSlidingWindowLayer)
    assert layer.keys.shape[-2] == PROMPT + NEW_TOKENS - 1 > WINDOW  # unpatched, it holds WINDOW - 1


def test_decode_captured_with_the_full_past(mistral):
    parts = hfx.decompose(hfx.capture(zoo.inputs("mistral", batch=2, sequence=PROMPT), mistral))
    decode = parts["decode"].kwargs
    assert decode[CACHE_ARGUMENT].layers[0].keys.shape[-2] == decode["attention_mask"].shape[-1] - 1
    _assert_restored()


def test_sliding_window_model_generates_eager_tokens_beyond_the_window(mistral):
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("mistral", batch=2, sequence=PROMPT), mistral)))
    assert "past_sequence" in parts["decode"].io.bounds  # one decode graph for every past length
    prompt = zoo.inputs("mistral", batch=2, sequence=PROMPT + 2)
    got = hfx.generate(copy.deepcopy(prompt), parts, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, _eager(mistral, prompt))


def test_without_the_patch_the_error_names_the_counter(mistral):
    parts = hfx.decompose(hfx.capture(zoo.inputs("mistral", batch=2, sequence=PROMPT), mistral))
    others = [p for p in default_patches(mistral) if p is not patch_sliding_window_cache]
    with pytest.raises(hfx.CaptureError, match="'cumulative_length' of DynamicSlidingWindowLayer"):
        hfx.export(parts["prefill"], patches=others)
