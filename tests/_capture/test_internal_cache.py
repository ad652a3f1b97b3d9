"""``decompose(internal_cache_length=N)``: one ``forward(tokens, input_pos)`` whose KV cache lives in its buffers."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from hfx._capture.internal_cache import InternalCacheLM, patch_custom_attention
from tests.tolerances import FP32_ONE_BLOCK

pytest.importorskip("executorch")

PROMPT = "models speak in tokens: numbers and words"


@pytest.fixture(scope="module")
def llama():
    return zoo.build("llama")


@pytest.fixture(scope="module")
def prompt():
    return dict(zoo.tokenizer()(PROMPT, return_tensors="pt"))


def _parts(model, prompt, custom_ops):
    return pipe(model, hfx.capture(prompt), hfx.decompose(internal_cache_length=24, custom_ops=custom_ops))


@pytest.fixture(scope="module", params=[True, False], ids=["custom_ops", "model_attention"])
def exported(request, llama, prompt):
    return hfx.export(_parts(llama, prompt, request.param)["decode"]), request.param


def test_one_decode_component_in_the_runner_contract(llama, prompt):
    parts = _parts(llama, prompt, True)
    assert list(parts) == ["decode"] and parts.meta.roles.internal_cache_length == 24
    decode = parts["decode"]
    assert isinstance(decode.module, InternalCacheLM) and decode.module.model is llama
    assert sorted(decode.kwargs) == ["input_pos", "tokens"] and decode.kwargs["tokens"].shape[0] == 1
    assert dict(decode.dynamic_shapes.bounds) == {"sequence": (1, 24)}
    assert parts.meta.generation.config["eos_token_id"] == llama.generation_config.eos_token_id


@pytest.mark.parametrize("custom_ops", [True, False])
def test_prompt_then_steps_give_the_eager_logits_and_leave_the_model_alone(llama, prompt, custom_ops):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = {k: v.clone() for k, v in llama.state_dict().items()}
    local = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    module = _parts(llama, prompt, custom_ops)["decode"].module
    ids = prompt["input_ids"]
    full = torch.cat([ids, torch.tensor([[7, 11]])], dim=-1)
    with torch.no_grad():
        want = llama(input_ids=full).logits
        first = module(ids, torch.tensor([0]))
        second = module(full[:, -2:-1], torch.tensor([ids.shape[1]]))
        third = module(full[:, -1:], torch.tensor([ids.shape[1] + 1]))
    assert first.shape == (1, 1, llama.config.vocab_size)
    for got, position in ((first, ids.shape[1] - 1), (second, ids.shape[1]), (third, ids.shape[1] + 1)):
        torch.testing.assert_close(got[0, -1], want[0, position], atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)
    assert all(torch.equal(before[k], v) for k, v in llama.state_dict().items())
    assert dict(ALL_ATTENTION_FUNCTIONS._local_mapping) == local


def test_the_graph_holds_executorch_kernels_only_with_custom_ops(exported):
    program, custom_ops = exported
    targets = {str(node.target) for node in program.program.graph.nodes if node.op == "call_function"}
    assert ({"llama.update_cache.default", "llama.custom_sdpa.default"} <= targets) is custom_ops
    assert any("index_copy" in target for target in targets) is not custom_ops
    assert [spec.name for spec in program.io.inputs] == ["tokens", "input_pos"]


def test_generate_over_the_export_gives_the_eager_tokens(llama, prompt, exported):
    program, _ = exported
    parts = hfx.Components(items={"decode": program}, meta=_parts(llama, prompt, False).meta)
    want = llama.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(hfx.generate(prompt, parts, max_new_tokens=8), want)
    with pytest.raises(hfx.InputError, match="one unpadded sequence"):
        hfx.generate(dict(zoo.tokenizer()([PROMPT, "hello"], return_tensors="pt", padding=True)), parts)
    with pytest.raises(hfx.InputError, match="cache of 24 positions"):
        hfx.generate(prompt, parts, max_new_tokens=40)


def test_refuses_what_a_cache_in_buffers_cannot_serve(llama, prompt):
    with pytest.raises(ValueError, match="T5ForConditionalGeneration is an encoder-decoder"):
        pipe(zoo.build("t5"), hfx.capture(zoo.inputs("t5")), hfx.decompose(internal_cache_length=16))
    with pytest.raises(ValueError, match="int >= 2"):
        pipe(llama, hfx.capture(prompt), hfx.decompose(internal_cache_length=1))


def test_patch_custom_attention_swaps_the_local_entry_and_restores_it():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    assert "sdpa" not in local
    with patch_custom_attention(object(), "sdpa"):
        assert local["sdpa"].func.__name__ == "_custom_attention"
    assert "sdpa" not in local  # it was not there before: removed, not set back to the class-wide one
    with pytest.raises(RuntimeError, match="boom"), patch_custom_attention(object(), "sdpa"):
        raise RuntimeError("boom")
    assert "sdpa" not in local
