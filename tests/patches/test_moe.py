"""patch_dense_experts, patch_dense_expert_modules: transformers' experts layers in a form every runtime lowers, with eager's outputs."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx.patches import (
    default_patches,
    dense_experts_forward,
    dense_identity_experts_forward,
    patch_dense_expert_modules,
    patch_dense_experts,
    patch_dense_identity_experts,
    patch_dense_parallel_experts,
)
from hfx.patches._moe import dense_expert_modules_forward, dense_indexed_expert_modules_forward
from tests.helpers import assert_leaves_forwards, forward_report_at_a_new_shape
from tests.tolerances import FP32_ONE_BLOCK


def _model(config_name: str, **extra) -> torch.nn.Module:
    """A one-layer random causal LM of ``config_name`` (4 experts, top 2) whose expert weights are all non-zero."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_experts_per_tok=2, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in _experts_of(model).parameters():  # biases start at zero; make every term count
            parameter.normal_(0, 0.5)
    return model


def _experts_of(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_transposed"))


def _experts(config_name: str, **extra) -> torch.nn.Module:
    return _experts_of(_model(config_name, **extra))


def _routing(tokens: int, experts: int = 4, top_k: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 32, generator=generator)
    weights, index = torch.randn(tokens, experts, generator=generator).softmax(-1).topk(top_k, dim=-1)
    return hidden, index, weights


# Mixtral: gated, concatenated gate/up; Qwen2-MoE: the same plus shared experts; GPT-OSS: interleaved
# gate/up, transposed weights, biases and its own clamped gate.
LAYOUTS = [
    ("MixtralConfig", {"num_local_experts": 4}),
    ("Qwen2MoeConfig", {"num_experts": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16}),
    ("GptOssConfig", {"num_local_experts": 4}),
]


@pytest.mark.parametrize(("config_name", "extra"), LAYOUTS, ids=[c for c, _ in LAYOUTS])
def test_dense_forward_equals_transformers_grouped_mm(config_name, extra):
    experts = _experts(config_name, **extra)
    assert experts.config._experts_implementation == "grouped_mm"
    hidden, index, weights = _routing(tokens=9)
    with torch.no_grad():
        want = experts(hidden, index, weights)
        got = dense_experts_forward(experts, hidden, index, weights)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_a_token_routed_twice_to_one_expert_gets_both_weights_as_the_loop_gives():
    # DeepSeek-V4's hash routing reads a token's slots from a table (tid2eid), which may name one expert twice.
    experts = _experts("MixtralConfig", num_local_experts=4)
    hidden, index, weights = _routing(tokens=9)
    index[:, 1] = index[:, 0]  # both slots on one expert
    with torch.no_grad():
        want = experts(hidden, index, weights)  # grouped_mm: every (token, slot) pair
        got = dense_experts_forward(experts, hidden, index, weights)
        once = dense_experts_forward(experts, hidden, index[:, :1], weights[:, :1])
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    assert not torch.allclose(got, once)  # the second slot counts


def test_is_a_no_op_without_experts():
    model = torch.nn.Linear(2, 2)
    with patch_dense_experts(model):
        assert type(model).forward is torch.nn.Linear.forward


def test_export_has_no_opaque_grouped_matmul_and_matches_eager_on_a_new_shape():
    model = _model("MixtralConfig", num_local_experts=4)
    assert any(getattr(p, "func", None) is patch_dense_experts for p in default_patches(model))
    generator = torch.Generator().manual_seed(0)
    exported = hfx.export(hfx.capture({"input_ids": torch.randint(0, 64, (2, 7), generator=generator)}, model))
    targets = {str(node.target) for node in exported.program.graph.nodes if node.op == "call_function"}
    assert not any("grouped_mm" in t or "histc" in t or "sort" in t for t in targets), targets
    new = torch.randint(0, 64, (3, 11), generator=generator)
    with torch.no_grad():
        want = model(input_ids=new).logits
    torch.testing.assert_close(exported(input_ids=new).logits, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


# --- one module per expert, looped over the experts a batch hits (Switch Transformers, NLLB-MoE) --------------


def _module_experts(task_type: str) -> torch.nn.Module:
    """The first one-module-per-expert layer of the generated zoo's ``task_type`` model, biases made non-zero."""
    model = zoo.build(task_type)
    experts = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleDict) and "expert_0" in m)
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.normal_(0, 0.5)
    return experts


def test_dense_expert_modules_equal_switch_transformers_loop():
    experts = _module_experts("seq2seq-lm:switch_transformers")
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, experts["expert_0"].wi.in_features, generator=generator)
    choice = torch.randint(0, experts.num_experts, (9,), generator=generator)
    selected = torch.nn.functional.one_hot(choice, experts.num_experts)[:, None]  # (T, 1, E)
    selected[2] = 0  # a token over the expert's capacity goes to no expert
    weights = torch.rand(9, 1, generator=generator)
    with torch.no_grad():
        want = experts(hidden, selected, weights)
        got = dense_expert_modules_forward(experts, hidden, selected, weights)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_dense_expert_modules_equal_nllb_moe_loop_with_its_token_dropout():
    experts = _module_experts("seq2seq-lm:nllb-moe").eval()
    experts.moe_token_dropout = 0.2
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(9, experts["expert_0"].fc1.in_features, generator=generator)
    mask = torch.nn.functional.one_hot(torch.randint(0, experts.num_experts, (9,), generator=generator),
                                       experts.num_experts)  # NLLB's router: top-1 one-hot, one-hot again inside
    probs = torch.rand(9, experts.num_experts, generator=generator)
    with torch.no_grad():
        want = experts(hidden, mask, probs)
        got = dense_indexed_expert_modules_forward(experts, hidden, mask, probs)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_expert_modules_patch_is_a_no_op_without_them():
    assert_leaves_forwards(patch_dense_expert_modules, zoo.build("mixtral"))


def test_switch_transformers_exports_and_matches_eager_on_a_new_shape():
    model = zoo.build("seq2seq-lm:switch_transformers")
    inputs = zoo.forward_inputs("seq2seq-lm:switch_transformers", batch=2, sequence=7)
    exported = hfx.export(hfx.capture(inputs)(model))
    report = hfx.verify(model, zoo.forward_inputs("seq2seq-lm:switch_transformers", batch=3, sequence=11), exported)
    assert report.passed, report


# patch_dense_identity_experts

LONGCAT = "causal-lm:longcat_flash"


def test_dense_identity_experts_equal_longcats_loop_with_zero_experts_routed():
    model = zoo.build(LONGCAT)
    experts = next(m for m in model.modules() if type(m).__name__ == "LongcatFlashExperts")
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, model.config.hidden_size, generator=generator)
    # every token routed to one routed and one zero-computation expert at least once, one token twice
    index = torch.stack([torch.arange(6) % experts.num_routed_experts,
                         experts.num_routed_experts + torch.arange(6) % experts.zero_expert_num], dim=1)
    index[0, 1] = index[0, 0]
    weights = torch.rand(6, 2, generator=generator)
    with torch.no_grad():
        want = experts(hidden, index, weights)
        got = dense_identity_experts_forward(experts, hidden, index, weights)
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    assert_leaves_forwards(patch_dense_identity_experts, zoo.build("mixtral"))


def test_longcat_exports_and_matches_eager_on_a_new_shape():
    model = zoo.build(LONGCAT)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(LONGCAT, batch=2, sequence=7))(model))
    report = hfx.verify(model, zoo.forward_inputs(LONGCAT, batch=3, sequence=11), exported)
    assert report.passed, report


# patch_dense_parallel_experts

JETMOE = "causal-lm:jetmoe"


def test_dense_parallel_experts_equal_jetmoes_sorted_splits_and_are_restored():
    from transformers.models.jetmoe import modeling_jetmoe as jetmoe

    from hfx.patches._parallel_experts import dense_attention_experts_map, dense_parallel_moe_forward

    model = zoo.build(JETMOE)
    inputs = zoo.forward_inputs(JETMOE, batch=3, sequence=11)
    originals = (jetmoe.JetMoeMoE.forward, jetmoe.JetMoeMoA.map, jetmoe.JetMoeMoA.reduce)
    with torch.no_grad():
        want = model(**inputs).logits
        with patch_dense_parallel_experts(model):
            assert jetmoe.JetMoeMoE.forward is dense_parallel_moe_forward
            assert jetmoe.JetMoeMoA.map is dense_attention_experts_map
            got = model(**inputs).logits
    assert (jetmoe.JetMoeMoE.forward, jetmoe.JetMoeMoA.map, jetmoe.JetMoeMoA.reduce) == originals
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    assert_leaves_forwards(patch_dense_parallel_experts, zoo.build("mixtral"))


def test_jetmoe_lowers_to_executorch_and_matches_eager_on_a_new_shape():
    report = forward_report_at_a_new_shape(JETMOE, hfx.lower_to_pte)
    assert report.passed, report
