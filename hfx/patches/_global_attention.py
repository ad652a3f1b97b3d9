"""Longformer-style local + global attention with shapes that do not depend on which tokens are global.

Longformer and LED's encoder attend within a sliding window and, for the tokens the mask marks
global, over the whole sequence. Which tokens are global is a value of the inputs: the encoder
asks ``is_index_global_attn.flatten().any().item()`` and the attention gathers the global tokens
with ``nonzero``, so the program's shapes would follow the count; the window's chunking sizes its
views with ``torch.div`` of the sequence length, a tensor, which export reads back as an unknown
value. torch.export stops at either ("Could not guard on data-dependent expression Eq(u1, 1)").
LongformerForSequenceClassification always makes its first token global.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import torch

from hfx.patches._core import swap_attr

_GLOBAL_ATTENTION_METHODS = ("_sliding_chunks_query_key_matmul", "_compute_global_attn_output_from_hidden")


def _heads(self: torch.nn.Module, vectors: torch.Tensor) -> torch.Tensor:
    """``(batch, seq, embed)`` projections as ``(batch, seq, heads, head_dim)``."""
    return vectors.view(*vectors.shape[:2], self.num_heads, self.head_dim)


def _global_query_output(self: torch.nn.Module, hidden_states: torch.Tensor,
                         is_index_masked: torch.Tensor) -> torch.Tensor:
    """Every token's output as a global query (its global projections over every unmasked key): ``(batch, seq, heads, head_dim)``."""
    query = _heads(self, self.query_global(hidden_states) / math.sqrt(self.head_dim))
    key, value = _heads(self, self.key_global(hidden_states)), _heads(self, self.value_global(hidden_states))
    scores = torch.einsum("bqhd,bkhd->bhqk", query, key)
    scores = scores.masked_fill(is_index_masked[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).type_as(scores)
    probs = torch.nn.functional.dropout(probs, p=self.dropout, training=self.training)
    return torch.einsum("bhqk,bkhd->bqhd", probs, value)


def dense_global_attention_forward(self: torch.nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                                   is_index_masked: torch.Tensor, is_index_global_attn: torch.Tensor) -> tuple:
    """Longformer's self-attention output for ``hidden_states (batch, seq, embed)`` as one masked full attention.

    A query attends to the keys within its window (``|i - j| <= one_sided_attn_window_size``) that are
    neither padding nor global (``attention_mask == 0``), and to every global key: the keys transformers'
    window and gathered global columns give it, every other score set to the dtype's minimum, so the
    softmax weighs them zero. A global token's output is its global projections' attention over every
    unmasked key, picked with ``where``. The numbers are transformers'; the shapes never depend on how
    many tokens are global; the cost is a full attention's (``seq x seq`` scores), not the window's.
    """
    query = _heads(self, self.query(hidden_states) / math.sqrt(self.head_dim))
    key, value = _heads(self, self.key(hidden_states)), _heads(self, self.value(hidden_states))
    positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)
    in_window = (positions[None, :] - positions[:, None]).abs() <= self.one_sided_attn_window_size  # (q, k)
    attended = (in_window[None] & (attention_mask == 0)[:, None, :]) | is_index_global_attn[:, None, :]  # (b, q, k)
    scores = torch.einsum("bqhd,bkhd->bhqk", query, key)
    scores = scores.masked_fill(~attended[:, None], torch.finfo(scores.dtype).min)
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
    probs = probs.masked_fill(is_index_masked[:, None, :, None], 0.0).type_as(scores)
    probs = torch.nn.functional.dropout(probs, p=self.dropout, training=self.training)
    output = torch.einsum("bhqk,bkhd->bqhd", probs, value)
    output = torch.where(is_index_global_attn[:, :, None, None],
                         _global_query_output(self, hidden_states, is_index_masked), output)
    return (output.reshape(*output.shape[:2], -1),)


def _dense_when_traced(sparse: Callable[..., tuple]) -> Callable[..., tuple]:
    """``sparse`` (transformers' forward) where ``is_global_attn`` is a Python bool (eager) or attentions are asked for, else the dense form."""

    @functools.wraps(sparse)
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                is_index_masked: torch.Tensor | None = None, is_index_global_attn: torch.Tensor | None = None,
                is_global_attn: object = None, output_attentions: bool = False) -> tuple:
        if isinstance(is_global_attn, bool) or output_attentions:
            return sparse(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn, is_global_attn,
                          output_attentions)
        return dense_global_attention_forward(self, hidden_states, attention_mask, is_index_masked,
                                              is_index_global_attn)

    return forward


def _global_attention_classes(model: torch.nn.Module) -> set[type]:
    """The classes of ``model`` with Longformer's local + global attention (its window and global-output methods)."""
    return {type(m) for m in model.modules()
            if all(callable(getattr(m, name, None)) for name in _GLOBAL_ATTENTION_METHODS)
            and all(hasattr(m, name) for name in ("query_global", "key_global", "value_global"))}


@contextlib.contextmanager
def patch_dense_global_attention(model: torch.nn.Module) -> Iterator[None]:
    """Trace Longformer-style attention in a form whose shapes do not depend on which tokens are global.

    Model pattern: sliding-window attention plus global tokens read from the mask's values
    (Longformer, LED's encoder in transformers 5.22-5.24): ``if is_global_attn:`` on an ``.item()`` and
    ``nonzero`` gathers. Under export the attention runs ``dense_global_attention_forward``, which gives
    transformers' numbers for any set of global tokens, including none (the plain window) and
    sequence classification's first token. Eager calls keep transformers' forward. A no-op for a model
    without such attention. Delete when transformers computes global attention without a data-dependent
    branch.

    Args:
        model: the model to export; only its attention classes are patched.
    """
    with contextlib.ExitStack() as stack:
        for owner in _global_attention_classes(model):
            stack.enter_context(swap_attr(owner, "forward", _dense_when_traced(owner.forward)))
        yield
