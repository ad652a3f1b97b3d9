"""Qwen3-VL-style deepstack: visual features added at the placeholder rows, as a gather.

Qwen3-VL, Qwen3-VL-MoE, Qwen3-Omni-MoE and Cohere Compass add each deepstack level's visual
features to the hidden states of the visual tokens in their first decoder layers
(``_deepstack_process``, transformers 5.22-5.24): ``hidden_states[visual_pos_masks, :] + visual_embeds``.
A boolean index has a data-dependent row count that must equal the features' rows, so a language model
exported with the features as inputs comes out with its sequence and feature rows pinned to the capture's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr_on_each

_PATTERN = "hidden_states[visual_pos_masks, :] = local_this"


def rows_added_at_mask(hidden_states: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``hidden_states`` with ``rows`` added, in order, at the positions ``mask`` marks (row-major), as a gather.

    The ``i``-th marked position takes ``rows[i]``; every other position adds a zero row. No size depends on
    the mask's values: any mask and any row count give a static-rank graph (too few rows fail in the gather).

    >>> h = torch.zeros(1, 4, 2)
    >>> rows_added_at_mask(h, torch.tensor([[False, True, False, True]]), torch.tensor([[1., 1.], [2., 2.]]))[0]
    tensor([[0., 0.],
            [1., 1.],
            [0., 0.],
            [2., 2.]])
    """
    flat_mask = mask.to(hidden_states.device).reshape(-1)
    rows = rows.to(hidden_states.device, hidden_states.dtype)
    padded = torch.cat([rows, rows.new_zeros(1, rows.shape[-1])])  # the zero row unmarked positions read
    index = torch.where(flat_mask, flat_mask.long().cumsum(0) - 1, rows.shape[0])
    added = hidden_states.reshape(-1, hidden_states.shape[-1]) + padded[index]
    return added.reshape(hidden_states.shape)


def _deepstack_process(self: Any, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor,
                       visual_embeds: torch.Tensor) -> torch.Tensor:
    return rows_added_at_mask(hidden_states, visual_pos_masks, visual_embeds)


@contextlib.contextmanager
def patch_deepstack_gather(model: torch.nn.Module) -> Iterator[None]:
    """Run Qwen3-VL-style ``_deepstack_process`` as a gather (``rows_added_at_mask``) for the length of the block.

    Model pattern: ``hidden_states[visual_pos_masks, :] = hidden_states[visual_pos_masks, :] + visual_embeds``
    (Qwen3-VL, Qwen3-VL-MoE, Qwen3-Omni-MoE, Cohere Compass; transformers 5.22-5.24). The same sums, with
    the sequence and the visual rows free; a no-op for other models. Delete when transformers adds the
    features without a boolean index.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = {type(m) for m in model.modules() if source_contains(getattr(type(m), "_deepstack_process", None), _PATTERN)}
    with swap_attr_on_each(owners, "_deepstack_process", _deepstack_process):
        yield
