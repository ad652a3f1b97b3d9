"""What the consumers share: the refusal message, the text-decoder check, the model's config files."""

from __future__ import annotations

import json
from pathlib import Path

from hfx._records import Components


def refusal(consumer: str, reason: str, todo: str) -> ValueError:
    """The ``ValueError`` a consumer raises for a model it cannot take: the consumer, the reason, what to do."""
    return ValueError(f"package for {consumer}: {reason}. {todo}")


def check_text_decoder(programs: Components, *, consumer: str, pipeline: str) -> None:
    """Refuse an encoder-decoder or a multimodal model: ``pipeline`` runs text decoders only."""
    meta = programs.meta
    if meta.generation.is_encoder_decoder or meta.roles.feature_encoders:
        kind = "an encoder-decoder" if meta.generation.is_encoder_decoder else "a multimodal model"
        raise refusal(consumer, f"{meta.model.class_name or 'the model'} is {kind}; {pipeline} runs text decoders only",
                      "Package a decoder-only language model (Llama, Qwen, Mistral, Gemma, Phi-3 ...).")


def write_configs(programs: Components, staging: Path) -> None:
    """Write the model's ``config.json`` and ``generation_config.json`` (as ``decompose`` recorded them) into ``staging``."""
    meta = programs.meta
    (staging / "config.json").write_text(json.dumps(dict(meta.model.config), indent=2))
    (staging / "generation_config.json").write_text(json.dumps(dict(meta.generation.config), indent=2))
