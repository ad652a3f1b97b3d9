"""ProphetNet-style step positions computed on sizes, without ``int()``.

ProphetNet (transformers 5.22-5.24) gives a decode step the position ``padding_idx + past + 1`` as
``torch.ones((1, 1)) * int(self.padding_idx + num_input_ids)``: ``int()`` of a symbolic size
specialises it, and torch.export pins the past length at the capture's ("axis 2 of input
'past_key_values.layers.0.keys' is static 7").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr

_PATTERN = "int(self.padding_idx + num_input_ids)"


def _symbolic_step_positions(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a learned positional embedding's forward) with a cached step's position kept symbolic."""

    @functools.wraps(original)
    def forward(self: torch.nn.Module, inputs_shape: Any, device: Any, attention_mask: Any = None, cache: Any = None,
                position_ids: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # the cache is the fourth argument: ``past_key_values`` up to transformers 5.23, ``cache`` from 5.24
        cache = kwargs.pop("past_key_values", cache)
        if position_ids is None and cache is not None and cache.get_seq_length() != 0:
            position = self.padding_idx + inputs_shape[1] + cache.get_seq_length()
            position_ids = torch.ones((1, 1), dtype=torch.long, device=device) * position
            return self._forward(position_ids), position_ids
        return original(self, inputs_shape, device, attention_mask, cache, position_ids, **kwargs)

    return forward


@contextlib.contextmanager
def patch_symbolic_step_positions(model: torch.nn.Module) -> Iterator[None]:
    """Compute ProphetNet-style decode-step positions on sizes (no ``int()``) for the length of the block.

    Model pattern: a positional embedding whose forward builds a cached step's position with
    ``int(self.padding_idx + num_input_ids)`` (ProphetNet, XLM-ProphetNet's classes; transformers
    5.22-5.24). The same position, ``padding_idx`` plus the past and the new tokens; other calls
    run the original. A no-op for other models. Delete when transformers drops the ``int()``.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = {type(m) for m in model.modules() if source_contains(vars(type(m)).get("forward"), _PATTERN)}
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(swap_attr(owner, "forward", _symbolic_step_positions(vars(owner)["forward"])))
        yield
