"""JetMoE-style parallel experts (ScatterMoE layout) with static shapes.

JetMoE's feed-forward experts (``JetMoeMoE``) and its mixture of attention (``JetMoeMoA``,
transformers 5.22-5.24) route each token to ``top_k`` experts by sorting the (token, slot) pairs,
split the sorted rows by ``expert_size.tolist()`` and run one ``F.linear`` per expert: data-dependent
sizes torch.export keeps as unbacked symbols. ExecuTorch plans memory at each size's upper bound and
found none ("Cannot evaluate a finite upper bound for symbolic expression u208"), and has no ``sort``
kernel either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr_on_each
from hfx.patches._expert_matmuls import experts_linear

_PATTERN = "inputs.split(expert_size"


def _routing(router: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits, top_k experts, their gates)`` of JetMoE's top-k gating, without sorting the pairs."""
    logits = router.layer(tokens).float()
    top_logits, experts = logits.topk(router.top_k, dim=1)
    return logits, experts, torch.softmax(top_logits, dim=1).type_as(tokens)


def _every_expert(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(E, T, out)``: each expert's ``F.linear`` (``weight`` is ``(E, out, in)``) on every token of ``(T, in)``."""
    return experts_linear(tokens.expand(weight.shape[0], -1, -1), weight)


def _routed(experts: torch.Tensor, gates: torch.Tensor, count: int) -> torch.Tensor:
    """``(T, E)``: each token's gate for each expert, 0 where the token is not routed to it."""
    return torch.zeros(*experts.shape[:-1], count, dtype=gates.dtype, device=gates.device).scatter_add(
        -1, experts, gates)


def dense_parallel_moe_forward(self: Any, layer_input: torch.Tensor) -> torch.Tensor:
    """``JetMoeMoE.forward`` with every expert run on every token, weighted by its gate (0 where not routed)."""
    batch, length, hidden = layer_input.shape
    tokens = layer_input.reshape(-1, hidden)
    _, experts, gates = _routing(self.router, tokens)
    projected = _every_expert(tokens, self.input_linear.weight)
    first, second = projected.chunk(2, dim=-1)
    outputs = experts_linear(self.activation(first) * second, self.output_linear.weight)  # (E, T, hidden)
    routing = _routed(experts, gates, self.output_linear.num_experts).transpose(0, 1)  # (E, T)
    return (outputs * routing[..., None]).sum(dim=0).view(batch, length, hidden) + self.bias


def dense_attention_experts_map(self: Any, layer_input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``JetMoeMoA.map``: each token's query projection by each of its ``top_k`` experts, ``(B, L, k, H)``."""
    batch, length, hidden = layer_input.shape
    tokens = layer_input.reshape(-1, hidden)
    logits, experts, gates = _routing(self.router, tokens)
    every = _every_expert(tokens, self.input_linear.weight).transpose(0, 1)  # (T, E, H)
    index = experts[..., None].expand(-1, -1, every.shape[-1])
    return every.gather(1, index).view(batch, length, self.top_k, -1), logits, (experts, gates)


def dense_attention_experts_reduce(self: Any, layer_input: torch.Tensor, topo_info: Any) -> torch.Tensor:
    """``JetMoeMoA.reduce``: each slot's output projection by its expert, weighted by its gate and summed."""
    batch, length, slots, hidden = layer_input.shape
    experts, gates = topo_info
    rows = layer_input.reshape(-1, slots, hidden)  # (T, k, H)
    weights = torch.zeros(*experts.shape, self.num_experts, dtype=rows.dtype, device=rows.device).scatter(
        -1, experts[..., None], gates[..., None].to(rows.dtype))  # (T, k, E)
    per_expert = torch.einsum("tke,tkh->eth", weights, rows)  # each expert's gated sum of its slots' rows
    output = experts_linear(per_expert, self.output_linear.weight).sum(dim=0)
    return output.view(batch, length, self.input_size) + self.bias


def _owners(model: torch.nn.Module, method: str) -> set[type]:
    """The classes of ``model``'s modules whose ``method`` runs ScatterMoE-style parallel experts."""
    return {type(m) for m in model.modules()
            if hasattr(m, "router") and hasattr(m, "input_linear") and callable(vars(type(m)).get(method))
            and source_contains(vars(type(m.input_linear)).get("forward"), _PATTERN)}


@contextlib.contextmanager
def patch_dense_parallel_experts(model: torch.nn.Module) -> Iterator[None]:
    """Run JetMoE-style parallel experts densely (every expert on every token) for the length of the block.

    Model pattern: ``ParallelExperts`` layers fed rows sorted by expert and split by
    ``expert_size.tolist()`` (JetMoE's MoE and mixture of attention; transformers 5.22-5.24). The same
    outputs, within float32 rounding (the attention experts gate their inputs before the output
    projection, a linear map), with static shapes and no ``sort``, at ``num_experts / top_k`` times the
    routed arithmetic. The router's logits are computed as JetMoE's gating does but its module is not
    called, so ``output_router_logits`` does not record the feed-forward router's. A no-op for other
    models. Delete when transformers routes these experts without data-dependent splits.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    with swap_attr_on_each(_owners(model, "forward") - _owners(model, "map"), "forward", dense_parallel_moe_forward), \
            swap_attr_on_each(_owners(model, "map"), "map", dense_attention_experts_map), \
            swap_attr_on_each(_owners(model, "reduce"), "reduce", dense_attention_experts_reduce):
        yield
