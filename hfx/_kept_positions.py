"""``logits_to_keep``: the positions whose logits a multi-token decode graph returns, one input of the graph.

A decode graph that also prefills computes the lm_head of every new token;
``generate`` reads only the last one. ``decompose`` therefore makes transformers'
``logits_to_keep`` an input of the graph, as a tensor of positions, where the
model honours one: ``hfx.generate`` passes the last position (a prompt's lm_head
costs one row, not a fifth of a SmolLM-135M-shaped prompt's compute), transformers'
``generate`` through ``hfx.as_model`` passes what it asks for (a speculative
block: every candidate), and a caller who passes none gets every position, as
from the eager model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

KEPT_INPUT = "logits_to_keep"
#: Its dim: how many positions are kept (``hfx.infer_dynamic_shapes`` names it, bounded as ``sequence``).
KEPT_DIM = "kept"


def new_token_count(call: Mapping[str, Any]) -> int | None:
    """How many new tokens a decoder's call takes (``decoder_input_ids``, ``input_ids``, else ``inputs_embeds``);
    ``None`` without any of them."""
    for key, axis in (("decoder_input_ids", -1), ("input_ids", -1), ("inputs_embeds", -2)):
        if isinstance(call.get(key), torch.Tensor):
            return int(call[key].shape[axis])
    return None


def last_position(tokens: torch.Tensor) -> torch.Tensor:
    """``logits_to_keep`` for the last of ``tokens`` (``[batch, n]``): what a step's token is picked from."""
    return torch.tensor([tokens.shape[-1] - 1])


def kept_positions(value: Any, count: int) -> torch.Tensor:
    """transformers' ``logits_to_keep`` for ``count`` new tokens as the tensor of positions the graph takes: an
    int ``k`` keeps the last ``k`` (``0`` or ``None``: every one), a tensor names them.

    Example:
        >>> kept_positions(1, 5), kept_positions(0, 5), kept_positions(torch.tensor([0, 4]), 5)
        (tensor([4]), tensor([0, 1, 2, 3, 4]), tensor([0, 4]))
    """
    if isinstance(value, torch.Tensor):
        return value.to(torch.long).reshape(-1)
    keep = int(value or 0)
    return torch.arange(max(count - keep, 0) if keep else 0, count)


def with_every_position(keys: tuple[str, ...], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """``kwargs`` with ``logits_to_keep`` naming every new token when a graph taking ``keys`` is called without it."""
    if KEPT_INPUT not in keys or KEPT_INPUT in kwargs:
        return kwargs
    count = new_token_count(kwargs)
    return kwargs if count is None else {**kwargs, KEPT_INPUT: torch.arange(count)}
