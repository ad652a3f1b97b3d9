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
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hfx._records import IoSpec

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


def io_without_positions(io: IoSpec, /) -> IoSpec:
    """``io`` without the ``logits_to_keep`` input (nor its dim's bounds), its outputs' ``kept`` positions those of
    ``input_ids``: the contract of a graph whose positions are computed inside; ``io`` when it takes none."""
    import attrs

    from hfx._contract import in_spec_without  # imported here: hfx._contract fills the input with this module

    if KEPT_INPUT not in io.input_names:
        return io
    ids = next(spec for spec in io.inputs if spec.name == "input_ids")
    outputs = [attrs.evolve(spec, shape=tuple(ids.shape[1] if dim == KEPT_DIM else dim for dim in spec.shape))
               for spec in io.outputs]
    return attrs.evolve(io, inputs=[spec for spec in io.inputs if spec.name != KEPT_INPUT], outputs=outputs,
                        in_spec=in_spec_without(io, lambda key: key == KEPT_INPUT),
                        bounds={dim: bound for dim, bound in io.bounds.items() if dim != KEPT_DIM},
                        declared_bounds={dim: b for dim, b in io.declared_bounds.items() if dim != KEPT_DIM})
