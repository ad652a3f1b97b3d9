"""MiniMax's lightning attention (decayed linear attention) in its parallel form, for any sequence length.

``MiniMaxLightningAttention.forward`` (transformers 5.22-5.24) runs a prompt block by block
(``for i in range(num_blocks)``) and a step with a cache token by token (``for i in range(seq_len)``):
Python loops over the length, which torch.export unrolls at the capture's length and pins.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from hfx.patches._core import source_contains, swap_attr_on_each

_PATTERN = "attn_weights_inter = ratio * attn_weights_inter + current_attn_weights_inter"


def decayed_linear_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor,
                             slope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outputs, state after the last token)`` of the recurrence ``S_t = e^-slope S_(t-1) + k_t^T v_t``, ``o_t = q_t S_t``.

    ``query``, ``key``, ``value``: ``[batch, heads, tokens, dim]``; ``state``: ``[batch, heads, dim, dim]``
    before the first token; ``slope``: ``[heads, 1, 1]``. Computed at once: ``o_t = e^-slope(t+1) q_t S_0 +
    sum_(j<=t) e^-slope(t-j) (q_t . k_j) v_j`` (a ``tokens x tokens`` decay per head, as causal attention's scores).

    >>> q = k = v = torch.ones(1, 1, 3, 1)
    >>> out, state = decayed_linear_attention(q, k, v, torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1))
    >>> out.flatten().tolist(), state.flatten().tolist()
    ([1.0, 2.0, 3.0], [3.0])
    """
    tokens = query.shape[2]
    position = torch.arange(tokens, device=query.device, dtype=query.dtype)
    distance = position[:, None] - position[None, :]
    decay = torch.exp(-slope * distance.clamp(min=0)) * (distance >= 0)  # [heads, tokens, tokens]
    within = torch.matmul(torch.matmul(query, key.transpose(-1, -2)) * decay, value)
    before = torch.matmul(query * torch.exp(-slope * (position[:, None] + 1)), state)
    kept = torch.exp(-slope * tokens) * state
    added = torch.matmul((key * torch.exp(-slope * (tokens - 1 - position[:, None]))).transpose(-1, -2), value)
    return within + before, kept + added


def _lightning_forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any, attention_mask: Any,
                       past_key_values: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``MiniMaxLightningAttention.forward`` with its loops as ``decayed_linear_attention``; the rest as transformers'."""
    batch_size, seq_len, _ = hidden_states.shape
    mask_padding = sys.modules[type(self).__module__].apply_mask_to_padding_states
    qkv_states = mask_padding(self.act_fn(self.qkv_proj(hidden_states)), attention_mask)
    qkv_states = qkv_states.reshape(batch_size, seq_len, self.num_attention_heads, 3 * self.head_dim)
    query, key, value = (s.transpose(1, 2) for s in torch.split(qkv_states, self.head_dim, dim=3))
    cache = past_key_values if past_key_values is not None else kwargs.get("cache")  # "cache" from transformers 5.24
    state = cache.get_linear_cache(self.layer_idx) if cache is not None else None
    if state is None:
        state = value.new_zeros(batch_size, self.num_attention_heads, self.head_dim, self.head_dim)
    attn_output, state = decayed_linear_attention(query, key, value, state, self.slope_rate)
    attn_output = attn_output.transpose(1, 2).reshape(batch_size, seq_len, self.num_attention_heads * self.head_dim)
    attn_output = F.sigmoid(self.output_gate(hidden_states)) * self.norm(attn_output)
    attn_output = self.out_proj(attn_output)
    if cache is not None:
        cache.set_linear_cache(self.layer_idx, state)
    return attn_output, state


@contextlib.contextmanager
def patch_lightning_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run MiniMax-style lightning attention in its parallel form for the length of the block.

    Model pattern: decayed linear attention looped over the prompt's blocks and over a step's tokens
    (``MiniMaxLightningAttention``, transformers 5.22-5.24): the same recurrence as one masked product
    (``decayed_linear_attention``), so the sequence stays dynamic. A no-op for other models. Delete when
    transformers computes it without Python loops over the length.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = {type(m) for m in model.modules() if source_contains(vars(type(m)).get("forward"), _PATTERN)}
    with swap_attr_on_each(owners, "forward", _lightning_forward):
        yield
