"""Tiny random-weight models built from configs (no download), with input builders.

Used by the tests, the examples and the command line's default model.

Example:
    >>> from hfx import zoo
    >>> model = zoo.build("llama")
    >>> sorted(zoo.inputs("llama", batch=2, sequence=5))
    ['attention_mask', 'input_ids']
"""

from __future__ import annotations

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


def _audio_features(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Log-mel features; Whisper's encoder takes exactly ``2 * max_source_positions`` frames."""
    del sequence
    generator = torch.Generator().manual_seed(batch)
    frames = 2 * config.max_source_positions
    return {"input_features": torch.randn(batch, config.num_mel_bins, frames, generator=generator)}


def _llava_inputs(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """An image and a prompt: image placeholder tokens, then text; row 0 left-padded when batch > 1."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    vision = config.vision_config
    image_tokens = (vision.image_size // vision.patch_size) ** 2
    text = torch.randint(3, config.text_config.vocab_size - 1, (batch, sequence), generator=generator)
    ids = torch.cat([torch.full((batch, image_tokens), config.image_token_id), text], dim=1)
    mask = torch.ones_like(ids)
    pad = min(2, sequence - 1) if batch > 1 else 0
    if pad:
        ids[0] = torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[0, :-pad]])
        mask[0, :pad] = 0
    pixels = torch.randn(batch, vision.num_channels, vision.image_size, vision.image_size, generator=generator)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


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


ENTRIES: Mapping[str, ZooEntry] = MappingProxyType(
    {
        entry.name: entry
        for entry in (
            ZooEntry(name="llama", family="decoder", auto_class="AutoModelForCausalLM", config=_llama, inputs=_token_inputs),
            ZooEntry(name="qwen3", family="decoder", auto_class="AutoModelForCausalLM", config=_qwen3, inputs=_token_inputs),
            ZooEntry(name="bert", family="encoder", auto_class="AutoModel", config=_bert, inputs=_token_inputs),
            ZooEntry(name="vit", family="vision", auto_class="AutoModelForImageClassification", config=_vit, inputs=_image_inputs),
            ZooEntry(name="t5", family="encoder-decoder", auto_class="AutoModelForSeq2SeqLM", config=_t5, inputs=_token_inputs),
            ZooEntry(name="whisper", family="encoder-decoder", auto_class="AutoModelForSpeechSeq2Seq", config=_whisper,
                     inputs=_audio_features),
            ZooEntry(name="llava", family="vision-language", auto_class="AutoModelForImageTextToText", config=_llava,
                     inputs=_llava_inputs),
            ZooEntry(name="mamba", family="decoder", auto_class="AutoModelForCausalLM", config=_mamba, inputs=_token_inputs),
            ZooEntry(name="mamba2", family="decoder", auto_class="AutoModelForCausalLM", config=_mamba2, inputs=_token_inputs),
            ZooEntry(name="bamba", family="decoder", auto_class="AutoModelForCausalLM", config=_bamba, inputs=_token_inputs),
        )
    }
)


def entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``; ``KeyError`` lists the known names."""
    if name not in ENTRIES:
        msg = f"hfx.zoo has no {name!r}; known: {sorted(ENTRIES)}"
        raise KeyError(msg)
    return ENTRIES[name]


def build(name: str = DEFAULT, *, seed: int = 0) -> torch.nn.Module:
    """A tiny random-weight model of architecture ``name``, in eval mode, built without a download."""
    import transformers

    spec = entry(name)
    torch.manual_seed(seed)
    auto = getattr(transformers, spec.auto_class)
    return auto.from_config(spec.config()).eval()


def inputs(name: str = DEFAULT, *, batch: int = 2, sequence: int = 7) -> dict[str, torch.Tensor]:
    """Example inputs for ``name`` of the given batch size and sequence length."""
    spec = entry(name)
    return spec.inputs(spec.config(), batch, sequence)
