"""Tiny random-weight models built from configs (no download), with input builders.

51 architectures in seven families (decoder, encoder, vision, encoder-decoder, state-space, audio,
vision-language), each with 1-2 layers, 32-64 wide and a 256-token vocabulary, yet keeping its
distinctive code path (sliding windows, soft-capping, ALiBi, MoE routing, partial rotary, relative
attention, cross-attention, image-token merging ...). ``inputs`` are what ``generate`` takes;
``forward_inputs`` add the decoder tokens a seq2seq forward needs. Used by the tests, the examples,
the command line's default model and ``benchmarks/coverage.py``.

Besides these hand-made entries, ``entry`` (and so ``build``, ``inputs``, ``forward_inputs``) resolves generated
names ``<task>:<model_type>`` (``causal-lm:llama``, ``ctc:hubert``): every model type of transformers' auto mappings
for eleven tasks, its default config shrunk the way transformers' tests do (``hfx._zoo_generated``), made on demand;
``generated_names`` lists them and ``sample`` picks one runnable type per task for a seed.

Example:
    >>> from hfx import zoo
    >>> model = zoo.build("llama")
    >>> sorted(zoo.inputs("llama", batch=2, sequence=5))
    ['attention_mask', 'input_ids']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

DEFAULT = "llama"


@attrs.frozen(kw_only=True)
class ZooEntry:
    """One architecture: how to build its tiny config, which Auto class loads it, what inputs it takes."""

    name: str
    family: str
    auto_class: str
    config: Callable[[], Any] = attrs.field(eq=False)
    inputs: Callable[[Any, int, int], dict[str, torch.Tensor]] = attrs.field(eq=False)
    #: Whether ``model.generate`` applies, so that ``decompose`` + ``generate`` are checked too.
    generative: bool = False
    #: Whether the input builder varies the image size with ``sequence`` (models that take any size).
    image_size_varies: bool = False
    #: The inputs of one forward call, when they are not ``inputs`` (packed-image models: see ``_qwen_vl_forward``).
    forward: Callable[[Any, int, int], dict[str, torch.Tensor]] | None = attrs.field(default=None, eq=False)


def _token_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Random token ids with a left-padded first row (when batch > 1), so masks matter."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    ids = torch.randint(3, config.vocab_size, (batch, sequence), generator=generator)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    if batch > 1 and sequence > 2:
        mask[0, : sequence // 3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _image_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    del sequence
    generator = torch.Generator().manual_seed(batch)
    size = getattr(config, "image_size", 32)
    return {"pixel_values": torch.randn(batch, config.num_channels, size, size, generator=generator)}


def _any_size_image_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Images whose side grows with ``sequence`` (32 px at 7, 48 px at 11), for models that take any size."""
    generator = torch.Generator().manual_seed(batch)
    size = 8 * (sequence // 2 + 1)
    return {"pixel_values": torch.randn(batch, config.num_channels, size, size, generator=generator)}


def _waveform_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Raw audio of ``20 * sequence`` samples, enough frames for the tiny convolutional feature encoder."""
    del config
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    return {"input_values": torch.randn(batch, 20 * sequence, generator=generator)}


def _audio_features(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Log-mel features; Whisper's encoder takes exactly ``2 * max_source_positions`` frames."""
    del sequence
    generator = torch.Generator().manual_seed(batch)
    frames = 2 * config.max_source_positions
    return {"input_features": torch.randn(batch, config.num_mel_bins, frames, generator=generator)}


def _prompt_after(block: torch.Tensor, high: int, batch: int, sequence: int,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and mask for the image-token ``block`` followed by random text below ``high``; row 0 left-padded."""
    text = torch.randint(3, high, (batch, sequence), generator=generator)
    ids = torch.cat([block.expand(batch, -1), text], dim=1)
    mask = torch.ones_like(ids)
    pad = min(2, sequence - 1) if batch > 1 else 0
    if pad:
        ids[0] = torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[0, :-pad]])
        mask[0, :pad] = 0
    return ids, mask


def _llava_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """An image and a prompt: image placeholder tokens, then text; row 0 left-padded when batch > 1."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    vision = config.vision_config
    image_tokens = (vision.image_size // vision.patch_size) ** 2
    block = torch.full((1, image_tokens), config.image_token_id)
    ids, mask = _prompt_after(block, config.text_config.vocab_size - 1, batch, sequence, generator)
    pixels = torch.randn(batch, vision.num_channels, vision.image_size, vision.image_size, generator=generator)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


# Multimodal special tokens sit at the top of the 256-token vocabulary; prompt text stays below them.
_TEXT_HIGH = 248


def _pooled_image_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """PaliGemma / Gemma 3 / Idefics 3: ``[boi] image*n [eoi]`` then text; n depends on the projector."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    tokens = getattr(config, "mm_tokens_per_image", patches // getattr(config, "scale_factor", 1) ** 2)
    image = getattr(config, "image_token_id", None) or config.image_token_index
    block = torch.full((1, tokens), image)
    if hasattr(config, "boi_token_index"):
        block = torch.cat([torch.tensor([[config.boi_token_index]]), block, torch.tensor([[config.eoi_token_index]])], 1)
    ids, mask = _prompt_after(block, _TEXT_HIGH, batch, sequence, generator)
    pixels = torch.randn(batch, vision.num_channels, vision.image_size, vision.image_size, generator=generator)
    if config.model_type in ("idefics3", "smolvlm"):
        pixels = pixels[:, None]  # (batch, images per prompt, channels, height, width)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


def _prefix_lm_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """PaliGemma: the pooled-image prompt plus ``token_type_ids`` 0 (prefix), as its processor returns at inference.

    Without them eager PaliGemma is not consistent with itself: its text config sets
    ``use_bidirectional_attention``, so an unpadded batch (mask dropped) attends bidirectionally while a padded
    one gets a causal mask, and the same row changes with its neighbours.
    """
    inputs = _pooled_image_inputs(config, batch, sequence)
    return {**inputs, "token_type_ids": torch.zeros_like(inputs["input_ids"])}


def _image_block_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Gemma 3: the pooled-image prompt plus ``token_type_ids`` 1 on image tokens, as its processor returns.

    They make the image tokens of a block attend to each other bidirectionally (a data-dependent mask).
    """
    inputs = _pooled_image_inputs(config, batch, sequence)
    return {**inputs, "token_type_ids": (inputs["input_ids"] == config.image_token_index).long()}


# Qwen2-VL / Qwen2.5-VL images: 16x16 pixels in 4x4 patches, a (t, h, w) = (1, 4, 4) grid merged 2x2 into 4 tokens.
_QWEN_GRID = (1, 4, 4)


def _qwen_vl_inputs(config: Any, batch: int, sequence: int,
                    grid: tuple[int, int, int] = _QWEN_GRID) -> dict[str, torch.Tensor]:
    """Qwen2-VL family: ``<vision_start> image*n <vision_end>`` then text, flattened patches and ``image_grid_thw``."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    vision = config.vision_config
    t, h, w = grid
    tokens = t * h * w // vision.spatial_merge_size**2
    block = torch.tensor([[config.vision_start_token_id, *[config.image_token_id] * tokens, config.vision_end_token_id]])
    ids, mask = _prompt_after(block, _TEXT_HIGH, batch, sequence, generator)
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(batch * t * h * w, patch, generator=generator)
    # mm_token_type_ids (1 = image) tells M-RoPE where the image's (t, h, w) positions go.
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long(),
            "pixel_values": pixels, "image_grid_thw": torch.tensor([grid] * batch)}


def _qwen_vl_forward(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """A Qwen2-VL-family forward call: images wider with ``sequence`` (4x4 patches at 7, 4x6 at 11), plus what
    ``hfx.vision_inputs`` computes from them (M-RoPE positions, the tower's patch positions and boundaries)."""
    import transformers

    from hfx._capture.vision_inputs import vision_inputs

    values = _qwen_vl_inputs(config, batch, sequence, grid=(1, 4, 2 * (sequence // 4 + 1)))
    with torch.device("meta"):  # only the config and the code are read: no weights
        model = transformers.AutoModelForImageTextToText.from_config(config)
    return {**values, **vision_inputs(model, values)}


def _llama() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _qwen3() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _bert() -> Any:
    from transformers import BertConfig

    return BertConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=128)


def _vit() -> Any:
    from transformers import ViTConfig

    return ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     image_size=32, patch_size=8, num_labels=10)


def _t5() -> Any:
    from transformers import T5Config

    # A large init factor keeps a random T5 from repeating one token, so generation tests mean something.
    return T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                    decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, initializer_factor=10.0)


def _whisper() -> Any:
    from transformers import WhisperConfig

    return WhisperConfig(vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                         max_source_positions=16, max_target_positions=64, decoder_start_token_id=1, eos_token_id=2,
                         pad_token_id=0, bos_token_id=1, begin_suppress_tokens=None, suppress_tokens=None,
                         forced_decoder_ids=None, init_std=0.5)


def _llava() -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_index=255, projector_hidden_act="gelu",
                       vision_feature_layer=-1, vision_feature_select_strategy="default")


def _mamba() -> Any:
    from transformers import MambaConfig

    # A large init std keeps a random Mamba from repeating one token, so generation tests mean something.
    return MambaConfig(vocab_size=256, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                       initializer_range=0.5)


def _mamba2() -> Any:
    from transformers import Mamba2Config

    # chunk_size=8: prompts of a few tokens already span several chunks of the chunked scan.
    return Mamba2Config(vocab_size=256, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                        num_heads=4, head_dim=16, n_groups=1, chunk_size=8, initializer_range=0.5)


def _bamba() -> Any:
    from transformers import BambaConfig

    # One Mamba 2 layer, then one attention layer: a hybrid cache of conv/recurrent states and keys/values.
    return BambaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
                       mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8,
                       max_position_embeddings=256, initializer_range=0.5)


def _config(class_name: str, **kwargs: Any) -> Any:
    """``transformers.<class_name>(**kwargs)``, imported only when an entry is built."""
    import transformers

    return getattr(transformers, class_name)(**kwargs)


# The shared shape of the tiny decoder-only LLMs: 2 layers, 64 wide, grouped-query attention, 256 tokens.
# A larger init than the default 0.02 keeps a random model from repeating one token, so generation means something.
_LLM = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "initializer_range": 0.2}
# The shared shape of the tiny BERT-like encoders.
_ENCODER = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 128}
# Tiny ViT-like image towers: 32x32 images in 8x8 patches.
_VIT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "image_size": 32, "patch_size": 8}
# Tiny BART-like encoder-decoders.
_SEQ2SEQ = {"vocab_size": 256, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
            "max_position_embeddings": 128}
# Tiny wav2vec2-like audio encoders: a 2-layer convolutional feature encoder (10x downsampling), 1 transformer layer.
_AUDIO = {"vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 64, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
          "num_conv_pos_embeddings": 8, "num_conv_pos_embedding_groups": 2}
# Multimodal special tokens at the top of the vocabulary (see ``_TEXT_HIGH``).
_IMAGE, _BOI, _EOI = 255, 254, 253


def _family(family: str, auto_class: str, inputs: Callable[[Any, int, int], dict[str, torch.Tensor]], *,
            generative: bool = False) -> Callable[..., ZooEntry]:
    """An entry maker for one family: ``(name, config class name, **config kwargs) -> ZooEntry``."""

    def make(name: str, class_name: str, **kwargs: Any) -> ZooEntry:
        return ZooEntry(name=name, family=family, auto_class=auto_class, inputs=inputs, generative=generative,
                        config=functools.partial(_config, class_name, **kwargs))

    return make


_decoder = _family("decoder", "AutoModelForCausalLM", _token_inputs, generative=True)
_encoder = _family("encoder", "AutoModel", _token_inputs)
_seq2seq = _family("encoder-decoder", "AutoModelForSeq2SeqLM", _token_inputs, generative=True)
_audio = _family("audio", "AutoModel", _waveform_inputs)


def _vision(name: str, class_name: str, *, auto_class: str = "AutoModelForImageClassification",
            any_size: bool = False, **kwargs: Any) -> ZooEntry:
    return ZooEntry(name=name, family="vision", auto_class=auto_class,
                    config=functools.partial(_config, class_name, **kwargs),
                    inputs=_any_size_image_inputs if any_size else _image_inputs, image_size_varies=any_size)


def _vlm(name: str, class_name: str, inputs: Callable[[Any, int, int], dict[str, torch.Tensor]], *,
         forward: Callable[[Any, int, int], dict[str, torch.Tensor]] | None = None, **kwargs: Any) -> ZooEntry:
    return ZooEntry(name=name, family="vision-language", auto_class="AutoModelForImageTextToText",
                    config=functools.partial(_config, class_name, **kwargs), inputs=inputs, generative=True,
                    forward=forward)


def _siglip_vision(**kwargs: Any) -> dict[str, Any]:
    return {"model_type": "siglip_vision_model", **_VIT, **kwargs}


def _text(model_type: str, **kwargs: Any) -> dict[str, Any]:
    return {"model_type": model_type, **_LLM, **kwargs}


_DECODERS = (
    ZooEntry(name="llama", family="decoder", auto_class="AutoModelForCausalLM", config=_llama, inputs=_token_inputs,
             generative=True),
    ZooEntry(name="qwen3", family="decoder", auto_class="AutoModelForCausalLM", config=_qwen3, inputs=_token_inputs,
             generative=True),
    _decoder("mistral", "MistralConfig", **_LLM, sliding_window=4),  # a window shorter than the prompts
    _decoder("qwen2", "Qwen2Config", **_LLM),  # q/k/v biases
    _decoder("gemma", "GemmaConfig", **_LLM, head_dim=16),  # scaled embeddings, (1 + w) RMSNorm
    # Soft-capped attention logits and final logits, alternating sliding-window (4) and global layers.
    _decoder("gemma2", "Gemma2Config", **_LLM, head_dim=16, sliding_window=4, attn_logit_softcapping=50.0,
             final_logit_softcapping=30.0),
    # Query/key norms, local (sliding 4, own rope base) and global layers.
    _decoder("gemma3_text", "Gemma3TextConfig", **_LLM, head_dim=16, sliding_window=4,
             layer_types=["sliding_attention", "full_attention"]),
    _decoder("phi3", "Phi3Config", **_LLM, pad_token_id=0, bos_token_id=1, eos_token_id=2),  # fused qkv and gate_up projections
    _decoder("gpt2", "GPT2Config", vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=256,
             bos_token_id=1, eos_token_id=2, initializer_range=0.2),  # learned positions
    # Partial rotary (a quarter of each head), parallel residual.
    _decoder("gpt_neox", "GPTNeoXConfig", **_ENCODER, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25}),
    _decoder("gptj", "GPTJConfig", vocab_size=256, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256,
             bos_token_id=1, eos_token_id=2, initializer_range=0.2),
    # Learned positions offset by 2, computed from the attention mask.
    _decoder("opt", "OPTConfig", vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
             word_embed_proj_dim=64, max_position_embeddings=256, init_std=0.2),
    # ALiBi position biases instead of rotary, multi-query attention, parallel attention and MLP.
    _decoder("falcon", "FalconConfig", vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             alibi=True, multi_query=True, parallel_attn=True, bias=True, new_decoder_architecture=False,
             initializer_range=0.2),
    _decoder("olmo2", "Olmo2Config", **_LLM, pad_token_id=0, bos_token_id=1, eos_token_id=2),  # query/key RMSNorm over all heads, post-norms
    # muP-style multipliers on embeddings, residuals, attention and logits.
    _decoder("granite", "GraniteConfig", **_LLM, embedding_multiplier=12.0, residual_multiplier=0.22,
             attention_multiplier=0.0625, logits_scaling=8.0),
    _decoder("smollm3", "SmolLM3Config", **_LLM, no_rope_layer_interval=2, pad_token_id=0, bos_token_id=1,
             eos_token_id=2),  # every 2nd layer without rotary (NoPE)
    # Mixture of experts: 4 experts, top-2 routing.
    _decoder("mixtral", "MixtralConfig", **_LLM, num_local_experts=4, num_experts_per_tok=2),
    # Mixture of experts with a gated shared expert.
    _decoder("qwen2_moe", "Qwen2MoeConfig", **_LLM, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=64),
)

_ENCODERS = (
    ZooEntry(name="bert", family="encoder", auto_class="AutoModel", config=_bert, inputs=_token_inputs),
    _encoder("roberta", "RobertaConfig", **_ENCODER, pad_token_id=1),  # positions offset past the padding index
    _encoder("xlm_roberta", "XLMRobertaConfig", **_ENCODER, pad_token_id=1),
    _encoder("distilbert", "DistilBertConfig", vocab_size=256, dim=64, hidden_dim=128, n_layers=2, n_heads=4,
             max_position_embeddings=128),
    # Disentangled relative attention (content-to-position and position-to-content), log buckets.
    _encoder("deberta_v2", "DebertaV2Config", **_ENCODER, relative_attention=True, position_buckets=8,
             pos_att_type=["p2c", "c2p"], max_relative_positions=16),
    _encoder("electra", "ElectraConfig", **_ENCODER, embedding_size=32),  # embeddings narrower than the encoder
    # Rotary, alternating global and local (window 4) attention, unpadding-free sdpa path.
    _encoder("modernbert", "ModernBertConfig", **_ENCODER, local_attention=4,
             layer_types=["full_attention", "sliding_attention"], pad_token_id=0, eos_token_id=2, bos_token_id=1,
             cls_token_id=1, sep_token_id=2),
    # The text towers of CLIP (causal mask, pooled at the end-of-text token) and SigLIP (pooled at the last token).
    _encoder("clip_text", "CLIPTextConfig", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, max_position_embeddings=64, projection_dim=32, bos_token_id=1, eos_token_id=2),
    ZooEntry(name="siglip_text", family="encoder", auto_class="SiglipTextModel", inputs=_token_inputs,
             config=functools.partial(_config, "SiglipTextConfig", vocab_size=256, hidden_size=32, intermediate_size=64,
             num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)),
)

_VISION = (
    ZooEntry(name="vit", family="vision", auto_class="AutoModelForImageClassification", config=_vit,
             inputs=_image_inputs),
    _vision("deit", "DeiTConfig", **_VIT, num_labels=10, architectures=["DeiTForImageClassification"]),  # class and distillation tokens
    _vision("convnext", "ConvNextConfig", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10, any_size=True),
    _vision("resnet", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
            num_labels=10, any_size=True),
    # Shifted windows of 2x2 patches over an 8x8 patch grid, patch merging between stages.
    _vision("swin", "SwinConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
            window_size=2, num_labels=10),
    # Interpolated position embeddings (any image size), layer scale.
    _vision("dinov2", "Dinov2Config", **{k: v for k, v in _VIT.items() if k != "intermediate_size"}, num_labels=10,
            any_size=True),
    _vision("clip_vision", "CLIPVisionConfig", auto_class="AutoModel", **_VIT, projection_dim=32),
    _vision("siglip_vision", "SiglipVisionConfig", auto_class="AutoModel", **_VIT),  # attention-pooling head
)

_ENCODER_DECODERS = (
    ZooEntry(name="t5", family="encoder-decoder", auto_class="AutoModelForSeq2SeqLM", config=_t5, inputs=_token_inputs,
             generative=True),
    ZooEntry(name="whisper", family="encoder-decoder", auto_class="AutoModelForSpeechSeq2Seq", config=_whisper,
             inputs=_audio_features, generative=True),
    _seq2seq("bart", "BartConfig", **_SEQ2SEQ, pad_token_id=1, bos_token_id=0, eos_token_id=2,
             decoder_start_token_id=2, forced_eos_token_id=None, init_std=0.5),
    # Sinusoidal positions, scaled embeddings, a final logits bias; decoding starts from the pad token.
    _seq2seq("marian", "MarianConfig", **_SEQ2SEQ, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1,
             forced_eos_token_id=None, init_std=0.5),
)

_STATE_SPACE = (
    ZooEntry(name="mamba", family="state-space", auto_class="AutoModelForCausalLM", config=_mamba, inputs=_token_inputs,
             generative=True),
    ZooEntry(name="mamba2", family="state-space", auto_class="AutoModelForCausalLM", config=_mamba2, inputs=_token_inputs,
             generative=True),
    ZooEntry(name="bamba", family="state-space", auto_class="AutoModelForCausalLM", config=_bamba, inputs=_token_inputs,
             generative=True),
)

_AUDIO_ENCODERS = (
    _audio("wav2vec2", "Wav2Vec2Config", **_AUDIO),
    _audio("hubert", "HubertConfig", **_AUDIO),
)

_VISION_LANGUAGE = (
    ZooEntry(name="llava", family="vision-language", auto_class="AutoModelForImageTextToText", config=_llava,
             inputs=_llava_inputs, generative=True),
    # Multimodal rotary positions (t, h, w sections), 2x2 patch merger, 3D patches.
    _vlm("qwen2_vl", "Qwen2VLConfig", _qwen_vl_inputs, forward=_qwen_vl_forward, image_token_id=_IMAGE, video_token_id=_BOI - 2,
         vision_start_token_id=_BOI, vision_end_token_id=_EOI,
         text_config=_text("qwen2_vl_text", head_dim=16, bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}),
         vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                        "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2}),
    # As Qwen2-VL plus windowed vision attention with full-attention blocks.
    _vlm("qwen2_5_vl", "Qwen2_5_VLConfig", _qwen_vl_inputs, forward=_qwen_vl_forward, image_token_id=_IMAGE, video_token_id=_BOI - 2,
         vision_start_token_id=_BOI, vision_end_token_id=_EOI,
         text_config=_text("qwen2_5_vl_text", head_dim=16, bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}),
         vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                        "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 8,
                        "fullatt_block_indexes": [1]}),
    # Pixel-shuffle connector (scale factor 2): 16 patches become 4 image tokens.
    _vlm("idefics3", "Idefics3Config", _pooled_image_inputs, image_token_id=_IMAGE, scale_factor=2,
         vision_config={"model_type": "idefics3_vision", **_VIT}, text_config=_text("llama")),
    _vlm("smolvlm", "SmolVLMConfig", _pooled_image_inputs, image_token_id=_IMAGE, scale_factor=2,
         vision_config={"model_type": "smolvlm_vision", **_VIT}, text_config=_text("llama")),
    # A SigLIP tower, a linear projector, a Gemma decoder; every patch is an image token.
    _vlm("paligemma", "PaliGemmaConfig", _prefix_lm_inputs, image_token_index=_IMAGE, projection_dim=64,
         vision_config=_siglip_vision(projection_dim=64), text_config=_text("gemma", head_dim=16)),
    # A SigLIP tower average-pooled to 4 tokens per image, bidirectional attention over image tokens.
    _vlm("gemma3", "Gemma3Config", _image_block_inputs, image_token_index=_IMAGE, boi_token_index=_BOI,
         eoi_token_index=_EOI, mm_tokens_per_image=4, vision_config=_siglip_vision(),
         text_config=_text("gemma3_text", head_dim=16, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention"])),
)

ENTRIES: Mapping[str, ZooEntry] = MappingProxyType(
    {
        entry.name: entry
        for entry in (*_DECODERS, *_ENCODERS, *_VISION, *_ENCODER_DECODERS, *_STATE_SPACE, *_AUDIO_ENCODERS,
                      *_VISION_LANGUAGE)
    }
)


def entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``: a hand-made one, or a generated ``<task>:<model_type>`` one.

    Generated entries (``causal-lm:llama``, ``ctc:hubert`` ...: every model type of transformers' auto mappings for
    the tasks of ``hfx._zoo_generated.TASKS``) are made when asked for, from the type's default config shrunk the
    way transformers' tests do; ``KeyError`` lists the known hand-made names.

    Example:
        >>> entry("causal-lm:gpt2").auto_class
        'GPT2LMHeadModel'
    """
    if name in ENTRIES:
        return ENTRIES[name]
    if ":" in name:
        return _generated_entry(name)
    msg = f"hfx.zoo has no {name!r}; known: {sorted(ENTRIES)} and generated <task>:<model_type> names"
    raise KeyError(msg)


@functools.cache
def _generated_entry(name: str) -> ZooEntry:
    from hfx import _zoo_generated

    return ZooEntry(**_zoo_generated.entry_fields(name))


def generated_names(tasks: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The generated entries' names (``<task>:<model_type>``) for ``tasks`` (default: all), from this transformers."""
    from hfx import _zoo_generated

    return _zoo_generated.names(tasks)


def sample(seed: int, *, census_results: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One eager-runnable generated entry per task for ``seed``, rotating with it: what CI runs for that seed.

    ``census_results`` (``{name: {"status": ...}}``) defaults to the stored census
    (``benchmarks/results/zoo-census.json``); see ``hfx._zoo_generated.sample``.

    Example:
        >>> sample(0, census_results={"ctc:hubert": {"status": "ok"}, "ctc:sew": {"status": "eager"}})
        ['ctc:hubert']
    """
    from hfx import _zoo_generated

    return _zoo_generated.sample(seed, census_results=census_results)


def build(name: str = DEFAULT, *, seed: int = 0) -> torch.nn.Module:
    """A tiny random-weight model of architecture ``name``, in eval mode, built without a download.

    A generated entry's parameters that its model's init leaves all zeros get small random values, so that
    a zeroed MoE router does not rank exactly tied experts (``_perturb_zero_parameters``), and BatchNorms
    its init scales near zero get a scale near one (``_batch_norms_at_unit_scale``).
    """
    import transformers

    spec = entry(name)
    torch.manual_seed(seed)
    auto = getattr(transformers, spec.auto_class)
    # An Auto class builds from a config; a concrete class (a tower no Auto class maps) takes it directly.
    model = auto.from_config(spec.config()) if hasattr(auto, "from_config") else auto(spec.config())
    if ":" in name:
        _perturb_zero_parameters(model, seed=seed)
        _batch_norms_at_unit_scale(model, seed=seed)
    return model.eval()


def _perturb_zero_parameters(model: torch.nn.Module, *, seed: int) -> None:
    """Give each floating parameter of ``model`` that is all zeros small random values (normal, std 0.02).

    A generated entry keeps its model's own init, and some models zero their MoE router (AFMoE's
    ``router.gate``, ERNIE 4.5 MoE's ``gate``): every expert then scores the same, and top-k chooses among
    exact ties, whose order no runtime defines alike (ONNX's ``TopK`` takes the lower index, torch's CPU
    ``topk`` promises none). The runtimes' logits then differ from eager's by the experts picked, not by
    the export. A trained checkpoint has no such ties.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.numel() > 1 and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.02)


# A BatchNorm scale below this everywhere is an init's near-zero draw, not a normalisation's unit scale.
_NEAR_ZERO_SCALE = 0.1


def _batch_norms_at_unit_scale(model: torch.nn.Module, *, seed: int) -> None:
    """Give each BatchNorm of ``model`` whose scale its init draws near zero a scale near one (1 + normal, std 0.02).

    Model pattern: RT-DETR's ``_init_weights`` (and the models built from it: RT-DETR v2, D-FINE,
    PP-DocLayout) draws BatchNorm scales from N(0, ``initializer_range``) = N(0, 0.01): each norm shrinks the
    signal a hundredfold, so after a few layers a random image's features at every position of a level are
    equal in float32, and the encoder's top-k queries choose among exact ties (7 distinct scores among 21
    positions at 32 px), in an order no two runtimes share. A trained checkpoint has no such ties.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and weight is not None \
                    and weight.abs().max() < _NEAR_ZERO_SCALE:  # noqa: SLF001 - BatchNorm1d/2d/3d's one base
                weight.copy_(1 + torch.randn(weight.shape, generator=generator, dtype=weight.dtype) * 0.02)


def inputs(name: str = DEFAULT, *, batch: int = 2, sequence: int = 7) -> dict[str, torch.Tensor]:
    """Example inputs for ``name`` of the given batch size and sequence length."""
    spec = entry(name)
    return spec.inputs(spec.config(), batch, sequence)


def names(*, family: str | None = None, generative: bool | None = None) -> tuple[str, ...]:
    """The zoo's architecture names, optionally only one ``family`` or only (non-)generative ones.

    Example:
        >>> "gemma2" in names(family="decoder", generative=True)
        True
    """
    return tuple(
        name for name, spec in ENTRIES.items()
        if (family is None or spec.family == family) and (generative is None or spec.generative == generative)
    )


def forward_inputs(name: str = DEFAULT, *, batch: int = 2, sequence: int = 7) -> dict[str, torch.Tensor]:
    """Inputs for one forward call: ``inputs(...)``, plus ``decoder_input_ids`` for encoder-decoders.

    ``inputs`` are what ``generate`` takes; a seq2seq forward also needs the decoder's
    tokens, here the start token then ``sequence // 2`` random ids. Packed-image models
    (Qwen2-VL, Qwen2.5-VL) get images that grow with ``sequence`` and the inputs
    ``hfx.vision_inputs`` computes for them (a whole-forward graph takes those).

    Example:
        >>> sorted(forward_inputs("t5", batch=2, sequence=6))
        ['attention_mask', 'decoder_input_ids', 'input_ids']
    """
    spec = entry(name)
    config = spec.config()
    values = (spec.forward or spec.inputs)(config, batch, sequence)
    if spec.family == "encoder-decoder":
        generator = torch.Generator().manual_seed(batch * 1000 + sequence + 1)
        decoder = torch.randint(3, config.vocab_size, (batch, sequence // 2 + 1), generator=generator)
        decoder[:, 0] = config.decoder_start_token_id
        values["decoder_input_ids"] = decoder
    return values


# Text the tokenizer is trained on: a fixed corpus, so its vocabulary is the same on every machine.
_TOKENIZER_CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "hello world, export once and run everywhere",
    "a tiny tokenizer for tests, examples and the command line",
    "models speak in tokens: numbers, words and punctuation!",
)


@functools.cache
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Llama's own layout: "▁" marks a space, BPE over the whole text, <unk> <s> </s> first (ids 0, 1, 2,
    # the special tokens of every zoo LlamaConfig).
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # Trained on words and punctuation apart, as SentencePiece learns Llama's pieces: ONNX Runtime GenAI's
    # tokenizer splits there before its BPE, so merges across a "▁" or a comma would tokenize otherwise.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("▁", behavior="merged_with_next"), pre_tokenizers.Punctuation()]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(_TOKENIZER_CORPUS * 8, trainer)
    tokenizer.pre_tokenizer = None
    return tokenizer.to_str()


def tokenizer() -> Any:
    """A tiny Llama-style BPE tokenizer, trained in-process on a fixed corpus (no download).

    Its vocabulary (under 200 ids) fits every zoo text model's 256-token embedding;
    ``<unk>``, ``<s>`` and ``</s>`` are ids 0, 1 and 2, the special tokens of the zoo's
    Llama. Use it where a consumer needs a real tokenizer next to a zoo model.

    Example:
        >>> ids = tokenizer()("hello world")["input_ids"]
        >>> tokenizer().decode(ids)
        'hello world'
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>", padding_side="left",
    )
