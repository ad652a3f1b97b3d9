"""Reversible, explicitly chosen patches and the tuples of them each stage uses.

Nothing here is applied at import time: a stage enters the patches it is given
(``export(patches=...)``) for the length of its call. ``default_patches(model)``
is a pure function that returns the tuple ``export`` uses by default; read,
extend or replace it.
"""

from __future__ import annotations

import functools

import torch

from hfx._caches import cache_classes, registered_caches
from hfx.patches._core import Patch, swap_attr, swap_item, with_patches
from hfx.patches._model import patch_attention_implementation, patch_eval_mode, preserve_module_state
from hfx.patches._ssm import (
    patch_linear_attention_conv_state,
    patch_mamba2_chunk_scan,
    patch_mamba_selective_scan,
    ssm_patches,
)
from hfx.patches._torch import patch_sdpa_fully_masked_rows

# Patches of torch itself that every export needs, whatever the model.
TORCH_PATCHES: tuple[Patch, ...] = (patch_sdpa_fully_masked_rows,)


def default_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the patches ``export`` enters for ``model``: caches as pytrees, model state kept, eval mode, exportable attention, torch fixes, SSM fixes.

    Args:
        model: the user's model; the model patches are bound to it.

    Returns:
        A tuple of zero-argument context-manager factories, in the order they are entered.

    Example:
        >>> import torch
        >>> [getattr(p, "func", p).__name__ for p in default_patches(torch.nn.Linear(1, 1))]
        ['registered_caches', 'preserve_module_state', 'patch_eval_mode', 'patch_attention_implementation', 'patch_sdpa_fully_masked_rows', 'patch_linear_attention_conv_state', 'patch_mamba_selective_scan', 'patch_mamba2_chunk_scan']
    """
    bound = tuple(
        functools.partial(patch, model)
        for patch in (preserve_module_state, patch_eval_mode, patch_attention_implementation)
    )
    return (functools.partial(registered_caches, cache_classes(model)), *bound, *TORCH_PATCHES, *ssm_patches(model))


__all__ = [
    "TORCH_PATCHES",
    "Patch",
    "default_patches",
    "patch_attention_implementation",
    "patch_eval_mode",
    "patch_linear_attention_conv_state",
    "patch_mamba2_chunk_scan",
    "patch_mamba_selective_scan",
    "patch_sdpa_fully_masked_rows",
    "preserve_module_state",
    "registered_caches",
    "ssm_patches",
    "swap_attr",
    "swap_item",
    "with_patches",
]
