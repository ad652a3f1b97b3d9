"""What the packages of a text decoder share: the refusal, the checks (a text decoder, one graph for prompt and steps, inputs the pipeline feeds) and the config files."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from hfx._kept_positions import KEPT_INPUT
from hfx._records import Capture, Components, Exported


def refusal(consumer: str, reason: str, todo: str) -> ValueError:
    """The error of a package ``consumer`` cannot load: the consumer, the reason, what to do."""
    return ValueError(f"package for {consumer}: {reason}. {todo}")


def check_text_decoder(programs: Components, *, consumer: str, pipeline: str) -> None:
    """Refuse an encoder-decoder or a multimodal model: ``pipeline`` runs text decoders only."""
    meta = programs.meta
    if meta.generation.is_encoder_decoder or meta.roles.feature_encoders:
        kind = "an encoder-decoder" if meta.generation.is_encoder_decoder else "a multimodal model"
        raise refusal(consumer, f"{meta.model.class_name or 'the model'} is {kind}; {pipeline} runs text decoders only",
                      "Package a decoder-only language model (Llama, Qwen, Mistral, Gemma, Phi-3 ...).")


def decode_component(
    programs: Components,
    /,
    *,
    consumer: str,
    pipeline: str,
    fed: Collection[str],
    lower: Callable[[Any], Any],
    record: type,
) -> Any:
    """The one program of ``programs`` that prefills and decodes, as a ``record`` (``lower`` makes it from the others).

    Args:
        programs: the ``Components`` of ``decompose(multi_token_decode=True)``.
        consumer: the consumer's name, for the errors.
        pipeline: what the consumer runs the graph with (``"LLMPipeline"``), for the errors.
        fed: the inputs, besides the cache, the pipeline feeds.
        lower: ``Capture | Exported -> record``.
        record: the program record the consumer's files are written from.

    Raises:
        ValueError: the model is not a text decoder, its components are not one graph for
            prompt and steps, or the graph takes inputs the pipeline does not feed.
        TypeError: the decode component is a program of another runtime.
    """
    check_text_decoder(programs, consumer=consumer, pipeline=pipeline)
    if "decode" not in programs or "prefill" in programs:
        raise refusal(consumer, f"it needs one graph for the prompt and every step, got components {list(programs)}",
                      "Decompose with hfx.decompose(multi_token_decode=True).")
    decode = programs["decode"]
    if not isinstance(decode, Capture | Exported | record):
        msg = (f"package for {consumer}: the decode component is a {type(decode).__name__}; give Components of "
               f"Capture, Exported or {record.__name__} records")
        raise TypeError(msg)
    # logits_to_keep: taken out of the lowered graph by the writer (every_position, the stateful form)
    others = sorted(graph_arguments(decode) - set(fed) - {programs.meta.roles.cache_input or "past_key_values", KEPT_INPUT})
    if others:  # checked before the lowering, which is the slow part
        raise refusal(consumer, f"the decode graph takes {others}, which {pipeline} does not feed (it feeds "
                      f"{sorted(fed)})", "Capture the model with only input_ids and attention_mask.")
    return decode if isinstance(decode, record) else lower(decode)


def graph_arguments(record: Any) -> set[str]:
    """The keyword arguments a component's graph takes: a capture's tensors and caches (the rest become constants)."""
    from hfx._contract import input_keys
    from hfx._pytree import is_cache

    if isinstance(record, Capture):
        return {key for key, value in record.kwargs.items() if isinstance(value, torch.Tensor) or is_cache(value)}
    return set(input_keys(record.io))


def write_model_files(staging: Path, saved: Components, *, tokenizer: Any) -> None:
    """Write ``saved`` as hfx saves it (``hfx.json``) with the tokenizer files, ``config.json`` and ``generation_config.json``."""
    from hfx._save import write_saved

    write_saved(staging, saved, processor=tokenizer)
    tokenizer.save_pretrained(staging)
    write_configs(saved, staging)


def write_configs(programs: Components, staging: Path) -> None:
    """Write the model's ``config.json`` and ``generation_config.json`` (as ``decompose`` recorded them) into ``staging``."""
    meta = programs.meta
    (staging / "config.json").write_text(json.dumps(dict(meta.model.config), indent=2))
    (staging / "generation_config.json").write_text(json.dumps(dict(meta.generation.config), indent=2))
