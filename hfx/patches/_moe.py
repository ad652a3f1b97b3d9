"""Mixture-of-experts layers in a form every runtime can lower.

transformers 5.x (``integrations/moe.py``) runs the experts of a ``@use_experts_implementation``
class (Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS, DeepSeek-V3 …) with ``grouped_mm`` by default. Under
``torch.export`` with float32 weights ``_can_use_grouped_mm`` is false and the experts become
``torch.ops.transformers.grouped_mm_fallback``, an opaque custom op whose body loops over
``offs.tolist()``, surrounded by ``sort``, ``histc`` and ``index_put``. torch runs the program, but
ONNX has no translation for the custom op ("No ONNX function found for transformers.grouped_mm_fallback"),
OpenVINO no conversion rule, ExecuTorch no kernel. The upstream ``batched_mm`` alternative gathers
one weight matrix per (token, expert) pair, which for a real model's prefill needs terabytes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import Patch, source_contains, swap_attr, swap_attr_on_each
from hfx.patches._expert_matmuls import experts_linear
from hfx.patches._parallel_experts import patch_dense_parallel_experts


def dense_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output for ``hidden_states (T, H)``: every expert on every token, weighted by the routing.

    The same function as transformers' ``grouped_mm_experts_forward`` with static shapes: the tokens
    tiled over the experts, one batched matmul per projection, the outputs scaled by the dense
    routing weights (zero where a token is not routed, the sum of its slots' weights where it is) and
    summed over the experts. It computes ``num_experts / top_k`` times the routed arithmetic, but its
    memory grows with tokens x experts x intermediate size only (``batched_mm`` gathers a weight matrix
    per token). Handles the decorator's variants: gated or not, biases, transposed weights, a class's
    own ``_apply_gate`` and a post-expert norm.
    """
    num_tokens, hidden_dim = hidden_states.shape
    tiled = hidden_states.repeat(self.num_experts, 1).view(self.num_experts, num_tokens, hidden_dim)
    up = "gate_up_proj" if self.has_gate else "up_proj"
    projected = experts_linear(tiled, getattr(self, up), getattr(self, f"{up}_bias", None) if self.has_bias else None,
                                transposed=self.is_transposed)
    projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
    projected = experts_linear(projected, self.down_proj, self.down_proj_bias if self.has_bias else None,
                                transposed=self.is_transposed)
    if self.has_post_expert_norm:
        projected = self.post_expert_norm(projected)
    routing = torch.zeros(num_tokens, self.num_experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    # Added, not written: a token routed twice to one expert (DeepSeek-V4's hash routing reads its slots from a
    # table) gets both weights, as transformers' loop over the slots gives it.
    routing = routing.scatter_add(1, top_k_index, top_k_weights)  # (T, E)
    return (projected * routing.transpose(0, 1)[..., None]).sum(dim=0).to(hidden_states.dtype)


def _experts_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The ``@use_experts_implementation`` classes in ``model`` (the decorator gives them ``has_gate`` and ``is_transposed``)."""
    return tuple({type(m) for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_transposed")})


@contextlib.contextmanager
def patch_dense_experts(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s experts layers with ``dense_experts_forward`` for the length of the block.

    Works around transformers 5.x's ``grouped_mm`` experts (``integrations/moe.py``), which export
    as the opaque ``transformers::grouped_mm_fallback`` op plus ``histc`` and ``sort``: no ONNX,
    OpenVINO or ExecuTorch lowering exists for them. The dense form exports to plain ``bmm``,
    ``scatter`` and ``sum`` with no data-dependent shape. The experts classes' ``forward`` is
    swapped and restored on exit; a no-op for a model without such layers. Delete when torch.export
    keeps a lowerable grouped matmul (or the runtimes translate ``grouped_mm_fallback``).

    Args:
        model: the model to export; only the experts classes it uses are patched.
    """
    with swap_attr_on_each(_experts_classes(model), "forward", dense_experts_forward):
        yield


def _dense_expert_modules(self: torch.nn.ModuleDict, hidden_states: torch.Tensor, expert_mask: torch.Tensor,
                          weights: torch.Tensor) -> torch.Tensor:
    """``sum_e expert_e(h) * sum_s [expert_mask[e, s, t] != 0] * weights[t, s]`` for ``hidden_states (T, H)``.

    ``expert_mask`` is ``(experts, slots, tokens)``, ``weights`` ``(tokens, slots)``: the loop of
    transformers' ``expert_hit`` forwards with every expert run on every token and weighted by zero
    where the token is not routed to it.
    """
    output = torch.zeros_like(hidden_states)
    for index in range(expert_mask.shape[0]):
        routed = (expert_mask[index].transpose(0, 1) != 0).to(weights.dtype)
        weight = (routed * weights).sum(dim=-1, keepdim=True)  # (T, 1)
        output = output + (self[f"expert_{index}"](hidden_states) * weight).to(hidden_states.dtype)
    return output


def dense_expert_modules_forward(self: torch.nn.ModuleDict, hidden_states: torch.Tensor,
                                 selected_experts: torch.Tensor, routing_weights: torch.Tensor) -> torch.Tensor:
    """Switch Transformers' experts output with static shapes: ``selected_experts`` is a ``(T, slots, E)`` one-hot mask."""
    return _dense_expert_modules(self, hidden_states, selected_experts.permute(2, 1, 0), routing_weights)


def dense_indexed_expert_modules_forward(self: torch.nn.ModuleDict, hidden_states: torch.Tensor,
                                         router_mask: torch.Tensor, router_probs: torch.Tensor) -> torch.Tensor:
    """NLLB-MoE's experts output with static shapes: its forward one-hots ``router_mask`` over the experts first.

    Its eval-mode token dropout scales every expert's output by ``1 - moe_token_dropout``; the sum is scaled
    once, which is the same up to rounding.
    """
    expert_mask = torch.nn.functional.one_hot(router_mask, num_classes=self.num_experts).permute(2, 1, 0)
    output = _dense_expert_modules(self, hidden_states, expert_mask, router_probs)
    dropout = getattr(self, "moe_token_dropout", 0.0)
    return output * (1 - dropout) if dropout > 0 and not self.training else output


def _expert_modules_forwards(model: torch.nn.Module) -> dict[type, Any]:
    """The ``nn.ModuleDict`` experts classes of ``model`` that loop over ``expert_hit``, each with its dense forward."""
    chosen = {}
    for owner in {type(m) for m in model.modules() if isinstance(m, torch.nn.ModuleDict)}:
        if source_contains(owner.forward, "expert_hit") and source_contains(owner.forward, 'self[f"expert_'):
            indexed = source_contains(owner.forward, "one_hot(router_mask")
            chosen[owner] = dense_indexed_expert_modules_forward if indexed else dense_expert_modules_forward
    return chosen


@contextlib.contextmanager
def patch_dense_expert_modules(model: torch.nn.Module) -> Iterator[None]:
    """Run experts kept as one module per expert (``self[f"expert_{i}"]``) densely for the length of the block.

    Model pattern: an ``nn.ModuleDict`` of experts whose forward loops over the experts a batch hits,
    ``expert_hit = torch.greater(expert_mask.sum(...), 0).nonzero()``, and gathers each one's tokens
    with ``torch.where`` (Switch Transformers, NLLB-MoE in transformers 5.22-5.24). Which experts run,
    and on how many tokens, depends on the input's values: torch.export stops ("Could not guard on
    data-dependent expression Eq(u0, 0)"). The dense form runs every expert on every token and weights
    each output by its routing weight (zero where not routed): the same numbers, static shapes. The
    classes are not ``@use_experts_implementation`` ones, so ``patch_dense_experts`` does not reach them.
    A no-op for a model without such a class. Delete when transformers moves them to that decorator.

    Args:
        model: the model to export; only the experts classes it uses are patched.
    """
    with contextlib.ExitStack() as stack:
        for owner, forward in _expert_modules_forwards(model).items():
            stack.enter_context(swap_attr(owner, "forward", forward))
        yield


def dense_identity_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """LongCat-Flash's experts for ``hidden_states (T, H)`` with every routed expert on every token, and its
    zero-computation experts (indices past the routed ones: the token itself) as one weighted identity.

    The same sums as transformers' ``expert_hit`` loop, each token's output weighted by its routing (zero
    where it is not routed).
    """
    num_tokens, hidden_dim = hidden_states.shape
    routed = self.num_routed_experts
    routing = torch.zeros(num_tokens, self.total_experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    routing = routing.scatter_add(1, top_k_index, top_k_weights)  # (T, experts)
    output = hidden_states * routing[:, routed:].sum(dim=-1, keepdim=True).to(hidden_states.dtype)
    if routed > 0 and self.gate_up_proj is not None:
        tiled = hidden_states.repeat(routed, 1).view(routed, num_tokens, hidden_dim)
        gate, up = experts_linear(tiled, self.gate_up_proj[:routed]).chunk(2, dim=-1)
        projected = experts_linear(self.act_fn(gate) * up, self.down_proj)
        output = output + (projected * routing[:, :routed].transpose(0, 1)[..., None]).sum(dim=0).to(hidden_states.dtype)
    return output


@contextlib.contextmanager
def patch_dense_identity_experts(model: torch.nn.Module) -> Iterator[None]:
    """Run LongCat-Flash-style experts (routed experts plus zero-computation identity experts, looped over
    ``expert_hit = ...nonzero()``) as ``dense_identity_experts_forward`` for the length of the block.

    Model pattern: ``LongcatFlashExperts`` (transformers 5.22-5.24), not ``@use_experts_implementation``: its loop
    over the experts hit branches on the routing's values ("Could not guard on data-dependent expression
    Eq(u0, 0)"). A no-op for other models. Delete when transformers routes its zero experts in the
    decorator's implementations.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = {type(m) for m in model.modules()
              if hasattr(m, "identity_expert") and hasattr(m, "num_routed_experts")
              and source_contains(vars(type(m)).get("forward"), "for expert_idx_tensor in expert_hit")}
    with swap_attr_on_each(owners, "forward", dense_identity_experts_forward):
        yield


def moe_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the mixture-of-experts patches for ``model``, bound to it (no-ops without experts layers).

    Example:
        >>> [p.func.__name__ for p in moe_patches(torch.nn.Linear(1, 1))]
        ['patch_dense_experts', 'patch_dense_expert_modules', 'patch_dense_identity_experts', 'patch_dense_parallel_experts']
    """
    return tuple(functools.partial(patch, model)
                 for patch in (patch_dense_experts, patch_dense_expert_modules, patch_dense_identity_experts,
                               patch_dense_parallel_experts))
