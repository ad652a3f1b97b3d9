"""The gated delta rule patch: transformers' numbers, a dynamic prompt length, the model's own modules only (its
contract: test_contract.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.kimi_linear import modeling_kimi_linear
from transformers.models.mamba import modeling_mamba
from transformers.models.qwen3_next import modeling_qwen3_next

import hfx
from hfx import zoo
from hfx.patches import patch_gated_delta_rule_chunk_scan, prefix_chunk_gated_delta_rule
from hfx.patches._delta_rule import chunk_states, prefix_chunk_kimi_delta_attention, unit_lower_inverse
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY

QWEN3_NEXT = "causal-lm:qwen3_next"  # the generated zoo's tiny Qwen3-Next: linear-attention and attention layers


# (reference, prefix form, decays per head: 1 for one per head, the key size for one per key channel)
RULES = {
    "gated_delta_rule": (modeling_qwen3_next.torch_chunk_gated_delta_rule, prefix_chunk_gated_delta_rule, 1),
    "kimi_delta_attention": (modeling_kimi_linear.chunk_kimi_delta_attention, prefix_chunk_kimi_delta_attention, 8),
}


def _delta_rule_inputs(length: int, *, decays: int = 1, heads: int = 2, k_dim: int = 8, v_dim: int = 4,
                       seed: int = 0) -> dict:
    """Inputs of one delta-rule call as the models make them: log decays <= 0, learning rates in (0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    decay_shape = (2, length, heads) if decays == 1 else (2, length, heads, decays)
    return {
        "query": torch.randn(2, length, heads, k_dim, generator=generator),
        "key": torch.randn(2, length, heads, k_dim, generator=generator),
        "value": torch.randn(2, length, heads, v_dim, generator=generator),
        "g": -2 * torch.rand(*decay_shape, generator=generator),
        "beta": torch.rand(2, length, heads, generator=generator),
        "initial_state": torch.randn(2, heads, k_dim, v_dim, generator=generator),
    }


# Within one chunk, at its edge, across several; chunks of 8 here so that few steps cross many chunks.
@pytest.mark.parametrize(("length", "chunk"), [(1, 64), (7, 64), (8, 8), (9, 8), (70, 8)])
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("rule", RULES)
def test_the_prefix_form_is_the_reference_to_rounding(rule, length, chunk, initial):
    reference_rule, prefix_rule, decays = RULES[rule]
    inputs = _delta_rule_inputs(length, decays=decays)
    if not initial:
        inputs.pop("initial_state")
    settings = {"chunk_size": chunk, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    reference, reference_state = reference_rule(**inputs, **settings)
    output, state = prefix_rule(**inputs, **settings)
    torch.testing.assert_close(output, reference, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    torch.testing.assert_close(state, reference_state, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    assert prefix_rule(**inputs, chunk_size=chunk)[1] is None  # the state only when asked


def test_query_and_key_heads_are_repeated_for_grouped_value_heads():
    """transformers 5.24 passes one query / key head per group of value heads; 5.22 repeats them before the call."""
    inputs = _delta_rule_inputs(9, heads=4)
    grouped = {**inputs, "query": inputs["query"][:, :, ::2], "key": inputs["key"][:, :, ::2]}
    repeated = {**inputs, "query": grouped["query"].repeat_interleave(2, dim=2), "key": grouped["key"].repeat_interleave(2, dim=2)}
    settings = {"chunk_size": 8, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    reference, reference_state = modeling_qwen3_next.torch_chunk_gated_delta_rule(**repeated, **settings)
    output, state = prefix_chunk_gated_delta_rule(**grouped, **settings)
    torch.testing.assert_close(output, reference, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    torch.testing.assert_close(state, reference_state, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_the_unit_lower_inverse_is_the_triangular_solve():
    strict = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(0)).tril(-1) * 0.3
    identity = torch.eye(16).expand(3, 16, 16)
    solved = torch.linalg.solve_triangular(identity + strict, identity, upper=False, unitriangular=True)
    torch.testing.assert_close(unit_lower_inverse(strict), solved, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


@pytest.mark.parametrize("chunks", [1, 2, 3, 9])
def test_chunk_states_are_the_loops_states(chunks):
    generator = torch.Generator().manual_seed(chunks)
    transition, update = torch.rand(1, 2, chunks, 3, 3, generator=generator), torch.rand(1, 2, chunks, 3, 4, generator=generator)
    states = [torch.rand(1, 2, 3, 4, generator=generator)]
    for i in range(chunks - 1):
        states.append(transition[:, :, i] @ states[-1] + update[:, :, i])
    torch.testing.assert_close(chunk_states(transition, update, states[0]), torch.stack(states, dim=2))


class _DeltaRule(torch.nn.Module):
    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def forward(self, query, key, value, g, beta):
        return self.rule(query, key, value, g, beta, chunk_size=4, use_qk_l2norm_in_kernel=True)[0]


@pytest.mark.parametrize("rule", RULES)
def test_the_reference_makes_the_length_static_and_the_prefix_form_keeps_it(rule):
    """Also the canary: when transformers' torch path exports with a dynamic length, the patch can go."""
    reference_rule, prefix_rule, decays = RULES[rule]
    inputs = _delta_rule_inputs(6, decays=decays)
    inputs.pop("initial_state")
    length = torch.export.Dim("length", max=64)
    shapes = {name: {1: length} for name in inputs}
    with pytest.raises(torch._dynamo.exc.UserError, match="length"):  # noqa: SLF001
        torch.export.export(_DeltaRule(reference_rule), (), inputs, dynamic_shapes=shapes)
    program = torch.export.export(_DeltaRule(prefix_rule), (), inputs, dynamic_shapes=shapes)
    other = _delta_rule_inputs(27, decays=decays, seed=1)  # another length, across seven chunks of 4
    other.pop("initial_state")
    expected = reference_rule(**other, chunk_size=4, use_qk_l2norm_in_kernel=True)[0]
    torch.testing.assert_close(program.module()(**other), expected, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_a_qwen3_next_exports_with_a_dynamic_prompt_and_matches_eager(models):
    model = models(QWEN3_NEXT)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(QWEN3_NEXT, batch=2, sequence=7), model))
    assert "sequence" in exported.dynamic_shapes.names
    # Another batch and length within the capture's one chunk of 64, then a prompt across two chunks.
    for batch, sequence in ((3, 11), (1, 70)):
        inputs = zoo.forward_inputs(QWEN3_NEXT, batch=batch, sequence=sequence)
        assert hfx.verify(model, inputs, exported, atol=FP32_PARITY).passed


def test_the_patch_swaps_only_the_models_own_modules(models):
    from transformers.models.olmo_hybrid import modeling_olmo_hybrid

    model = models(QWEN3_NEXT)
    others = vars(modeling_olmo_hybrid)["torch_chunk_gated_delta_rule"]
    with patch_gated_delta_rule_chunk_scan(model):
        assert modeling_qwen3_next.torch_chunk_gated_delta_rule is prefix_chunk_gated_delta_rule
        assert vars(modeling_olmo_hybrid)["torch_chunk_gated_delta_rule"] is others
        assert modeling_kimi_linear.chunk_kimi_delta_attention is RULES["kimi_delta_attention"][0]
    with patch_gated_delta_rule_chunk_scan(models("causal-lm:kimi_linear")):
        assert modeling_kimi_linear.chunk_kimi_delta_attention is prefix_chunk_kimi_delta_attention
    with patch_gated_delta_rule_chunk_scan(models("mamba")):  # a model without the rule: nothing to swap
        assert "torch_chunk_gated_delta_rule" not in vars(modeling_mamba)
        assert modeling_qwen3_next.torch_chunk_gated_delta_rule is not prefix_chunk_gated_delta_rule
