"""The generation config an export carries, and transformers' own logits processors built from it.

``decompose`` saves the model's generation config with the components
(``GenerationSettings.config``). ``hfx.generate`` rebuilds it, applies the
caller's overrides as ``model.generate(**kwargs)`` does, and asks transformers
for the logits processors that config implies (forced BOS/EOS, suppressed
tokens, minimum length, repetition penalty, ``no_repeat_ngram_size``, bad
words, the sampling warpers), so the lean loop picks the tokens transformers
picks. What the lean loop cannot do (beam search, stopping strings, assisted
decoding ...) is an error that names the setting and points to ``hfx.as_model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Settings the lean loop cannot honour -> the values that mean "off". Each needs another search (beams,
# groups, contrastive), a tokenizer (stop strings), another model (assisted), more forwards (guidance) or
# constrained decoding.
_OFF = (None, False)
_LOOP_CANNOT = {
    "num_beams": (1, None), "num_beam_groups": (1, None), "num_return_sequences": (1, None),
    "guidance_scale": (1, 1.0, None), "penalty_alpha": (0, 0.0, None), "stop_strings": _OFF,
    "constraints": _OFF, "force_words_ids": _OFF, "prompt_lookup_num_tokens": _OFF, "dola_layers": _OFF,
    "token_healing": _OFF, "max_time": _OFF,
}
# Settings a model's own ``generate`` reads to build its prompt or processors (Whisper's language, task and
# timestamp tokens), which the lean loop does not rebuild.
_MODEL_OWN = ("forced_decoder_ids", "lang_to_id", "task_to_id", "no_timestamps_token_id", "is_multilingual")


def generation_config(settings: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """The saved generation config ``settings`` with ``overrides`` applied and checked by transformers.

    Raises:
        ValueError: an override transformers does not know, or a combination it refuses.
    """
    from transformers import GenerationConfig

    config = GenerationConfig.from_dict(dict(settings))
    unknown = sorted(key for key in overrides if not hasattr(config, key))
    if unknown:
        msg = f"generate: {unknown} are not generation settings (see transformers.GenerationConfig)"
        raise ValueError(msg)
    config.update(**overrides)
    try:
        config.validate(strict=True)
    except ValueError as exc:
        msg = f"generate: the generation settings do not fit together: {exc}"
        raise ValueError(msg) from exc
    return config


def refuse_what_the_loop_cannot_do(config: Any) -> None:
    """Raise ``ValueError`` naming each setting of ``config`` that ``hfx.generate``'s loop would ignore."""
    asked = {key: getattr(config, key, None) for key in _LOOP_CANNOT}
    asked = {key: value for key, value in asked.items() if value not in _LOOP_CANNOT[key]}
    asked.update({key: getattr(config, key) for key in _MODEL_OWN if getattr(config, key, None)})
    if asked:
        names = ", ".join(f"{key}={value!r}" for key, value in sorted(asked.items()))
        msg = (f"generate: the generation settings ask for {names}, which hfx.generate's greedy/sampling loop "
               "does not do. Run hfx.as_model(programs).generate(...) (transformers' own generate over the "
               "exported graphs), or override them (hfx.generate(..., settings={'num_beams': 1})).")
        raise ValueError(msg)


def lengths(config: Any, *, prompt_length: int, max_new_tokens: int) -> Any:
    """``config`` with ``max_length`` and ``min_length`` counted from ``prompt_length``, as ``model.generate`` sets them."""
    config.max_new_tokens = max_new_tokens
    config.max_length = max_new_tokens + prompt_length
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    return config


# Settings from which transformers' ``_get_logits_processor`` builds no processor: lengths, special tokens,
# the cache, what generate returns; and the sampling warpers' settings when the config does not sample.
_MAKE_NO_PROCESSOR = frozenset({
    "max_length", "max_new_tokens", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
    "use_cache", "cache_implementation", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate", "transformers_version", "_from_model_config",
})
_SAMPLING_ONLY = frozenset({"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
                            "top_h"})


def asks_for_no_processor(config: Any, *, is_encoder_decoder: bool) -> bool:
    """Whether transformers builds no logits processor for ``config``: it does not sample, and every setting
    that differs from ``GenerationConfig()``'s default is one that makes none.

    A setting not known here (one a newer transformers adds) answers ``False``: the caller asks transformers.
    An encoder-decoder without a start token answers ``False`` too (transformers refuses it, with its message).

    Example:
        >>> from transformers import GenerationConfig
        >>> asks_for_no_processor(GenerationConfig(eos_token_id=2, temperature=0.7), is_encoder_decoder=False)
        True
        >>> asks_for_no_processor(GenerationConfig(repetition_penalty=1.2), is_encoder_decoder=False)
        False
    """
    if config.do_sample or (is_encoder_decoder and config.decoder_start_token_id is None and config.bos_token_id is None):
        return False
    return set(config.to_diff_dict()) <= _MAKE_NO_PROCESSOR | _SAMPLING_ONLY


def logits_processors(config: Any, *, is_encoder_decoder: bool, prompt_length: int,
                      encoder_input_ids: torch.Tensor | None, mask: torch.Tensor | None) -> Any:
    """transformers' ``LogitsProcessorList`` for ``config``: what ``model.generate`` applies to each step's scores.

    An empty list when the config asks for none (``asks_for_no_processor``), without importing
    ``transformers.generation.utils``: a process that loads an export and generates greedily then
    does not import transformers' generation and model code (45 MB and 0.7 s at the first call,
    measured beside an ONNX program). Otherwise ``transformers_processors``.
    """
    if asks_for_no_processor(config, is_encoder_decoder=is_encoder_decoder):
        return []
    return transformers_processors(config, is_encoder_decoder=is_encoder_decoder, prompt_length=prompt_length,
                                   encoder_input_ids=encoder_input_ids, mask=mask)


def transformers_processors(config: Any, *, is_encoder_decoder: bool, prompt_length: int,
                            encoder_input_ids: torch.Tensor | None, mask: torch.Tensor | None) -> Any:
    """The list transformers builds for ``config``, by ``GenerationMixin._prepare_special_tokens`` and
    ``_get_logits_processor``, which read only the model config's ``is_encoder_decoder`` (and the vocabulary
    for watermarks).
    """
    from transformers import GenerationMixin, PretrainedConfig

    class _ConfigOnly(GenerationMixin):
        def __init__(self) -> None:
            self.config = PretrainedConfig(is_encoder_decoder=is_encoder_decoder)

    mask_key = "decoder_attention_mask" if is_encoder_decoder else "attention_mask"
    builder = _ConfigOnly()
    # The processors read the special tokens as tensors, which generate() prepares first.
    builder._prepare_special_tokens(config, mask is not None, device="cpu")
    return builder._get_logits_processor(
        config, input_ids_seq_length=prompt_length, encoder_input_ids=encoder_input_ids, device="cpu",
        model_kwargs={mask_key: mask} if mask is not None else {},
    )


def decoder_prompt(inputs: Mapping[str, Any], start: int, batch: int, *, from_input_ids: bool) -> torch.Tensor:
    """The decoder's first tokens, as transformers' ``generate`` takes them
    (``_prepare_decoder_input_ids_for_generation``): ``decoder_input_ids`` if given, else, ``from_input_ids``
    (a model whose main input is another: PP-FormulaNet's image), the ``input_ids``; each led by the start
    token. Otherwise the start token alone.

    Example:
        >>> decoder_prompt({"input_ids": torch.tensor([[7, 8]])}, 0, 1, from_input_ids=True).tolist()
        [[0, 7, 8]]
        >>> decoder_prompt({"input_ids": torch.tensor([[7, 8]])}, 0, 2, from_input_ids=False).tolist()
        [[0], [0]]
    """
    prompt = inputs.get("decoder_input_ids")
    if prompt is None and from_input_ids:
        prompt = inputs.get("input_ids")
    if prompt is None:
        return torch.full((batch, 1), start, dtype=torch.long)
    if (prompt[:, 0] != start).all():
        prompt = torch.cat([torch.full((prompt.shape[0], 1), start, dtype=prompt.dtype), prompt], dim=-1)
    return prompt
