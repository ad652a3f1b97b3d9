"""Inputs for a generated entry: the task's and the model class's main input, built for the tiny config."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from hfx._zoo_generated._reading import find, is_int, read, text_config
from hfx._zoo_generated._shrink import task_config
from hfx._zoo_generated._sizes import IMAGE, PATCH, TEXT_HIGH, VOCAB
from hfx._zoo_generated._tasks import model_class, split_name, task_mapping


def _generator(batch: int, sequence: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(batch * 1000 + sequence + salt)


def _tokens(config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Token ids below the special tokens, with a left-padded first row (when batch > 1), so masks matter."""
    vocab = read(text_config(config), "vocab_size") or find(config, "vocab_size") or VOCAB
    ids = torch.randint(3, max(4, min(vocab, TEXT_HIGH)), (batch, sequence), generator=_generator(batch, sequence))
    mask = torch.ones(batch, sequence, dtype=torch.long)
    if batch > 1 and sequence > 2:
        mask[0, : sequence // 3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _side(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    if isinstance(value, Mapping):
        return int(value.get("height", IMAGE)), int(value.get("width", IMAGE))
    return int(value), int(value)


def _pixels(config: Any, batch: int, *, video: bool = False) -> torch.Tensor:
    """Random images at the config's image size (32 px when it names none), channels first; with ``video``, clips
    of the config's ``num_frames`` frames (VideoMAE, ViViT), when it counts them."""
    height, width = _side(find(config, "image_size", "img_size") or IMAGE)
    channels = find(config, "num_channels", "in_channels", "in_chans") or 3
    frames = find(config, "num_frames") if video else None
    shape = (batch, frames, channels, height, width) if is_int(frames) else (batch, channels, height, width)
    return torch.randn(*shape, generator=_generator(batch, 0, salt=1))


def _waveform_length(config: Any, frames: int) -> int:
    """Samples that the convolutional feature encoder turns into ``frames`` frames (kernels and strides inverted)."""
    kernels, strides = find(config, "conv_kernel"), find(config, "conv_stride")
    if not (isinstance(kernels, (list, tuple)) and isinstance(strides, (list, tuple))):
        return 320 * frames + 80
    length = frames
    for kernel, stride in reversed(list(zip(kernels, strides, strict=False))):
        length = (length - 1) * stride + kernel
    return length


def _features(config: Any, batch: int, sequence: int) -> torch.Tensor:
    """Log-mel-like features: Whisper-like encoders take exactly ``2 * max_source_positions`` frames, channels first."""
    bins = find(config, "feature_projection_input_dim", "num_mel_bins", "input_feat_per_channel", "feature_size",
                 "n_mels", "input_dim") or 80
    positions = find(config, "max_source_positions")
    generator = _generator(batch, sequence, salt=2)
    if positions is not None and find(config, "num_mel_bins") is not None:
        return torch.randn(batch, bins, 2 * positions, generator=generator)
    return torch.randn(batch, 8 * sequence + 16, bins, generator=generator)


# How images reach a model, tried in order: channels-first batches, the same with each image's size (LLaVA-NeXT,
# Pixtral), one image axis more (Idefics 3: batch x images x C x H x W); or flattened patches with a (t, h, w)
# grid per image (the Qwen2-VL family, when the model takes ``image_grid_thw``).
_LAYOUTS = ("images", "images+sizes", "images-per-prompt")


def _image_inputs(name: str, config: Any, batch: int, layout: str) -> dict[str, torch.Tensor]:
    """The image inputs the model's forward takes, for ``batch`` prompts of one image each, in ``layout``."""
    accepted = inspect.signature(model_class(name).forward).parameters
    if {"image_grid_thw", "grid_thw"} & set(accepted):
        vision = read(config, "vision_config") or config
        patch, merge = read(vision, "patch_size") or PATCH, read(vision, "spatial_merge_size") or 1
        temporal = read(vision, "temporal_patch_size") or 1
        channels = read(vision, "in_channels") or read(vision, "num_channels") or 3
        side = max(merge, _side(read(vision, "image_size") or IMAGE)[0] // patch // merge * merge)
        patches = torch.randn(batch * side * side, channels * temporal * patch * patch,
                              generator=_generator(batch, 0, salt=1))
        return {"pixel_values": patches, "image_grid_thw": torch.tensor([[1, side, side]] * batch)}
    pixels = _pixels(config, batch)
    values = {"pixel_values": pixels[:, None] if layout == "images-per-prompt" else pixels}
    if layout == "images+sizes":
        values["image_sizes"] = torch.tensor([list(pixels.shape[-2:])] * batch)
    return values


@functools.cache
def _image_plan(name: str) -> tuple[str, int]:
    """``(layout, tokens)``: the image layout the model's ``get_image_features`` accepts (tried in ``_LAYOUTS``
    order) and how many features it gives one image, which is how many placeholder tokens a prompt needs; the
    config's ``num_query_tokens`` when the method cannot be called alone (InstructBLIP's needs the instruction)."""
    config = task_config(name)
    torch.manual_seed(0)
    model = model_class(name)(config).eval()
    owner = next((m for m in (getattr(model, "model", None), model) if hasattr(m, "get_image_features")), None)
    failures: list[Exception] = []
    if owner is None:
        failures.append(NotImplementedError(f"{type(model).__name__} has no get_image_features to count image tokens"))
    accepted = inspect.signature(owner.get_image_features).parameters if owner is not None else {}
    for layout in _LAYOUTS:
        values = _image_inputs(name, config, 1, layout)
        if not set(values) <= set(accepted):
            continue
        try:
            with torch.no_grad():
                output = owner.get_image_features(**values)
        except (ValueError, RuntimeError, TypeError, IndexError) as exc:
            failures.append(exc)
            continue
        features = getattr(output, "pooler_output", None)
        features = output if features is None else features
        parts = features if isinstance(features, (list, tuple)) else [features]
        return layout, sum(f.reshape(-1, f.shape[-1]).shape[0] for f in parts)
    stated = find(config, "num_query_tokens")  # InstructBLIP: the Q-Former's queries, one token each
    if is_int(stated):
        return _LAYOUTS[0], stated
    raise failures[0]


def _image_prompt(name: str, config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """An image and a prompt: the image's placeholder tokens (as many as the vision tower gives one image, between
    the vision start and end tokens where the config has them), then text; row 0 left-padded when batch > 1."""
    image = find(config, "image_token_id", "image_token_index")
    if image is None:
        msg = "the config names no image token (image_token_id / image_token_index)"
        raise NotImplementedError(msg)
    layout, count = _image_plan(name)
    block = [image] * count
    start, end = find(config, "vision_start_token_id"), find(config, "vision_end_token_id")
    if is_int(start) and is_int(end):
        block = [start, *block, end]
    text = _tokens(config, batch, sequence)
    ids = torch.cat([torch.tensor([block] * batch), text["input_ids"]], dim=1)
    mask = torch.ones_like(ids)
    pad = min(2, sequence - 1) if batch > 1 else 0
    if pad:
        ids[0] = torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[0, :-pad]])
        mask[0, :pad] = 0
    values = {"input_ids": ids, "attention_mask": mask, **_image_inputs(name, config, batch, layout)}
    accepted = inspect.signature(model_class(name).forward).parameters
    if "mm_token_type_ids" in accepted:  # where M-RoPE puts the image's (t, h, w) positions
        values["mm_token_type_ids"] = (ids == image).long()
    if "qformer_input_ids" in accepted:  # InstructBLIP: the instruction, for the Q-Former too
        qformer = _tokens(read(config, "qformer_config") or config, batch, sequence)
        values.update(qformer_input_ids=qformer["input_ids"], qformer_attention_mask=qformer["attention_mask"])
    return values


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _main_inputs(name: str, config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """The model class's main input (``main_input_name``) built for the config, plus its attention mask."""
    cls = model_class(name)
    main = cls.main_input_name
    accepted = inspect.signature(cls.forward).parameters
    named = [p for p in accepted if p != "self" and accepted[p].kind in _NAMED]
    if main not in accepted and named:  # PreTrainedModel's default "input_ids", on a tower that takes pixel_values
        main = named[0]
    if main == "inputs":  # Perceiver: one input whatever the modality, the task's
        modality = _TASK_INPUT.get(split_name(name)[0].name, "input_ids")
        values = _main_inputs_of(name, config, batch, sequence, modality, video=False)
        values["inputs"] = values.pop(modality)
        return {k: v for k, v in values.items() if k in accepted}
    return {k: v for k, v in _main_inputs_of(name, config, batch, sequence, main).items()
            if k in accepted or k == main}


# The modality of a task whose model class takes a generic ``inputs`` (Perceiver).
_TASK_INPUT: Mapping[str, str] = MappingProxyType({
    "image-classification": "pixel_values", "ctc": "input_values", "speech-seq2seq": "input_values",
})


def _main_inputs_of(name: str, config: Any, batch: int, sequence: int, main: str, *,
                    video: bool = True) -> dict[str, torch.Tensor]:
    accepted = inspect.signature(model_class(name).forward).parameters
    image = find(config, "image_token_id", "image_token_index")
    prompts = main == "input_ids" or (main == "pixel_values" and "input_ids" in accepted)
    if prompts and "pixel_values" in accepted and image is not None:
        return _image_prompt(name, config, batch, sequence)
    needs_text = "input_ids" in accepted and accepted["input_ids"].default is inspect.Parameter.empty
    if main == "pixel_values" and (needs_text or (split_name(name)[0].name == "image-text-to-text"
                                                  and "input_ids" in accepted)):
        # BLIP-2-like: the image's query tokens go before the prompt's embeddings, no placeholder in the ids;
        # Grounding DINO: the text names what to detect.
        values = {**_tokens(config, batch, sequence), "pixel_values": _pixels(config, batch)}
        if "qformer_input_ids" in accepted:  # InstructBLIP: the instruction, for the Q-Former too
            qformer = _tokens(read(config, "qformer_config") or config, batch, sequence)
            values.update(qformer_input_ids=qformer["input_ids"], qformer_attention_mask=qformer["attention_mask"])
        return values
    if main == "input_ids":
        values = _tokens(config, batch, sequence)
        eos = find(config, "eos_token_id")
        classifies = split_name(name)[0].name == "sequence-classification"
        if classifies and read(config, "is_encoder_decoder") and is_int(eos):
            values["input_ids"][:, -1] = eos  # BART-like classifiers read each row's last end-of-sequence token
        if split_name(name)[0].name == "feature-extraction" and "pixel_values" in accepted:
            values["pixel_values"] = _pixels(config, batch)  # dual encoders (CLIP, ALIGN): text and image
    elif main == "pixel_values" and {"grid_thw", "image_grid_thw"} & set(accepted):
        values = _image_inputs(name, config, batch, "images")  # a packed-patch vision tower (Qwen2-VL-like)
        if "grid_thw" in accepted:
            values["grid_thw"] = values.pop("image_grid_thw")
    elif main == "pixel_values":
        values = {"pixel_values": _pixels(config, batch, video=video)}
        size, patch = find(config, "image_size"), find(config, "patch_size")
        if "noise" in accepted and find(config, "mask_ratio") and is_int(size) and is_int(patch):
            # ViT-MAE masks a random subset of patches, drawn with torch.rand unless given: eager and a program
            # only agree on the same draw, so the draw is an input
            values["noise"] = torch.rand(batch, (size // patch) ** 2, generator=_generator(batch, sequence, salt=5))
    elif main == "input_values":
        samples = _waveform_length(config, sequence)
        channels = find(config, "audio_channels")  # audio codecs (EnCodec, Mimi) take channels x samples
        shape = (batch, channels, samples) if is_int(channels) else (batch, samples)
        values = {"input_values": torch.randn(*shape, generator=_generator(batch, sequence, salt=3))}
    elif main == "input_features":
        values = {"input_features": _features(config, batch, sequence)}
    else:
        msg = f"{model_class(name).__name__} takes {main!r} first: the generic builder makes input_ids, " \
              "pixel_values, input_values and input_features"
        raise NotImplementedError(msg)
    return values


def generate_inputs(name: str, config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """What ``generate`` (or one forward of a non-generative model) takes for generated entry ``name``."""
    return _main_inputs(name, config, batch, sequence)


def forward_inputs(name: str, config: Any, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """One forward call's inputs: ``generate_inputs`` plus ``decoder_input_ids`` for an encoder-decoder."""
    values = _main_inputs(name, config, batch, sequence)
    accepted = inspect.signature(model_class(name).forward).parameters
    # BART-like sequence classifiers make their decoder's inputs from the input ids and read its last end token.
    classifies = split_name(name)[0].name == "sequence-classification"
    if "decoder_input_ids" in accepted and read(config, "is_encoder_decoder") and not classifies:
        decoder = text_config(config)
        vocab = read(decoder, "vocab_size") or VOCAB
        ids = torch.randint(3, max(4, min(vocab, TEXT_HIGH)), (batch, sequence // 2 + 1),
                            generator=_generator(batch, sequence, salt=4))
        start = next((v for v in (find(config, "decoder_start_token_id"), find(config, "pad_token_id"),
                                  find(config, "bos_token_id")) if is_int(v)), 0)
        ids[:, 0] = start
        values["decoder_input_ids"] = ids
    if ("image_grid_thw" in values and "input_ids" in values) or "grid_thw" in values:
        values.update(_packed_image_inputs(name, config, values))  # a packed-image model, or its tower alone
    return values


def _packed_image_inputs(name: str, config: Any, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``hfx.vision_inputs`` computes for a prompt with packed images (the Qwen2-VL family), as a user of a
    whole-forward export passes them (docs/generation.md): M-RoPE positions, the tower's patch positions and
    image boundaries. Computed on a weightless (``meta``) copy of the model."""
    from hfx._capture.vision_inputs import vision_inputs

    with torch.device("meta"):
        model = model_class(name)(config)
    return vision_inputs(model, dict(values))


def entry_fields(name: str, /) -> Mapping[str, Any]:
    """The fields of ``hfx.zoo.ZooEntry`` for generated entry ``name`` (``<task>:<model_type>``).

    Raises:
        KeyError: ``name`` is not a task and a model type of that task in this transformers.

    Example:
        >>> fields = entry_fields("causal-lm:llama")
        >>> (fields["family"], fields["auto_class"], fields["generative"])
        ('causal-lm', 'LlamaForCausalLM', True)
    """
    spec, _ = split_name(name)
    return MappingProxyType({
        # The concrete class, not the task's Auto class: a type whose config class the Auto mapping does not key
        # (a decoder sub-config) builds the same way.
        "name": name, "family": spec.name, "auto_class": task_mapping(spec.name)[split_name(name)[1]],
        "generative": spec.generative, "config": functools.partial(task_config, name),
        "inputs": functools.partial(generate_inputs, name),
        "forward": functools.partial(forward_inputs, name),
    })
