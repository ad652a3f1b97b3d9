"""The patch contract, checked once over every patch in hfx (STYLE.md "Tests").

Each row of ``ROWS`` names a patch factory, what it is bound to (a tiny zoo model where the patch
takes one) and the slots it swaps: ``(owner, name)`` pairs read with ``vars(owner)`` (or
``owner.get`` for a mapping) and compared by identity. Every row is checked to be active inside
the block, restored exactly after it, restored after an exception, unwound when a later patch
fails to apply, and, for the rows marked ``adds``, to remove an attribute that did not exist
before. ``test_every_patch_has_a_row`` fails for a patch in hfx that the table does not cover.
The per-patch test files keep what each patch does (its numbers, its predicate).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import io
import logging
import pathlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from transformers import cache_utils
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.deepseek_v2 import modeling_deepseek_v2
from transformers.models.dinov2 import modeling_dinov2
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2
from transformers.models.mixtral import modeling_mixtral
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen3_next import modeling_qwen3_next
from transformers.models.recurrent_gemma import modeling_recurrent_gemma

import hfx
from hfx import PatchError, patches, zoo
from hfx._capture.internal_cache import patch_custom_attention
from hfx._pytree import cache_classes, registered_caches
from hfx.backends import PTE_PATCHES, _common
from hfx.backends import _executorch_fixes as _pte_fixes
from hfx.backends import _lowering_speed
from hfx.patches import _core

_MISSING = object()
Slot = tuple[Any, Any]
Models = Callable[[str], torch.nn.Module]


@attrs.frozen(kw_only=True)
class Row:
    """One patch factory, what it is bound to, and the slots it swaps."""

    patch: Callable[..., Any]  # the factory, as hfx defines it (the coverage test compares identities)
    args: Callable[[Models], tuple[Any, ...]] = lambda models: ()  # bound with functools.partial(patch, *args)
    slots: Callable[..., Iterable[Slot]]  # called with the args
    adds: bool = False  # an attribute missing before is set inside and removed after
    writes: Callable[..., Any] | None = None  # a patch that undoes writes instead of swapping: the writes, inside it
    needs: str | None = None  # the package the owners live in

    @property
    def id(self) -> str:
        return self.patch.__name__


def _shared(name: str) -> Callable[[Models], tuple[Any, ...]]:
    """``args`` of a row bound to the session's zoo model ``name``."""
    return lambda models: (models(name),)


def _fresh(name: str, prepare: Callable[[torch.nn.Module], Any] = lambda model: None) -> Callable[[Models], tuple]:
    """``args`` of a row bound to a zoo model ``name`` of its own, changed by ``prepare`` (not the session's)."""

    def build(models: Models) -> tuple[Any, ...]:
        model = zoo.build(name)
        prepare(model)
        return (model,)

    return build


def _owner(module: str, attribute: str | None = None) -> Any:
    """The module named ``module`` (imported now), or its attribute ``attribute``."""
    found = importlib.import_module(module)
    return found if attribute is None else getattr(found, attribute)


def _flex_attention(model: torch.nn.Module) -> None:
    model.config._attn_implementation_internal = "flex_attention"  # noqa: SLF001 - what the user's config holds


@contextlib.contextmanager
def _tracing_writes(model: torch.nn.Module) -> Iterator[None]:
    """What tracing leaves on a model: a cached attribute, a config field, a parameter swapped for another."""
    model.cached = object()
    model.config.cached = object()
    model.lm_head.weight = torch.nn.Parameter(torch.zeros(1))
    yield


def _preserved_slots(model: torch.nn.Module) -> list[Slot]:
    return [(model, "cached"), (model.config, "cached"), (model.lm_head._parameters, "weight")]  # noqa: SLF001


def _registry_slots(classes: tuple[type, ...]) -> list[Slot]:
    """Every entry ``registered_caches`` makes in torch's pytree tables for ``classes``."""
    found = []
    for cls in classes:
        found += [(pytree.SUPPORTED_NODES, cls), (pytree.SUPPORTED_SERIALIZED_TYPES, cls),
                  (pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, f"{cls.__module__}.{cls.__qualname__}")]
    return found


def _sliding_window_slots() -> list[Slot]:
    return [(cache_utils.DynamicSlidingWindowLayer, name) for name in ("update", "get_mask_sizes", "get_seq_length")]


def _xnnpack_slots() -> dict[Callable[..., Any], list[Slot]]:
    configs = "executorch.backends.xnnpack.partition.config"
    return {
        _pte_fixes.patch_xnnpack_unsqueeze_dynamic_dims:
            [(_owner(f"{configs}.generic_node_configs", "UnsqueezeCopyConfig"), "check_constraints")],
        _pte_fixes.patch_xnnpack_conv1d_dynamic_dims:
            [(_owner(f"{configs}.gemm_configs", "ConvolutionConfig"), "check_constraints"),
             (_owner(f"{configs}.node_configs", "BatchNormConfig"), "check_constraints")],
        _pte_fixes.patch_xnnpack_tanh_gelu:
            [(_owner(f"{configs}.generic_node_configs", "GeluConfig"), "check_constraints")],
        _pte_fixes.patch_xnnpack_max_dim:
            [(_owner(f"{configs}.node_configs", "MaxDimConfig"), "check_constraints")],
        _pte_fixes.patch_xnnpack_prelu_4d:
            [(_owner(f"{configs}.node_configs", "PreluConfig"), "check_constraints")],
        _pte_fixes.patch_xnnpack_acyclic_partitions:
            [(_owner("executorch.exir.backend.canonical_partitioners.config_partitioner",
                     "ConfigerationBasedPartitioner"), "generate_partitions")],
        _pte_fixes.patch_xnnpack_reshape_one_valued_sizes:
            [(_xnnpack_visitor(target), "define_node")
             for target in ("aten.squeeze_copy.dim", "aten.unsqueeze_copy.default")],
    }


def _xnnpack_visitor(target: str) -> type:
    """XNNPACK's serialiser class for ``target`` (its module's name is None: the decorator registers and drops it)."""
    _owner("executorch.backends.xnnpack.operators")  # importing it registers every visitor
    return _owner("executorch.backends.xnnpack.operators.node_visitor", "_node_visitor_dict")[target]


def _local_class() -> type:
    """A class of this test's own whose staticmethod and method override inherited ones (the primitives' rows)."""

    class Base:
        @staticmethod
        def static() -> str:
            return "inherited"

        def method(self) -> str:
            return "inherited"

    class Owner(Base):
        @staticmethod
        def static() -> str:
            return "static"

        def method(self) -> str:
            return "method"

    return Owner


def _patched(self: Any) -> str:
    return "patched"


ROWS = (
    # The primitives, each bound to owners of the test's own.
    Row(patch=_core.swap_attr, args=lambda models: (_local_class(), "static", staticmethod(_patched)),
        slots=lambda owner, name, value: [(owner, name)], adds=True),
    Row(patch=_core.swap_attr_on_each, args=lambda models: ((_local_class(), _local_class()), "method", _patched),
        slots=lambda owners, name, value: [(owner, name) for owner in owners], adds=True),
    Row(patch=_core.swap_item, args=lambda models: ({"key": "value"}, "key", "patched"),
        slots=lambda table, key, value: [(table, key)], adds=True),
    Row(patch=_core.with_patches,
        args=lambda models: (functools.partial(_core.swap_attr, _local_class(), "method", _patched),
                             functools.partial(_core.swap_item, {"key": "value"}, "key", "patched")),
        slots=lambda *bound: [tuple(patch.args[:2]) for patch in bound], adds=True),
    # hfx.patches: default_patches(model), TORCH_PATCHES, CACHE_PATCHES, ssm_patches, arch_patches, moe_patches.
    Row(patch=registered_caches, args=lambda models: (cache_classes(models("llama")),), slots=_registry_slots,
        adds=True),
    Row(patch=patches.preserve_module_state, args=_fresh("llama"), slots=_preserved_slots,
        writes=_tracing_writes, adds=True),
    Row(patch=patches.patch_eval_mode, args=_fresh("llama", lambda model: model.train()),
        slots=lambda model: [(module, "training") for module in model.modules()]),
    Row(patch=patches.patch_attention_implementation, args=_fresh("llama", _flex_attention),
        slots=lambda model: [(model.config, "_attn_implementation_internal")]),
    Row(patch=patches.patch_packed_vision_attention, args=_shared("qwen2_vl"),
        slots=lambda model: [(modeling_qwen2_vl, "is_flash_attention_requested"),
                             (modeling_qwen2_vl, "ALL_ATTENTION_FUNCTIONS")]),
    Row(patch=patches.patch_per_image_feature_split, args=_shared("qwen2_vl"),
        slots=lambda model: [(modeling_qwen2_vl.Qwen2VLModel, "get_image_features"),
                             (modeling_qwen2_vl.Qwen2VLModel, "get_video_features")]),
    Row(patch=patches.patch_window_permutation, args=_shared("qwen2_5_vl"),
        slots=lambda model: [(modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel,
                              "permute_input_for_window_attn"), (modeling_qwen2_5_vl, "torch")]),
    Row(patch=patches.patch_sliding_window_cache, slots=_sliding_window_slots, adds=True),
    Row(patch=patches.patch_sdpa_fully_masked_rows, slots=lambda: [(F, "scaled_dot_product_attention")]),
    Row(patch=patches.patch_conv3d_patch_embedding, slots=lambda: [(torch.nn.Conv3d, "forward")], adds=True),
    Row(patch=patches.patch_even_chunks, slots=lambda: [(torch.Tensor, "chunk"), (torch, "chunk")]),
    Row(patch=patches.patch_module_to_in_forward, slots=lambda: [(torch.nn.Module, "to")]),
    Row(patch=patches.patch_linear_attention_conv_state,
        slots=lambda: [(cache_utils.LinearAttentionLayer, "update_conv_state")]),
    Row(patch=patches.patch_mamba_selective_scan, args=_shared("mamba"),
        slots=lambda model: [(modeling_mamba, "mamba_selective_scan")]),
    Row(patch=patches.patch_mamba2_chunk_scan, args=_shared("mamba2"),
        slots=lambda model: [(modeling_mamba2, "mamba2_chunk_scan")]),
    Row(patch=patches.patch_gated_delta_rule_chunk_scan, args=_shared("causal-lm:qwen3_next"),
        slots=lambda model: [(modeling_qwen3_next, "torch_chunk_gated_delta_rule")]),
    Row(patch=patches.patch_wkv_scan, args=_shared("causal-lm:rwkv"),
        slots=lambda model: [(sys.modules["transformers.models.rwkv.modeling_rwkv"], "rwkv_linear_attention")]),
    Row(patch=patches.patch_lightning_attention, args=_shared("causal-lm:minimax"),
        slots=lambda model: [(_owner("transformers.models.minimax.modeling_minimax", "MiniMaxLightningAttention"),
                              "forward")]),
    Row(patch=patches.patch_rwkv_rescale_in_place, args=_shared("causal-lm:rwkv"),
        slots=lambda model: [(model.config, "rescale_every")]),
    Row(patch=patches.patch_rglru_scan, args=_shared("causal-lm:recurrent_gemma"),
        slots=lambda model: [(modeling_recurrent_gemma.RecurrentGemmaRglru, "_rnn_scan")]),
    Row(patch=patches.patch_latent_attention_keys, args=_shared("causal-lm:deepseek_v2"),
        slots=lambda model: [(modeling_deepseek_v2.DeepseekV2Attention, "expand_kv")]),
    Row(patch=patches.patch_complex_rotary, args=_shared("causal-lm:deepseek_v2"),
        slots=lambda model: [(modeling_deepseek_v2.DeepseekV2RotaryEmbedding, "forward"),
                             (modeling_deepseek_v2, "apply_rotary_emb")]),
    Row(patch=patches.patch_real_fourier_mixing, args=_shared("masked-lm:fnet"),
        slots=lambda model: [(_owner("transformers.models.fnet.modeling_fnet", "FNetBasicFourierTransform"), "forward")]),
    Row(patch=patches.patch_funnel_positions, args=_shared("masked-lm:funnel"),
        slots=lambda model: [(_owner("transformers.models.funnel.modeling_funnel", "FunnelAttentionStructure"),
                              "get_position_embeds"),
                             (_owner("transformers.models.funnel.modeling_funnel"), "_relative_shift_gather")]),
    Row(patch=patches.patch_axial_positions, args=_shared("masked-lm:reformer"),
        slots=lambda model: [(_owner("transformers.models.reformer.modeling_reformer", "AxialPositionEmbeddings"),
                              "forward")]),
    Row(patch=patches.patch_padding_mask_from_a_python_range, args=_shared("causal-lm:cpmant"),
        slots=lambda model: [(_owner("transformers.models.cpmant.modeling_cpmant", "CpmAntModel"),
                              "_prepare_attention_mask")]),
    Row(patch=patches.patch_padding_mask_kept, args=_shared("seq2seq-lm:fsmt"),
        slots=lambda model: [(sys.modules["transformers.models.fsmt.modeling_fsmt"], "make_padding_mask")]),
    Row(patch=patches.patch_dense_global_attention, args=_shared("masked-lm:longformer"),
        slots=lambda model: [(_owner("transformers.models.longformer.modeling_longformer", "LongformerSelfAttention"),
                              "forward")]),
    Row(patch=patches.patch_padded_image_batch, args=_shared("image-text-to-text:mistral3"),
        slots=lambda model: [(_owner("transformers.models.pixtral.modeling_pixtral", "PixtralVisionModel"), "forward"),
                             (_owner("transformers.models.mistral3.modeling_mistral3", "Mistral3PatchMerger"), "forward"),
                             (_owner("transformers.models.mistral3.modeling_mistral3", "Mistral3Model"),
                              "get_placeholder_mask")]),
    Row(patch=patches.patch_integer_pixel_shuffle, args=_shared("image-text-to-text:internvl"),
        slots=lambda model: [(_owner("transformers.models.internvl.modeling_internvl", "InternVLModel"),
                              "pixel_shuffle")]),
    Row(patch=patches.patch_deepstack_gather, args=_shared("image-text-to-text:qwen3_vl"),
        slots=lambda model: [(_owner("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLTextModel"),
                              "_deepstack_process")]),
    Row(patch=patches.patch_functional_token_shift, args=_shared("sequence-classification:mbart"),
        slots=lambda model: [(vars(sys.modules["transformers.models.mbart.modeling_mbart"]), "shift_tokens_right")]),
    Row(patch=patches.patch_eos_pooling_gather, args=_shared("sequence-classification:bart"),
        slots=lambda model: [(_owner("transformers.models.bart.modeling_bart", "BartForSequenceClassification"),
                              "forward")]),
    Row(patch=patches.patch_covering_average_pool, args=_shared("image-classification:efficientnet"),
        slots=lambda model: [(model.efficientnet.pooler, "forward")], adds=True),
    Row(patch=patches.patch_symbolic_step_positions, args=_shared("causal-lm:prophetnet"),
        slots=lambda model: [(_owner("transformers.models.prophetnet.modeling_prophetnet",
                                     "ProphetNetPositionalEmbeddings"), "forward")]),
    Row(patch=patches.patch_one_chunk_loops, args=_shared("feature-extraction:nemotron3_5_transcribe_audio"),
        slots=lambda model: [(vars(sys.modules[f"transformers.models.{name}.modeling_{name}"]), "range")
                             for name in ("nemotron3_5_transcribe", "nemotron3_diarization")], adds=True),
    Row(patch=patches.patch_integer_conv_padding, args=_shared("feature-extraction:mimi_encoder"),
        slots=lambda model: [(_owner("transformers.models.mimi.modeling_mimi", "MimiConv1d"),
                              "_get_extra_padding_for_conv1d")]),
    Row(patch=patches.patch_upsampled_to_input_length, args=_shared("ctc:sew"),
        slots=lambda model: [(_owner("transformers.models.sew.modeling_sew", "SEWEncoder"), "forward")]),
    Row(patch=patches.patch_unconditional_swin_pads, args=_shared("image-classification:swin"),
        slots=lambda model: [(_owner("transformers.models.swin.modeling_swin", name), "maybe_pad")
                             for name in ("SwinPatchEmbeddings", "SwinPatchMerging", "SwinLayer")]),
    Row(patch=patches.patch_tensor_len, args=_shared("llama"),
        slots=lambda model: [(vars(sys.modules["transformers.models.llama.modeling_llama"]), "len")], adds=True),
    Row(patch=patches.patch_position_interpolation, args=_shared("dinov2"),
        slots=lambda model: [(modeling_dinov2.Dinov2Embeddings, "interpolate_pos_encoding")], adds=True),
    Row(patch=patches.patch_dense_experts, args=_shared("mixtral"),
        slots=lambda model: [(modeling_mixtral.MixtralExperts, "forward")], adds=True),
    Row(patch=patches.patch_dense_identity_experts, args=_shared("causal-lm:longcat_flash"),
        slots=lambda model: [(_owner("transformers.models.longcat_flash.modeling_longcat_flash", "LongcatFlashExperts"),
                              "forward")]),
    Row(patch=patches.patch_dense_parallel_experts, args=_shared("causal-lm:jetmoe"),
        slots=lambda model: [(_owner("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoE"), "forward"),
                             (_owner("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoA"), "map"),
                             (_owner("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoA"), "reduce")]),
    Row(patch=patches.patch_dense_expert_modules, args=_shared("seq2seq-lm:switch_transformers"),
        slots=lambda model: [(_owner("transformers.models.switch_transformers.modeling_switch_transformers",
                                     "SwitchTransformersExperts"), "forward")]),
    # The ExecuTorch lowering patches (hfx.backends.PTE_PATCHES).
    Row(patch=_pte_fixes.patch_edge_verifier_sym_functions, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.verification.verifier"), "_EXECUTORCH_SYM_OPS")]),
    Row(patch=_pte_fixes.patch_edge_validator_list_returns, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.verification.arg_validator", "EdgeOpArgValidator"), "call_function")]),
    Row(patch=_pte_fixes.patch_edge_decomposition_table, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.program._program"), "_default_decomposition_table")]),
    *(Row(patch=patch, needs="executorch", slots=lambda patch=patch: _xnnpack_slots()[patch])
      for patch in (_pte_fixes.patch_xnnpack_unsqueeze_dynamic_dims, _pte_fixes.patch_xnnpack_conv1d_dynamic_dims,
                    _pte_fixes.patch_xnnpack_tanh_gelu, _pte_fixes.patch_xnnpack_max_dim,
                    _pte_fixes.patch_xnnpack_prelu_4d, _pte_fixes.patch_xnnpack_acyclic_partitions,
                    _pte_fixes.patch_xnnpack_reshape_one_valued_sizes)),
    # Entered by every runtime's lowering (hfx.backends._lowering_speed).
    Row(patch=_lowering_speed.patch_cia_ops_materialized_once_per_collection,
        slots=lambda: [(_owner(name), "_collect_all_valid_cia_ops") for name in _lowering_speed._COLLECTORS]),  # noqa: SLF001
    Row(patch=_pte_fixes.patch_export_pass_skips_unchanged_retraces, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.pass_base", "ExportPass"), "call")]),
    Row(patch=_pte_fixes.patch_decompositions_in_one_retrace, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.program._program"), "_apply_pre_decomposition_transforms")]),
    Row(patch=_pte_fixes.patch_edge_dtype_check_reads_metadata, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.verification.verifier"), "EdgeOpArgValidator")]),
    Row(patch=_pte_fixes.patch_decompositions_skipped_when_nothing_decomposes, needs="executorch",
        slots=lambda: [(torch.export.ExportedProgram, "run_decompositions")]),
    Row(patch=_pte_fixes.patch_bilinear_patterns_not_built_when_kept_whole, needs="executorch",
        slots=lambda: [(_owner("executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d",
                               "ConvertToUpsampleBilinear2d"), "call")]),
    Row(patch=_pte_fixes.patch_exact_upper_bounds, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.sym_util"), "eval_upper_bound"),
                       (_owner("executorch.exir.passes.sym_shape_eval_pass"), "eval_upper_bound")]),
    Row(patch=_pte_fixes.patch_unbacked_upper_bounds, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.sym_util"), "eval_upper_bound"),
                       (_owner("executorch.exir.passes.sym_shape_eval_pass"), "eval_upper_bound")]),
    Row(patch=_pte_fixes.patch_dim_order_of_data_dependent_strides, needs="executorch",
        slots=lambda: [(_owner(name), "dim_order_from_stride") for name in _pte_fixes._DIM_ORDER_USERS]),  # noqa: SLF001
    Row(patch=_pte_fixes.patch_view_copies_of_static_bases_kept, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.passes.replace_view_copy_with_view_pass"), "_is_view_copy")]),
    Row(patch=_pte_fixes.patch_symbolic_empties_as_zeros, needs="executorch",
        slots=lambda: [(_owner("executorch.exir.passes.memory_format_ops_pass", "MemoryFormatOpsPass"),
                        "call_operator")]),
    Row(patch=_pte_fixes.patch_sdpa_decomposition_layout, adds=True,
        slots=lambda: [(_owner("torch._decomp", "decomposition_table"),
                        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)]),  # noqa: SLF001
    # ExecuTorch's fused attention for the runner's program: one override in transformers' attention interface.
    Row(patch=patch_custom_attention, args=lambda models: (None, "sdpa"), adds=True,
        slots=lambda cache, implementation: [(ALL_ATTENTION_FUNCTIONS._local_mapping, implementation)]),  # noqa: SLF001
    # The output capture every lowering enters (its loggers' handlers, stdout and stderr).
    Row(patch=_common.captured_output, args=lambda models: (io.StringIO(), ("hfx_contract",)),
        slots=lambda buffer, namespaces: [(logging.getLogger("hfx_contract"), "handlers"),
                                          (logging.getLogger("hfx_contract"), "propagate"), (sys, "stdout"),
                                          (sys, "stderr")]),
)


def _read(slot: Slot) -> Any:
    owner, name = slot
    return owner.get(name, _MISSING) if isinstance(owner, Mapping) else vars(owner).get(name, _MISSING)


def _label(slot: Slot) -> str:
    owner, name = slot
    return f"{getattr(owner, '__name__', type(owner).__name__)}[{name!r}]"


def _bound(row: Row, models: Models) -> tuple[Callable[[], Any], list[Slot]]:
    """The row's zero-argument patch and its slots."""
    if row.needs:
        pytest.importorskip(row.needs)
    args = row.args(models)
    patch = functools.partial(row.patch, *args)
    if row.writes is not None:
        patch = functools.partial(_core.with_patches, patch, functools.partial(row.writes, *args))
    slots = list(row.slots(*args))
    assert slots, f"{row.id}: the row names no slot"
    return patch, slots


def _assert_unchanged(slots: list[Slot], before: list[Any]) -> None:
    changed = [_label(slot) for slot, value in zip(slots, before) if _read(slot) is not value]
    assert not changed, f"not restored: {changed}"


@contextlib.contextmanager
def _broken() -> Iterator[None]:
    raise ValueError("cannot apply")
    yield


class _Inside(Exception):
    """Raised in the block."""


@pytest.mark.parametrize("row", [row for row in ROWS if row.writes is None], ids=lambda row: row.id)
def test_active_inside_the_block(row, models):
    patch, slots = _bound(row, models)
    before = [_read(slot) for slot in slots]
    with patch():
        same = [_label(slot) for slot, value in zip(slots, before) if _read(slot) is value]
    assert not same, f"not swapped inside the block: {same}"
    _assert_unchanged(slots, before)  # else the rows after this one would start from its leftovers


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_restored_exactly_after_the_block(row, models):
    patch, slots = _bound(row, models)
    before = [_read(slot) for slot in slots]
    with patch():
        pass
    _assert_unchanged(slots, before)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_restored_after_an_exception(row, models):
    patch, slots = _bound(row, models)
    before = [_read(slot) for slot in slots]
    with pytest.raises(_Inside), patch():
        raise _Inside
    _assert_unchanged(slots, before)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_unwound_when_a_later_patch_fails_to_apply(row, models):
    patch, slots = _bound(row, models)
    before = [_read(slot) for slot in slots]
    with pytest.raises(PatchError, match="_broken failed to apply"), _core.with_patches(patch, _broken):
        pytest.fail("the block ran although a patch failed to apply")
    _assert_unchanged(slots, before)


@contextlib.contextmanager
def _fails_to_undo() -> Iterator[None]:
    yield
    raise ValueError("cannot undo")


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_unwound_when_a_later_patch_fails_to_undo(row, models):
    # The failure at a patch's exit: every patch entered before it is still undone.
    patch, slots = _bound(row, models)
    before = [_read(slot) for slot in slots]
    with pytest.raises(ValueError, match="cannot undo"), _core.with_patches(patch, _fails_to_undo):
        pass
    _assert_unchanged(slots, before)


def every_slot(models: Models) -> list[Slot]:
    """The slots of every row: every owner an hfx patch swaps an attribute or item of."""
    return [slot for row in ROWS if row.needs is None or importlib.util.find_spec(row.needs)
            for slot in _bound(row, models)[1]]


def read_slots(slots: list[Slot]) -> list[Any]:
    """What each slot holds now (compare with ``is``)."""
    return [_read(slot) for slot in slots]


def changed_slots(slots: list[Slot], before: list[Any]) -> list[str]:
    """The slots that hold another object than ``before``."""
    return [_label(slot) for slot, value in zip(slots, before, strict=True) if _read(slot) is not value]


@pytest.mark.parametrize("row", [row for row in ROWS if row.adds], ids=lambda row: row.id)
def test_an_attribute_missing_before_is_removed_after(row, models, monkeypatch):
    patch, slots = _bound(row, models)
    for owner, name in slots:
        if _read((owner, name)) is not _MISSING:
            (monkeypatch.delitem if isinstance(owner, Mapping) else monkeypatch.delattr)(owner, name)
    with patch():
        missing = [_label(slot) for slot in slots if _read(slot) is _MISSING]
    assert not missing, f"not set inside the block: {missing}"
    left = [_label(slot) for slot in slots if _read(slot) is not _MISSING]
    assert not left, f"left behind: {left}"


# --- coverage: a new patch cannot skip the contract ---------------------------------------------

# The zoo models whose default_patches (and ssm/arch/moe patches) between them select every model patch.
_SELECTING_MODELS = ("llama", "mamba", "mamba2", "qwen2_vl", "mixtral", "swin", "whisper")


def _factory(patch: Any) -> Any:
    """The function behind a patch value (a ``functools.partial`` binds it to a model)."""
    while isinstance(patch, functools.partial):
        patch = patch.func
    return patch


def _defined_patches() -> dict[str, Any]:
    """Every module-level ``def patch_*`` in hfx, found in the source with ``ast``: ``{module.name: function}``."""
    root = pathlib.Path(hfx.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("patch_"):
                # A nested one resolves to None here and fails the coverage test: give it a row or a module scope.
                found[f"{module}.{node.name}"] = vars(importlib.import_module(module)).get(node.name)
    return found


def _selected_patches() -> dict[str, Any]:
    """Every patch in hfx's patch tuples: ``{where it was found: factory}``."""
    found = {}
    for name in _SELECTING_MODELS:
        model = zoo.build(name)
        for where, selected in (("default_patches", patches.default_patches(model)),
                                ("ssm_patches", patches.ssm_patches(model)),
                                ("arch_patches", patches.arch_patches(model)),
                                ("moe_patches", patches.moe_patches(model))):
            found.update({f"{where}({name})[{i}]": _factory(p) for i, p in enumerate(selected)})
    for where, selected in (("TORCH_PATCHES", patches.TORCH_PATCHES), ("CACHE_PATCHES", patches.CACHE_PATCHES),
                            ("PTE_PATCHES", PTE_PATCHES)):
        found.update({f"{where}[{i}]": _factory(p) for i, p in enumerate(selected)})
    return found


def test_every_patch_has_a_row():
    covered = {row.patch for row in ROWS}
    found = {**_selected_patches(), **_defined_patches()}
    missing = sorted(f"{where}: {getattr(factory, '__qualname__', factory)}" for where, factory in found.items()
                     if factory not in covered)
    assert not missing, f"patches without a row in ROWS: {missing}"


def test_the_coverage_walk_sees_every_kind_of_patch():
    """The walk finds patches bound to a model, plain ones, ExecuTorch's, and the ``def patch_`` in backends."""
    selected, defined = set(_selected_patches().values()), _defined_patches()
    assert {patches.patch_dense_experts, patches.patch_window_permutation, registered_caches,
            patches.patch_sdpa_fully_masked_rows, _pte_fixes.patch_edge_verifier_sym_functions} <= selected
    assert defined["hfx.backends._executorch_fixes.patch_xnnpack_tanh_gelu"] is _pte_fixes.patch_xnnpack_tanh_gelu
    assert len({row.patch for row in ROWS}) == len(ROWS)  # one row per patch
