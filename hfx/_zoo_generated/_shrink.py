"""Shrinking a config: small sizes passed to every matching constructor parameter, sub-configs alike."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from hfx._zoo_generated._reading import is_int, read, text_config
from hfx._zoo_generated._sizes import (
    EXPERTS, HEAD_DIM, HEADS, IMAGE, INTERMEDIATE, LAYERS, PATCH, POSITIONS, PYRAMID_IMAGE, SPECIAL_BLOCK, TEXT_HIGH,
    VOCAB, WIDTH, WINDOW,
)
from hfx._zoo_generated._tasks import model_class, split_name


_KV = re.compile(r"(key_value_heads|kv_heads)$")
_TOKEN = re.compile(r"(token_ids?|token_index|_id|_ids)$")
_NOT_TOKEN = re.compile(r"^(seed|num_.*|.*_ids_.*)$")
_LAYER_COUNT = re.compile(r"(layers|^n_layer|^depth|_depth|^num_blocks)$")
_NOT_LAYER_COUNT = re.compile(r"feat_extract|kv_shared|max_window|feature|conv_pos|timestamp")


_WIDTHS = re.compile(
    r"^(hidden_size|d_model|n_embd|n_embed|embed_dim|dim|d_embed|emb_dim|embedding_dim|embedding_size|"
    r"word_embed_proj_dim|projection_dim|hidden_dim|proj_dim|projection_size|d_latents)$"
    r"|(_hidden_size|_hidden_dim|_embed_dim|_proj_dim|_projection_dim|_embedding_dim|condition_dim|_output_dim)$"
    r"|^hidden_size_|^output_dim$|^projector_input_dim$"
)
_CHANNELS = re.compile(r"(out_channels?|_channels|_channel)$")
_PYRAMID_IMAGE = re.compile(r"^(image_size|pretrain_image_size|img_size|crop_size|max_img_size)$")


def _at_most(limit: int) -> Callable[[int], int]:
    return lambda value: min(value, limit)


def _layer_count_rule(value: int) -> int:
    return min(value, LAYERS)


# (pattern on a parameter name, how an int value of it shrinks); the first match wins. Lists are handled apart.
_SCALAR_RULES: tuple[tuple[re.Pattern[str], Callable[[int], int]], ...] = tuple(
    (re.compile(pattern), rule) for pattern, rule in (
        # Layers that share an earlier layer's keys and values need two earlier layers of each kind: none here.
        (r"kv_shared_layers$", _at_most(0)),
        # Every k-th layer of another kind (full attention, no RoPE, MoE): k = 2 keeps both kinds in two layers.
        (r"(interval|period|_pattern|_step|_freq|frequency|layer_group_size)$", _at_most(LAYERS)),
        (r"layer_offset$", _at_most(LAYERS - 1)),
        (r"^(n_groups|mamba_n_groups|num_groups)$", _at_most(1)),
        (_LAYER_COUNT.pattern, _layer_count_rule),
        (r"vocab_size$|^vocab_size_|_vocab$", _at_most(VOCAB)),
        (r"(moe|expert).*(intermediate|ffn|hidden)", _at_most(16)),
        (r"intermediate|ffn|feed_?forward|^d_ff$|^d_inner$|^n_inner$|mlp_dim|^dff$|dim_ff|_ff$",
         _at_most(INTERMEDIATE)),
        (r"lora_rank$|_rank$", _at_most(16)),
        (r"^rotary_dim$", _at_most(HEAD_DIM)),
        (r"head_dim$|^d_kv$|^kv_channels$|head_size$|d_head$|dim_head$|attention_head_dim$", _at_most(HEAD_DIM)),
        (r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|n_experts|"
         r"zero_expert_num)$",
         _at_most(EXPERTS)),
        (r"experts_per_tok|^top_k$|^moe_topk$|^moe_k$|experts_per_token|^num_selected_experts$", _at_most(2)),
        # Detection queries: a top-k over the encoder's tokens of a small image (RT-DETR) needs fewer than them.
        (r"^(num_queries|num_denoising)$", _at_most(10)),
        (r"^(n_group|topk_group)$", _at_most(1)),
        (r"heads$|^n_head$", _at_most(HEADS)),
        (_WIDTHS.pattern, _at_most(WIDTH)),
        (_CHANNELS.pattern, _at_most(WIDTH)),
        # Attention windows counted in patches (Swin's 7) span two patches; windows in pixels (Qwen2.5-VL's 112) stay.
        (r"^window_size$", lambda value: min(value, 2) if value <= 16 else value),
        (r"^(max_position_embeddings|n_positions|max_target_positions|n_ctx|max_seq_len|max_sequence_length)$",
         _at_most(POSITIONS)),
        (_PYRAMID_IMAGE.pattern, _at_most(IMAGE)),
        # Image features pooled to a few tokens (Gemma 3: a square number that divides the 4 x 4 patches).
        (r"(tokens_per_image|^image_seq_length|^num_image_tokens)$", _at_most(4)),
        (r"^patch_size$", _at_most(PATCH)),
        (r"^(sliding_window|attention_chunk_size|local_attention|sliding_window_size)$", _at_most(WINDOW)),
        (r"^(state_size|ssm_state_size|mamba_d_state|d_state)$", _at_most(16)),
        # Convolutional audio codecs double ``num_filters`` at every downsampling.
        (r"^num_filters$", _at_most(8)),
        (r"^num_frames$", _at_most(2)),  # video clips: two frames (one tubelet of two)
    )
)


# Sizes some configs leave unset by default although their models read them (DeepSeek-V2, dots.llm1 MoE);
# transformers' testers pass them.
_WHEN_UNSET: Mapping[str, Any] = MappingProxyType(
    {"num_experts_per_tok": 2, "n_routed_experts": EXPERTS, "n_shared_experts": 1, "moe_intermediate_size": 16,
     # Bamba's default has no attention layer, and a cache without one fails (``get_seq_length``).
     "attn_layer_indices": [LAYERS - 1],
     # CTC heads (Wav2Vec2-BERT, -Conformer) size their output by it.
     "vocab_size": VOCAB,
     # Sequence classifiers find each row's last token by it, ESM masks by it (transformers' testers always pass 0).
     "pad_token_id": 0,
     # BLIP-2 and InstructBLIP mark where the query tokens go with it (their processors set it): the lowest id of
     # the special-token block, which prompt text never draws.
     "image_token_index": TEXT_HIGH, "image_token_id": TEXT_HIGH}
)

# Model types whose configs need a value no generic rule gives: (model type -> constructor arguments), each with why.
OVERRIDES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    # Its default picks only the last layer, but its segmentation head takes four (as transformers' tests set).
    "beit": MappingProxyType({"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]}),
    # Stage i's drop-path list is indexed by the stage number: a stage needs at least i + 1 blocks.
    "cvt": MappingProxyType({"depth": [1, 2, 3]}),
    # Its last convolution's width is ``round_filters(1280)`` (hard-coded), which ``hidden_dim`` must equal.
    "efficientnet": MappingProxyType({"hidden_dim": 2560}),
    # Its stem is four stride-2 convolutions whatever ``patch_size`` says: the attention biases need 16.
    "levit": MappingProxyType({"patch_size": 16}),
    # GPT-Neo expands ``attention_types`` ([[kinds, repeats]]) to one kind per layer: one global and one local layer.
    "gpt_neo": MappingProxyType({"attention_types": [[["global", "local"], 1]]}),
    # Its default is Mamba layers only, and a cache without an attention layer fails (``get_seq_length``).
    "granitemoehybrid": MappingProxyType({"layer_types": ["linear_attention", "attention"]}),
    # Axial position embeddings: the two factors' widths sum to the width, the two shape factors multiply to at
    # least the sequence length.
    "reformer": MappingProxyType({"axial_pos_embds_dim": [16, 16], "axial_pos_shape": [8, 8]}),
    # Each block after the first pools the sequence by 2: the default three pool the census capture's 7 tokens to
    # 1, and torch's contiguity check then pins the length (Eq((s - 1)//4, 1)); two blocks keep it dynamic
    # (hfx.patches.patch_funnel_positions; tests/patches/test_arch.py).
    "funnel": MappingProxyType({"block_sizes": [1, 1]}),
})


def _small_scalar(name: str, value: int) -> int:
    for pattern, rule in _SCALAR_RULES:
        if pattern.search(name) and not (rule is _layer_count_rule and _NOT_LAYER_COUNT.search(name)):
            return rule(value)
    return value


_STAGE_WIDTHS = re.compile(r"(hidden_sizes|embed_dims?|dims|channels|hidden_size|embed_dim|conv_dim|widths|"
                           r"hidden_dims|_sizes|out_features)(_per_stage)?$")
_STAGE_DEPTHS = re.compile(r"(depths?|layers|num_blocks|blocks|repeats)(_per_stage)?$")
_STAGE_HEADS = re.compile(r"heads$")


def _small_list(name: str, values: list[int], top: int | None) -> list[int]:
    """Per-stage lists shrink together: widths by the config's one width map, depths to 1, heads to 2."""
    name = name.removesuffix("_per_stage")  # SAM 2's Hiera: blocks_per_stage, embed_dim_per_stage ...
    if _STAGE_HEADS.search(name):
        return [min(v, 2) for v in values]
    if _STAGE_DEPTHS.search(name):
        return [min(v, 1) for v in values]
    if _STAGE_WIDTHS.search(name) and top is not None:
        return [_stage_width(v, top) for v in values]
    return [_small_scalar(name, v) for v in values]  # per-layer sizes (Gemma 3n's intermediate_size)


def _stage_lists(config: Any, pattern: re.Pattern[str]) -> list[list[int]]:
    return [list(v) for f in dataclasses.fields(config) if pattern.search(f.name)
            for v in [read(config, f.name)]
            if isinstance(v, (list, tuple)) and len(v) > 1 and all(is_int(x) for x in v)]


def _widest_stage(config: Any) -> int | None:
    """The widest entry of the per-stage width lists of ``config`` and its sub-configs (a detector and its backbone
    share one width map), if over 64."""
    from transformers import PretrainedConfig

    widths = [max(v) for v in _stage_lists(config, _STAGE_WIDTHS)]
    widths += [w for f in dataclasses.fields(config) if isinstance(sub := read(config, f.name), PretrainedConfig)
               for w in [_widest_stage(_without_timm(sub))] if w is not None]
    return max(widths) if widths and max(widths) > 64 else None


def _stage_width(value: int, top: int) -> int:
    """One map for every width of a pyramid config and its backbone, so that a stage's output and the next one's
    input still agree: the widest becomes 64, the others in proportion (multiples of 8, at least 32); 32 and below
    stay (RGB input, stems that models hard-code, as EfficientNet's 32).

    Example:
        >>> [_stage_width(v, 2048) for v in (3, 32, 48, 512, 1024, 2048)]
        [3, 32, 32, 32, 32, 64]
    """
    return value if value <= 32 else max(32, math.ceil(value * 64 / top / 8) * 8)


def _layer_count(config: Any) -> tuple[str, int] | None:
    """``(name, value)`` of a config's layer count, for resizing its per-layer lists."""
    for field in dataclasses.fields(config):
        value = read(config, field.name)
        if is_int(value) and _LAYER_COUNT.search(field.name) and not _NOT_LAYER_COUNT.search(field.name):
            return field.name, value
    return None


def _resample(values: list[Any], count: int) -> list[Any]:
    """``count`` of ``values``: the first of each distinct value first (a pattern keeps its kinds), then the others.

    Example:
        >>> _resample(["sliding", "sliding", "sliding", "full"] * 3, 2)
        ['sliding', 'full']
    """
    order = sorted(range(len(values)), key=lambda i: (values.index(values[i]) != i, i))
    return [values[i] for i in sorted(order[:count])]


def _spread(indices: list[int], count: int) -> list[int]:
    """Distinct layer indices, in order, spread over ``count`` layers (as distinct as ``count`` allows).

    Example:
        >>> _spread([3, 5, 7, 11], 4), _spread([7, 15, 23, 31], 2)
        ([0, 1, 2, 3], [0, 0, 1, 1])
    """
    rank = {v: i for i, v in enumerate(sorted(indices))}
    top = max(len(indices) - 1, 1)
    return [round(rank[v] * (count - 1) / top) for v in indices]


def _remap_layer_index(value: int, old: int, new: int) -> int:
    if value < 0 or old <= 1:
        return value if value < 0 else min(value, new - 1)
    return round(value * (new - 1) / (old - 1))




def _without_timm(config: Any) -> Any:
    """A timm backbone's config as transformers' own ResNet backbone with the same feature levels (timm is an extra;
    transformers' tests of DETR-like detectors use the ResNet too)."""
    if getattr(config, "model_type", None) != "timm_backbone":
        return config
    from transformers import ResNetConfig

    levels = list(getattr(config, "out_indices", None) or [-1])
    return ResNetConfig(out_indices=[level % 5 for level in levels])


def _shrunk_kwargs(config: Any, tokens: Mapping[int, int], top: int | None) -> dict[str, Any]:
    """The constructor arguments that make ``config`` small: sizes, sub-configs, special tokens (``tokens``)."""
    from transformers import PretrainedConfig

    kwargs: dict[str, Any] = {}
    fields = [f for f in dataclasses.fields(config) if f.init and f.name not in ("transformers_version", "dtype")]
    pyramid = bool(_stage_lists(config, _STAGE_WIDTHS) or _stage_lists(config, _STAGE_DEPTHS))
    own_top = top if _stage_lists(config, _STAGE_WIDTHS) else None  # the tree's map, where this config has stages
    for field in fields:
        value = read(config, field.name)
        if isinstance(value, PretrainedConfig):
            kwargs[field.name] = _shrink(_without_timm(value), tokens, top)
        elif _FEATURE_LAYER.search(field.name) and (is_int(value) or isinstance(value, (list, tuple))):
            small = _feature_layers(value)
            if small != value:
                kwargs[field.name] = small
        elif _is_token(field.name, value):
            is_list = isinstance(value, (list, tuple))
            small = type(value)(tokens.get(v, v) for v in value) if is_list else tokens.get(value, value)
            if small != value:
                kwargs[field.name] = small
        elif is_int(value) and pyramid and _PYRAMID_IMAGE.search(field.name):
            kwargs[field.name] = min(value, PYRAMID_IMAGE)
        elif is_int(value):
            in_pyramid = own_top is not None and (_WIDTHS.search(field.name) or _CHANNELS.search(field.name))
            small = _stage_width(value, own_top) if in_pyramid else _small_scalar(field.name, value)
            if small != value:
                kwargs[field.name] = small
        elif isinstance(value, (list, tuple)) and value and all(is_int(v) for v in value):
            small_list = _small_list(field.name, list(value), own_top)
            if small_list != list(value):
                kwargs[field.name] = type(value)(small_list)
        elif field.name == "use_timm_backbone" and value:
            kwargs[field.name] = False  # transformers' own backbone (timm is an extra)
        elif value is None and field.name in _WHEN_UNSET:
            kwargs[field.name] = _WHEN_UNSET[field.name]
        elif field.name == "use_pretrained_backbone" and value:
            kwargs[field.name] = False  # never download a backbone
    _fit_heads(config, kwargs)
    _fit_head_dims(config, kwargs)
    _fit_layers(config, fields, kwargs)
    return kwargs


def _now(config: Any, kwargs: Mapping[str, Any], name: str) -> Any:
    """A parameter's value after shrinking: the new one if it changes, else the config's."""
    return kwargs[name] if name in kwargs else read(config, name)


def _fit_head_dims(config: Any, kwargs: dict[str, Any]) -> None:
    """Head sizes that other sizes determine: ``head_dim`` = width / heads, MLA's ``qk_head_dim``, Mamba 2's heads
    times head size = expand x width, M-RoPE sections that fill half a head."""
    names = {f.name for f in dataclasses.fields(config)}
    width, heads = _now(config, kwargs, "hidden_size"), _now(config, kwargs, "num_attention_heads")
    if "head_dim" in names and is_int(width) and is_int(heads) and heads and "qk_nope_head_dim" not in names:
        kwargs["head_dim"] = max(width // heads, 2)
    if "num_key_value_heads" in names and _now(config, kwargs, "num_key_value_heads") is None and is_int(heads):
        kwargs["num_key_value_heads"] = heads  # the models read None as "as many as the query heads"
    if {"qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim"} <= names:
        kwargs["qk_head_dim"] = _now(config, kwargs, "qk_nope_head_dim") + _now(config, kwargs, "qk_rope_head_dim")
    for prefix in ("mamba_", ""):
        expand = _now(config, kwargs, f"{prefix}expand")
        count = next((n for n in (f"{prefix}n_heads", f"{prefix}num_heads") if is_int(_now(config, kwargs, n))), None)
        size = next((n for n in (f"{prefix}d_head", f"{prefix}head_dim") if n in names), None)
        heads = _now(config, kwargs, count) if count else None
        if is_int(expand) and is_int(width) and heads and size and (expand * width) % heads == 0:
            kwargs[size] = expand * width // heads
            if is_int(_now(config, kwargs, f"{prefix}d_ssm")):  # Falcon-H1's explicit Mamba width
                kwargs[f"{prefix}d_ssm"] = expand * width
            break
    rope = read(config, "rope_parameters")
    head = _now(config, kwargs, "head_dim") or (width // heads if is_int(width) and is_int(heads) and heads else None)
    if isinstance(rope, Mapping) and isinstance(rope.get("mrope_section"), (list, tuple)) and is_int(head):
        kwargs["rope_parameters"] = {**rope, "mrope_section": _split(head // 2, rope["mrope_section"])}


def _split(total: int, parts: list[int]) -> list[int]:
    """``total`` split in ``len(parts)`` positive parts, in proportion to ``parts``.

    Example:
        >>> _split(4, [16, 24, 24])
        [1, 1, 2]
    """
    shares = [max(1, total * p // sum(parts)) for p in parts]
    shares[-1] += total - sum(shares)
    return shares


def _fit_heads(config: Any, kwargs: dict[str, Any]) -> None:
    """Key-value heads keep their kind (as many as the query heads, one, or a group) and divide the query heads."""
    for field in dataclasses.fields(config):
        old_kv = read(config, field.name)
        if not (is_int(old_kv) and _KV.search(field.name)):
            continue
        prefix = field.name[: _KV.search(field.name).start()]
        heads_name = next((n for n in (f"{prefix}attention_heads", f"{prefix}heads", "num_attention_heads")
                           if is_int(read(config, n))), None)
        if heads_name is None:
            kwargs[field.name] = min(old_kv, 2)
            continue
        old_heads = read(config, heads_name)
        heads = kwargs.get(heads_name, old_heads)
        kwargs[field.name] = heads if old_kv >= old_heads else (1 if old_kv == 1 else math.gcd(2, heads))


_INDEX = re.compile(r"layers?|indexes|indices|idx")
# A multimodal config's index into its vision tower's hidden states (LLaVA's ``vision_feature_layer``).
_FEATURE_LAYER = re.compile(r"feature_layers?$")


def _feature_layers(value: Any) -> Any:
    """Indices into a shrunk tower's layers, clamped into its ``LAYERS`` layers (from either end)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_feature_layers(v) for v in value)
    return max(min(value, LAYERS - 1), -LAYERS) if is_int(value) else value


def _fit_layers(config: Any, fields: list[dataclasses.Field[Any]], kwargs: dict[str, Any]) -> None:
    """Per-layer lists (``layer_types`` too) resized to the new layer count; layer indices moved into it."""
    found = _layer_count(config)
    if found is None:
        return
    name, old = found
    new = kwargs.get(name, old)
    if new == old:
        return
    indices = {f.name: v for f in fields if _INDEX.search(f.name) and not _is_token(f.name, v := read(config, f.name))
               and isinstance(v, (list, tuple)) and v and all(is_int(x) and 0 <= x < old for x in v)
               and len(set(v)) == len(v) and len(v) < old}
    # Distinct layers picked out (DPT's and BEiT's four feature layers) stay distinct: up to 4 layers kept for them.
    new = kwargs[name] = min(max([new, *(len(v) for v in indices.values())]), max(old, new), 4) if indices else new
    for field in fields:
        value = kwargs.get(field.name, read(config, field.name))
        if field.name == name or _is_token(field.name, value):
            continue
        if isinstance(value, (list, tuple)) and len(value) == old:
            kwargs[field.name] = type(value)(_resample(list(value), new))
        elif field.name in indices:
            kwargs[field.name] = type(value)(_spread(list(value), new))
        elif "layer" in field.name and is_int(value) and value >= new and not _has_rule(field.name):
            kwargs[field.name] = _remap_layer_index(value, old, new)


def _fit_backbone(config: Any, fresh: Any, kwargs: dict[str, Any]) -> None:
    """A backbone's ``out_indices`` (not a dataclass field) kept when a parent chose them (RT-DETR's last three
    stages), moved into the new layer count for a layer-based backbone (DINOv2 under DPT)."""
    chosen = vars(config).get("_out_indices")
    if not chosen or chosen == vars(fresh).get("_out_indices") or "out_indices" in kwargs:
        return
    found = _layer_count(config)
    if found is not None and kwargs.get(found[0], found[1]) != found[1] and all(is_int(i) and i > 0 for i in chosen):
        name, old = found
        new = kwargs[name] = min(max(kwargs[name], len(chosen)), old, 4)
        chosen = [i + 1 for i in _spread([i - 1 for i in chosen], new)]
    kwargs["out_indices"] = list(chosen)


def _has_rule(name: str) -> bool:
    return any(pattern.search(name) for pattern, _ in _SCALAR_RULES)


def _is_token(name: str, value: Any) -> bool:
    if not _TOKEN.search(name) or _NOT_TOKEN.search(name):
        return False
    return is_int(value) or (isinstance(value, (list, tuple)) and bool(value) and all(is_int(v) for v in value))


def _special_tokens(config: Any) -> set[int]:
    """Every special-token id (>= 3) of ``config`` and its sub-configs."""
    from transformers import PretrainedConfig

    found: set[int] = set()
    for field in dataclasses.fields(config):
        value = read(config, field.name)
        if isinstance(value, PretrainedConfig):
            found |= _special_tokens(value)
        elif _is_token(field.name, value):
            found |= {v for v in (value if isinstance(value, (list, tuple)) else [value]) if v >= 3}
    return found


def _token_map(config: Any) -> dict[int, int]:
    """Special-token ids to distinct ids at the top of the small vocabulary, in order (one id, one place)."""
    ids = sorted(_special_tokens(config))
    if len(ids) > SPECIAL_BLOCK:
        msg = f"{len(ids)} distinct special tokens do not fit the top {SPECIAL_BLOCK} ids of a {VOCAB}-token vocabulary"
        raise ValueError(msg)
    return {old: VOCAB - len(ids) + index for index, old in enumerate(ids)}


def _shrink(config: Any, tokens: Mapping[int, int], top: int | None,
            overrides: Mapping[str, Any] = MappingProxyType({})) -> Any:
    from transformers import PretrainedConfig

    kwargs = _shrunk_kwargs(config, tokens, top)
    fresh = type(config)()
    _fit_backbone(config, fresh, kwargs)
    kwargs.update(overrides)
    kept = {}
    for field in dataclasses.fields(config):
        if not field.init or field.name in kwargs or field.name == "transformers_version":
            continue
        # A value that differs from a fresh default's was chosen by the caller or set by a parent config
        # (a detector's backbone ``out_indices``); the others the constructor derives again from the new sizes.
        value, default = read(config, field.name), read(fresh, field.name)
        if value is not None and not isinstance(value, PretrainedConfig) and (
            type(value) is not type(default) or value != default
        ):
            kept[field.name] = value
    return type(config)(**{**kept, **kwargs})


def shrink(config: Any, /, *, overrides: Mapping[str, Any] | None = None) -> Any:
    """A small copy of ``config``: its class built with small values for every size parameter it has.

    Widths become 32, layers 2, heads 4 (key-value heads keep their kind), feed-forward sizes 64, vocabularies 256,
    positions 512, images 32 px in patches of at most 8, experts 4 (2 per token), sliding windows 4; per-stage lists
    (pyramid widths, depths, heads) shrink together; per-layer lists follow the new layer count; sub-configs shrink
    the same way; special-token ids move to the top of the vocabulary. Derived values (``head_dim`` left ``None``,
    ``layer_types``) are left to the constructor, which recomputes them.

    Args:
        config: a transformers config (any ``PretrainedConfig``); it is not changed.
        overrides: constructor arguments of the top config that replace the shrunk ones (``OVERRIDES``).

    Returns:
        A new config of the same class.

    Raises:
        ValueError: the config's own validation rejects the small values (from the constructor).

    Example:
        >>> from transformers import LlamaConfig
        >>> small = shrink(LlamaConfig())
        >>> (small.hidden_size, small.head_dim, small.num_key_value_heads, small.eos_token_id)
        (32, 8, 4, 2)
    """
    return _shrink(config, _token_map(config), _widest_stage(config), overrides or {})


def tiny_config(model_type: str, /) -> Any:
    """``shrink`` of the default config of ``model_type``.

    Example:
        >>> tiny_config("gpt2").n_embd
        32
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return shrink(CONFIG_MAPPING[model_type](), overrides=OVERRIDES.get(model_type, {}))


def task_config(name: str, /) -> Any:
    """The tiny config generated entry ``name`` builds its model from.

    ``tiny_config`` of its type, or the sub-config of it that the task's model class takes (MusicGen's causal LM
    takes the decoder's); a causal LM's config says ``is_decoder`` where it has the flag (BERT-like models), as
    transformers' tests set it.

    Example:
        >>> type(task_config("causal-lm:musicgen")).__name__
        'MusicgenDecoderConfig'
    """
    from transformers import PretrainedConfig

    spec, model_type = split_name(name)
    config = tiny_config(model_type)
    wanted = getattr(model_class(name), "config_class", None)
    if isinstance(wanted, type) and not isinstance(config, wanted):
        config = next((v for v in (read(config, f.name) for f in dataclasses.fields(config))
                       if isinstance(v, PretrainedConfig) and isinstance(v, wanted)), config)
    if spec.name == "causal-lm" and "is_decoder" in {f.name for f in dataclasses.fields(config)}:
        config.is_decoder = True
    if getattr(config, "is_encoder_decoder", False) and all(
            getattr(config, key, None) is None for key in ("decoder_start_token_id", "bos_token_id")):
        # generate() needs a first decoder token; LongT5's and EncoderDecoder's defaults have none, and
        # transformers' testers pass the pad token (LongT5ModelTester: decoder_start_token_id=0).
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    text = text_config(config)
    if _reads_mrope(model_class(name)) or _reads_mrope(_base_class(text)):
        _fit_mrope(text)
    return config


def _base_class(config: Any) -> type | None:
    """The base model class of ``config``'s type (what a composite model builds its text part with)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    found = MODEL_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    found = found[0] if isinstance(found, (tuple, list)) else found
    return getattr(transformers, found, None) if found else None


@functools.cache
def _reads_mrope(cls: type | None) -> bool:
    """Whether a model's modeling code reads multimodal RoPE sections (the Qwen2-VL and GLM-4V families)."""
    return cls is not None and "mrope_section" in inspect.getsource(inspect.getmodule(cls))


def _fit_mrope(text: Any) -> None:
    """Multimodal RoPE sections that fill half the rotary part of a head: the modeling code of the Qwen2-VL family
    defaults them to [16, 24, 24], for 128-wide heads, when the config names none."""
    rope = read(text, "rope_parameters")
    width, heads = read(text, "hidden_size"), read(text, "num_attention_heads")
    head = read(text, "head_dim") or (width // heads if is_int(width) and is_int(heads) and heads else None)
    if isinstance(rope, Mapping) and "mrope_section" not in rope and is_int(head):
        rotary = int(head * (rope.get("partial_rotary_factor") or read(text, "partial_rotary_factor") or 1.0))
        text.rope_parameters = {**rope, "mrope_section": _split(max(rotary // 2, 3), [16, 24, 24])}
