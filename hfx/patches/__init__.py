"""Reversible, explicitly chosen patches and the tuples of them each stage uses.

Nothing here is applied at import time: a stage enters the patches it is given
(``export(patches=...)``) for the length of its call. ``default_patches(model)``
is a pure function that returns the tuple ``export`` uses by default; read,
extend or replace it.
"""

from __future__ import annotations

import functools

import torch

from hfx._pytree import cache_classes, registered_caches
from hfx.patches._arch import (
    arch_patches,
    patch_axial_positions,
    patch_complex_rotary,
    patch_funnel_positions,
    patch_latent_attention_keys,
    patch_padding_mask_from_a_python_range,
    patch_padding_mask_kept,
    patch_position_interpolation,
    patch_real_fourier_mixing,
    patch_tensor_len,
)
from hfx.patches._cache import patch_sliding_window_cache
from hfx.patches._core import Patch, swap_attr, swap_item, with_patches
from hfx.patches._deepstack import patch_deepstack_gather, rows_added_at_mask
from hfx.patches._delta_rule import (
    delta_rule_patches,
    patch_gated_delta_rule_chunk_scan,
    prefix_chunk_gated_delta_rule,
    prefix_chunk_kimi_delta_attention,
)
from hfx.patches._global_attention import dense_global_attention_forward, patch_dense_global_attention
from hfx.patches._lightning import decayed_linear_attention, patch_lightning_attention
from hfx.patches._model import patch_attention_implementation, patch_eval_mode, preserve_module_state
from hfx.patches._moe import (
    dense_experts_forward,
    dense_identity_experts_forward,
    moe_patches,
    patch_dense_expert_modules,
    patch_dense_experts,
    patch_dense_identity_experts,
)
from hfx.patches._padded_images import patch_padded_image_batch
from hfx.patches._pixel_shuffle import patch_integer_pixel_shuffle
from hfx.patches._ssm import (
    DEFAULT_PREFIX_SCAN_LENGTH,
    patch_linear_attention_conv_state,
    patch_mamba2_chunk_scan,
    patch_mamba_selective_scan,
    patch_rglru_scan,
    prefix_rnn_scan,
    prefix_selective_scan,
    scanned_selective_scan,
    ssm_patches,
)
from hfx.patches._chunk_loops import one_chunk_range, patch_one_chunk_loops
from hfx.patches._conv_padding import extra_padding, patch_integer_conv_padding
from hfx.patches._eos_pooling import patch_eos_pooling_gather, rows_at_last_true
from hfx.patches._parallel_experts import patch_dense_parallel_experts
from hfx.patches._pooling import covering_average_pool, patch_covering_average_pool
from hfx.patches._step_positions import patch_symbolic_step_positions
from hfx.patches._token_shift import patch_functional_token_shift, rotated_decoder_inputs
from hfx.patches._unconditional_pads import (
    merge_padded,
    padded_to_length,
    padding_to_multiple,
    padded_to_patches,
    patch_unconditional_swin_pads,
    patch_upsampled_to_input_length,
    window_padded,
)
from hfx.patches._torch import patch_even_chunks, patch_module_to_in_forward, patch_sdpa_fully_masked_rows
from hfx.patches._vision import (
    patch_conv3d_patch_embedding,
    patch_packed_vision_attention,
    patch_per_image_feature_split,
    patch_window_permutation,
)
from hfx.patches._wkv import parallel_wkv, patch_rwkv_rescale_in_place, patch_wkv_scan

# Patches of torch itself that every export needs, whatever the model.
TORCH_PATCHES: tuple[Patch, ...] = (patch_sdpa_fully_masked_rows, patch_conv3d_patch_embedding, patch_even_chunks,
                                   patch_module_to_in_forward)
# Patches of transformers' cache layers that every export of a generating model needs.
CACHE_PATCHES: tuple[Patch, ...] = (patch_sliding_window_cache,)


def default_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the patches ``export`` enters for ``model``: caches as pytrees, model state kept, eval mode, exportable attention, packed vision attention, torch fixes, SSM and gated-delta-rule fixes, architecture fixes, exportable experts (MoE).

    Args:
        model: the user's model; the model patches are bound to it.

    Returns:
        A tuple of zero-argument context-manager factories, in the order they are entered.

    Example:
        >>> import torch
        >>> [getattr(p, "func", p).__name__ for p in default_patches(torch.nn.Linear(1, 1))]
        ['registered_caches', 'preserve_module_state', 'patch_eval_mode', 'patch_attention_implementation', 'patch_packed_vision_attention', 'patch_per_image_feature_split', 'patch_window_permutation', 'patch_sliding_window_cache', 'patch_sdpa_fully_masked_rows', 'patch_conv3d_patch_embedding', 'patch_even_chunks', 'patch_module_to_in_forward', 'patch_linear_attention_conv_state', 'patch_mamba_selective_scan', 'patch_mamba2_chunk_scan', 'patch_rglru_scan', 'patch_wkv_scan', 'patch_rwkv_rescale_in_place', 'patch_lightning_attention', 'patch_gated_delta_rule_chunk_scan', 'patch_position_interpolation', 'patch_latent_attention_keys', 'patch_complex_rotary', 'patch_real_fourier_mixing', 'patch_funnel_positions', 'patch_axial_positions', 'patch_padding_mask_from_a_python_range', 'patch_tensor_len', 'patch_padding_mask_kept', 'patch_dense_global_attention', 'patch_padded_image_batch', 'patch_integer_pixel_shuffle', 'patch_deepstack_gather', 'patch_functional_token_shift', 'patch_eos_pooling_gather', 'patch_covering_average_pool', 'patch_symbolic_step_positions', 'patch_one_chunk_loops', 'patch_integer_conv_padding', 'patch_upsampled_to_input_length', 'patch_unconditional_swin_pads', 'patch_dense_experts', 'patch_dense_expert_modules', 'patch_dense_identity_experts', 'patch_dense_parallel_experts']
    """
    bound = tuple(
        functools.partial(patch, model)
        for patch in (preserve_module_state, patch_eval_mode, patch_attention_implementation, patch_packed_vision_attention,
                      patch_per_image_feature_split, patch_window_permutation)
    )
    return (functools.partial(registered_caches, cache_classes(model)), *bound, *CACHE_PATCHES, *TORCH_PATCHES,
            *ssm_patches(model), *delta_rule_patches(model), *arch_patches(model), *moe_patches(model))


__all__ = [
    "CACHE_PATCHES",
    "DEFAULT_PREFIX_SCAN_LENGTH",
    "TORCH_PATCHES",
    "Patch",
    "arch_patches",
    "covering_average_pool",
    "default_patches",
    "delta_rule_patches",
    "dense_experts_forward",
    "decayed_linear_attention",
    "dense_global_attention_forward",
    "dense_identity_experts_forward",
    "extra_padding",
    "one_chunk_range",
    "patch_attention_implementation",
    "patch_axial_positions",
    "patch_padding_mask_from_a_python_range",
    "patch_padding_mask_kept",
    "patch_complex_rotary",
    "patch_conv3d_patch_embedding",
    "patch_covering_average_pool",
    "patch_deepstack_gather",
    "patch_dense_expert_modules",
    "patch_dense_experts",
    "patch_dense_global_attention",
    "patch_dense_identity_experts",
    "patch_dense_parallel_experts",
    "patch_eos_pooling_gather",
    "patch_eval_mode",
    "patch_even_chunks",
    "patch_functional_token_shift",
    "patch_funnel_positions",
    "patch_gated_delta_rule_chunk_scan",
    "patch_integer_conv_padding",
    "patch_integer_pixel_shuffle",
    "patch_latent_attention_keys",
    "patch_lightning_attention",
    "patch_linear_attention_conv_state",
    "patch_mamba2_chunk_scan",
    "patch_mamba_selective_scan",
    "patch_one_chunk_loops",
    "patch_module_to_in_forward",
    "patch_packed_vision_attention",
    "patch_padded_image_batch",
    "patch_per_image_feature_split",
    "patch_window_permutation",
    "patch_wkv_scan",
    "parallel_wkv",
    "patch_position_interpolation",
    "patch_real_fourier_mixing",
    "patch_rglru_scan",
    "patch_rwkv_rescale_in_place",
    "patch_sdpa_fully_masked_rows",
    "patch_sliding_window_cache",
    "patch_symbolic_step_positions",
    "patch_tensor_len",
    "patch_unconditional_swin_pads",
    "patch_upsampled_to_input_length",
    "merge_padded",
    "padded_to_length",
    "padded_to_patches",
    "window_padded",
    "padding_to_multiple",
    "prefix_chunk_gated_delta_rule",
    "prefix_chunk_kimi_delta_attention",
    "prefix_rnn_scan",
    "prefix_selective_scan",
    "moe_patches",
    "preserve_module_state",
    "registered_caches",
    "rotated_decoder_inputs",
    "rows_at_last_true",
    "rows_added_at_mask",
    "scanned_selective_scan",
    "ssm_patches",
    "swap_attr",
    "swap_item",
    "with_patches",
]
