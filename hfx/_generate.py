"""``generate``: the decode loop over exported graphs, on any runtime.

Given the ``Components`` that ``decompose`` made and a lowering turned into
programs (``Exported``, ``OnnxProgram``, ``PteProgram``, ``OvProgram``), it runs
the encoder once, the prefill once and the decode step per new token, building
each step's inputs the way ``transformers``' ``generate()`` does (position ids
from the mask, the mask grown by one, the cache handed back), so that greedy
decoding gives exactly the eager tokens. The decode steps are checked calls
until the loop knows how their sizes grow, then flat calls that hand the cache
from step to step in the runtime's own form (``hfx._flat_steps.DecodeSteps``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import torch
from toolz import curry
from torch.utils import _pytree as pytree

from hfx._capture.cross_cache import split_encoder_output, with_cross_cache
from hfx._capture.decompose import prompt_component, step_component
from hfx._capture.multimodal import feature_rows
from hfx._capture.positions import next_positions, prompt_positions, text_positions
from hfx._capture.vision_inputs import computed_vision_inputs
from hfx._contract import input_keys, load_spec
from hfx._errors import InputError, argument_error
from hfx._flat_steps import DecodeSteps, step_inputs
from hfx._generation_config import (
    decoder_prompt,
    generation_config,
    lengths,
    logits_processors,
    refuse_what_the_loop_cannot_do,
)
from hfx._kept_positions import KEPT_INPUT, last_position
from hfx._pytree import spec_caches
from hfx._records import Components, EncoderInputs
from hfx._upstream import cache_argument, output_cache

_UNSET: Any = object()


def initial_cache(program: Any, batch: int, key: str) -> Any:
    """The cache a program's first call takes, rebuilt from its spec: empty, or zeros for a static cache."""
    io = program.io
    leaves = []
    for spec in io.inputs:
        shape = [batch if dim == "batch" else (dim if isinstance(dim, int) else 0) for dim in spec.shape]
        leaves.append(torch.zeros(shape, dtype=getattr(torch, spec.dtype)))
    with spec_caches(io):
        _, kwargs = pytree.tree_unflatten(leaves, load_spec(io.in_spec))
    return kwargs[key] if key in kwargs else kwargs.get(cache_argument(kwargs))


def _position_sections(program: Any) -> int:
    """How many rows a program's ``position_ids`` have (M-RoPE sections), or 0 for one row per token."""
    spec = next((spec for spec in program.io.inputs if spec.name == "position_ids"), None)
    return int(spec.shape[0]) if spec is not None and len(spec.shape) == 3 and isinstance(spec.shape[0], int) else 0


def _picker(config: Any, *, encoder_decoder: bool, generator: torch.Generator | None, max_new_tokens: int,
            prompt_length: int, mask: torch.Tensor | None, encoder_input_ids: torch.Tensor | None = None) -> Any:
    """``pick(ids, logits) -> next token per row``, as ``model.generate`` picks it under ``config``.

    The scores go through transformers' own logits processors for ``config``
    (``hfx._generation_config.logits_processors``), then argmax, or a sample
    drawn with ``generator``. ``ids`` are the sequences so far (prompt and new tokens).
    """
    config = lengths(copy.deepcopy(config), prompt_length=prompt_length, max_new_tokens=max_new_tokens)
    processors = logits_processors(config, is_encoder_decoder=encoder_decoder, prompt_length=prompt_length,
                                   encoder_input_ids=encoder_input_ids, mask=mask)
    sample = bool(config.do_sample)

    def pick(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = logits[:, -1, :].float()
        if processors:
            scores = processors(ids, scores)
        if not sample:
            return scores.argmax(dim=-1)
        return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)

    return pick


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


@curry
def generate(
    inputs: Mapping[str, Any],
    programs: Components,
    /,
    *,
    max_new_tokens: int = 20,
    do_sample: bool = _UNSET,
    temperature: float = _UNSET,
    top_k: int | None = _UNSET,
    top_p: float | None = _UNSET,
    seed: int | None = None,
    eos_token_id: Any = _UNSET,
    pad_token_id: Any = _UNSET,
    settings: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Generate token ids with exported programs, like ``model.generate(**inputs)``.

    ``generate(prompt, max_new_tokens=8)`` alone is a stage ``programs -> token ids``:
    ``pipe(model, capture(inputs), decompose, lower_to_onnx, generate(prompt))``.

    The loop follows the generation config saved with the export (the model's
    ``generation_config`` when ``decompose`` ran) with the keyword arguments
    and ``settings`` applied over it, as ``model.generate(**kwargs)`` does, and scores every step
    with transformers' own logits processors for it: forced BOS/EOS, suppressed
    and begin-suppressed tokens, ``min_length`` / ``min_new_tokens``, repetition
    penalty, ``no_repeat_ngram_size``, bad words, and temperature / top-k / top-p
    when sampling. Greedy decoding then gives ``model.generate``'s tokens. What
    the loop cannot do (beam search, stopping strings, assisted decoding,
    Whisper's prompt tokens) is a ``ValueError`` naming the setting: run
    ``hfx.as_model(programs).generate(...)`` for those.

    Args:
        inputs: the prompt, the generate inputs (``input_ids``, ``attention_mask``,
            ``pixel_values``, ``input_features`` ...); not changed.
        programs: ``Components`` from ``decompose`` (then ``export`` or a lowering):
            ``decode`` plus ``prefill`` (or a multi-token ``decode`` alone), and
            ``encoder`` for encoder-decoder models; a multimodal model's encoders and
            the parts of its prefill (``embed_tokens``, ``language_model``, ``lm_head``,
            the language model taking the steps too, or a ``decode``); any runtime.
        max_new_tokens: how many tokens to add.
        do_sample: sample instead of taking the argmax (default: the saved config's).
        temperature: divides the logits before sampling (default: the saved config's).
        top_k: sample among the ``top_k`` most likely tokens only (default: the saved config's).
        top_p: sample among the most likely tokens whose probabilities add up to ``top_p``.
        seed: seeds the sampler (same seed, same tokens).
        eos_token_id: default to the model's generation config.
        pad_token_id: default to the model's generation config.
        settings: other ``transformers.GenerationConfig`` fields over the saved ones
            (``{"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "min_new_tokens": 4, "num_beams": 1}``).

    Returns:
        Token ids: the prompt plus the new tokens for decoder-only models, the
        decoder ids (from the start token) for encoder-decoder models. A row
        that reached EOS is padded with ``pad_token_id``, as in transformers.

    Raises:
        TypeError: ``inputs`` is not a mapping or ``programs`` not ``Components`` (the arguments swapped).
        InputError: ``programs`` lacks a decode component (or a language model that takes the steps), or a
            component takes an input generate cannot build.
        ValueError: a setting that is not a generation setting, or one the loop cannot honour.

    Example:
        >>> import hfx
        >>> from hfx import zoo
        >>> model = zoo.build("llama")
        >>> parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama"), model)))
        >>> ids = generate(zoo.inputs("llama", batch=1, sequence=4), parts, max_new_tokens=3,
        ...                settings={"repetition_penalty": 1.2})
        >>> ids.shape
        torch.Size([1, 7])
    """
    _check_order(inputs, programs)
    if step_component(programs) is None:
        msg = ("generate takes the Components of decompose (with a 'decode' component, or a 'language_model' that "
               f"takes the steps), exported or lowered; got {list(programs)}")
        raise InputError(msg)
    if settings is not None and not isinstance(settings, Mapping):
        msg = f"generate: settings must be a mapping of generation settings, got {type(settings).__name__}"
        raise TypeError(msg)
    meta = programs.meta
    asked = {"do_sample": do_sample, "temperature": temperature, "top_k": top_k, "top_p": top_p,
             "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    config = generation_config(meta.generation.config, {**{k: v for k, v in asked.items() if v is not _UNSET}, **(settings or {})})
    refuse_what_the_loop_cannot_do(config)
    eos = _eos_ids(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None or not eos else eos[0]  # as transformers pads
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    how = functools.partial(_picker, config, encoder_decoder=meta.generation.is_encoder_decoder, generator=generator,
                            max_new_tokens=max_new_tokens)

    state: dict[str, Any] = dict(inputs)
    # Registered once for the whole loop: each step's call then finds the cache classes already there.
    with spec_caches(*(program.io for program in programs.values())):
        if meta.roles.internal_cache_length is not None:
            return _generate_internal_cache(programs, state, max_new_tokens, set(eos), how)
        features = run_feature_encoders(programs, state)
        if meta.generation.is_encoder_decoder:
            return _generate_encoder_decoder(programs, state, max_new_tokens, set(eos), pad, how)
        return _generate_decoder_only(programs, state, max_new_tokens, set(eos), pad, how, features)


def _check_order(inputs: Any, programs: Any) -> None:
    """Raise ``TypeError`` when ``generate(inputs, programs)`` got its arguments swapped or of the wrong kind."""
    call = "generate(inputs, programs)"
    if isinstance(inputs, Components) or not isinstance(inputs, Mapping):
        raise argument_error(call, "inputs", "a mapping of generate inputs (input_ids ...)", inputs)
    if not isinstance(programs, Components):
        raise argument_error(call, "programs (the last argument)", "the Components of decompose", programs)


def run_feature_encoders(programs: Components, state: dict[str, Any]) -> dict[str, Any]:
    """Encode images / video / audio once, as generate() does before forward: ``{modality: features}``.

    Features go through the modality's projector component when there is
    one. A model without a split prefill reads them as ``mm_encoder_outputs``.
    """
    roles = programs.meta.roles
    projectors = roles.projectors
    features = {}
    for name, modality in roles.feature_encoders.items():
        encoder = programs[name]
        encoded = _encode_in_chunks(encoder, _encoder_inputs(encoder, programs.meta.encoder_inputs.get(name), state))
        if projectors.get(modality) in programs:
            encoded = _call_on(programs[projectors[modality]], encoded)
        features[modality] = encoded
    if features and "language_model" not in programs:
        state["mm_encoder_outputs"] = features
    return features


def _encoder_inputs(encoder: Any, how: EncoderInputs | None, state: dict[str, Any]) -> dict[str, Any]:
    """An encoder's inputs taken from ``state``: by name, or renamed and computed as ``decompose`` recorded.

    A packed-image tower takes ``pixel_values`` as ``hidden_states`` and the
    grids as ``grid_thw``, plus positions and boundaries computed from the
    grids (see ``hfx._capture.vision_inputs``). The grids stay in ``state``: the
    prompt's rotary positions need them.
    """
    if how is None or not how.names:
        return {k: state.pop(k) for k in input_keys(encoder.io) if k in state}
    renamed = {own: state[given] for own, given in how.names.items() if given in state}
    for given in how.names.values():
        if not given.endswith("grid_thw"):
            state.pop(given, None)
    grid = next((key for key in renamed if key.endswith("grid_thw")), None)
    if how.computed and grid is not None:  # a tower takes them as they are, a feature method prefixed (image_…)
        prefix = grid.removesuffix("grid_thw")
        renamed.update({prefix + k: v for k, v in computed_vision_inputs(how.computed, renamed[grid]).items()})
    return renamed


def _split_prefill(programs: Components, state: dict[str, Any], features: Mapping[str, Any]) -> tuple[torch.Tensor, Any]:
    """The prompt's logits and cache through the parts of a multimodal prefill: embed, merge features, language model, head.

    Each modality's features replace the embeddings of its placeholder tokens,
    in order, as the model's forward does (``masked_scatter``).
    """
    ids = state["input_ids"]
    embeds = _call_on(programs["embed_tokens"], ids)
    for modality, encoded in features.items():
        placeholder = (ids == programs.meta.roles.placeholder_tokens[modality])[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(placeholder, feature_rows(encoded).to(embeds.dtype))
    language_model = programs["language_model"]
    given = {**state, "inputs_embeds": embeds}
    if "visual_pos_masks" in input_keys(language_model.io):
        given.update(_deepstack_inputs(ids, features, programs.meta.roles.placeholder_tokens, language_model.io))
    outputs = language_model(**step_inputs(language_model, "language_model", given))
    if "lm_head" in programs:
        logits = _call_on(programs["lm_head"], outputs.last_hidden_state[:, -1:])
    else:  # a whole causal LM (BLIP-2's language model)
        logits = outputs.logits[:, -1:]
    return logits, output_cache(outputs)


def _deepstack_inputs(ids: torch.Tensor, features: Mapping[str, Any], placeholders: Mapping[str, int],
                      io: Any) -> dict[str, Any]:
    """Qwen3-VL's ``visual_pos_masks`` and ``deepstack_visual_embeds``, built as its model's forward builds them.

    The mask marks every visual placeholder (images' and videos'); each deepstack level holds the rows of
    the modalities' ``deepstack_features`` at those positions, in sequence order. A prompt without visual
    features gets an empty mask and zero-row levels, as many as the language model takes.
    """
    stacked = {m: [feature_rows(level) for level in encoded["deepstack_features"]]
               for m, encoded in features.items() if not isinstance(encoded, torch.Tensor)
               and encoded.get("deepstack_features") is not None}
    masks = {m: ids == placeholders[m] for m in stacked}
    visual = functools.reduce(torch.logical_or, masks.values(), torch.zeros_like(ids, dtype=torch.bool))
    specs = [spec for spec in io.inputs if spec.name.startswith("deepstack_visual_embeds.")]
    levels = []
    for index, spec in enumerate(specs):
        joint = torch.zeros(int(visual.sum()), int(spec.shape[-1]), dtype=getattr(torch, spec.dtype))
        for modality, mask in masks.items():
            joint[mask[visual]] = stacked[modality][index].to(joint.dtype)
        levels.append(joint)
    return {"visual_pos_masks": visual, "deepstack_visual_embeds": levels}


def _call_on(program: Any, tensor: torch.Tensor) -> Any:
    """Run a one-input program (an embedding, a head) on ``tensor``, whatever its input is called."""
    return program(**{input_keys(program.io)[0]: tensor})


def _encode_in_chunks(encoder: Any, inputs: dict[str, Any]) -> Any:
    """Run ``encoder``; one whose image axis is static (per-image splits in Python) runs chunk by chunk."""
    first = encoder.io.inputs[0].shape[0] if encoder.io.inputs and encoder.io.inputs[0].shape else None
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.ndim]
    if not isinstance(first, int) or not tensors or int(tensors[0].shape[0]) == first:
        return encoder(**inputs)
    total = int(tensors[0].shape[0])
    chunks = [
        encoder(**{k: v[start:start + first] if isinstance(v, torch.Tensor) and v.ndim else v for k, v in inputs.items()})
        for start in range(0, total, first)
    ]
    return _concatenated(chunks)


def _concatenated(outputs: list[Any]) -> Any:
    """Encoder outputs of consecutive chunks as one: tensors joined on axis 0, lists of tensors as one tensor."""
    merged = {}
    for key in outputs[0]:
        values = [output[key] for output in outputs]
        if isinstance(values[0], torch.Tensor):
            merged[key] = torch.cat(values, dim=0)
        else:
            merged[key] = [torch.cat([t for value in values for t in value], dim=0)]
    return type(outputs[0])(**merged)


# Per-token inputs that follow ``input_ids`` and the value a generated token takes: it is text
# (``mm_token_type_ids``, Qwen2-VL and kin) and, for PaliGemma, suffix rather than bidirectional prefix
# (``token_type_ids`` 1, as its ``_update_model_kwargs_for_generation`` appends).
_GENERATED_TOKEN_TYPES = {"mm_token_type_ids": 0, "token_type_ids": 1}


# What transformers' generate(inputs=...) may stand for: the modality's main input.
_MAIN_INPUTS = ("input_ids", "input_values", "input_features", "pixel_values")


def runner(program: Any) -> Any:
    """What the loop calls: a stateful program's session (its cache grows inside the runtime), else the program."""
    return program.session() if getattr(program, "state", ()) else program


def _loop(programs: Components, state: dict[str, Any], tokens: torch.Tensor, token_key: str, mask_key: str,
          max_new_tokens: int, eos: set[int], pad: Any, how: Any,
          features: Mapping[str, Any] | None = None, cross: Any = None) -> torch.Tensor:
    """Prefill then decode one token at a time; ``state`` holds the inputs every step shares.

    ``how(prompt_length=, mask=)`` gives the step's token picker (``_picker``);
    ``features``: the encoded, projected features a split multimodal prefill merges into the prompt;
    ``cross``: the cross-attention cache an ``EncoderWithCrossCache`` encoder computed, which the first step reads.
    """
    batch = tokens.shape[0]
    name = prompt_component(programs)
    cache_key = programs.meta.roles.cache_input or "past_key_values"
    # without a cache, or with one its model slices itself (CPM-Ant), each step reads the whole sequence
    whole = programs.meta.roles.whole_sequence_steps or (programs.meta.roles.cache_input is None
                                                          and set(programs) == {"decode"})
    state[cache_key] = initial_cache(programs[name], batch, cache_key)
    if cross is not None:
        state[cache_key] = with_cross_cache(state[cache_key], cross)
    mask = state[mask_key]
    new_tokens = ids = tokens
    finished = torch.zeros(batch, dtype=torch.bool)
    pick = how(prompt_length=tokens.shape[-1], mask=mask)
    program = programs[name]
    if name != "decode" and getattr(programs.get("decode"), "state", ()):
        msg = (f"generate: the decode component keeps its cache in the runtime, so it prefills too; the {name!r} "
               "component cannot hand it a cache. Decompose with multi_token_decode=True (no prefill component).")
        raise ValueError(msg)
    run = runner(program)
    state["beam_idx"] = torch.arange(batch, dtype=torch.int32)  # a stateful graph's cache rows, kept in order
    sections = _position_sections(program)
    positions = None
    decode = None  # the steps after the prompt's
    roles = programs.meta.roles
    for _ in range(max_new_tokens):
        state.update({token_key: _with_appended(new_tokens, roles.appended_tokens), mask_key: mask})
        state[KEPT_INPUT] = last_position(state[token_key])
        state.update({name: torch.full_like(state[token_key], value) for name, value in roles.token_fills.items()})
        positions = with_positions(programs, sections, state, new_tokens, mask, positions)
        if decode is None:
            logits, returned = step(programs, name, run, state, features)
            # A static cache is updated in place and not returned: keep the one passed in.
            state[cache_key] = returned or state[cache_key]
        else:
            logits = decode(state)
        token = pick(ids, logits)
        if pad is not None and eos:
            token = torch.where(finished, torch.as_tensor(pad, dtype=token.dtype), token)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        finished |= torch.isin(token, torch.tensor(sorted(eos), dtype=token.dtype)) if eos else finished
        if bool(finished.all()):
            break
        new_tokens = ids if whole else token[:, None]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=-1)
        for key, value in _GENERATED_TOKEN_TYPES.items():
            if key in state:
                state[key] = torch.full_like(new_tokens, value, dtype=state[key].dtype)
        # A decode that also prefilled goes on with its run (a stateful one's session). Without a decode, a split
        # prefill's parts take the steps too (embed_tokens, language_model, lm_head); the features are the prompt's.
        if decode is None and "decode" in programs:
            decode = DecodeSteps(programs["decode"], run if name == "decode" else runner(programs["decode"]),
                                 cache_key=cache_key)
        features = None
    return ids


def _with_appended(tokens: torch.Tensor, appended: tuple[int, ...]) -> torch.Tensor:
    """``tokens`` with the tokens a cache-free model's generate puts after the sequence (XLM's mask token)."""
    if not appended:
        return tokens
    tail = torch.tensor(appended, dtype=tokens.dtype).expand(tokens.shape[0], -1)
    return torch.cat([tokens, tail], dim=-1)


def with_positions(programs: Components, sections: int, state: dict[str, Any], new_tokens: torch.Tensor,
                   mask: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """Put the step's position ids (and cache positions) into ``state``; return the position ids.

    ``mask`` covers the past and ``new_tokens``. With M-RoPE ``sections`` the
    prompt's come from the image grids, then each step's is one past ``previous``.
    """
    past = mask.shape[-1] - new_tokens.shape[-1]
    if sections:
        positions = prompt_positions(programs.meta.model, sections, state, mask) if previous is None else next_positions(previous)
    else:
        positions = text_positions(mask)[:, past:]
    state.update({
        "position_ids": positions,
        "decoder_position_ids": positions,
        "cache_position": torch.arange(past, mask.shape[-1]),
    })
    return positions


def step(programs: Components, name: str, run: Any, state: dict[str, Any],
         features: Mapping[str, Any] | None) -> tuple[torch.Tensor, Any]:
    """One forward of the prompt or decode component ``name`` (called through ``run``): its logits and returned cache."""
    if name == "language_model":
        return _split_prefill(programs, state, features or {})
    outputs = run(**step_inputs(programs[name], name, state))
    return outputs.logits, output_cache(outputs)


def _generate_decoder_only(programs: Components, state: dict[str, Any], max_new_tokens: int, eos: set[int], pad: Any,
                           how: Any, features: Mapping[str, Any]) -> torch.Tensor:
    if "input_ids" not in state:
        raise InputError("generate needs input_ids")
    tokens = state.pop("input_ids")
    state.setdefault("attention_mask", torch.ones_like(tokens))
    return _loop(programs, state, tokens, "input_ids", "attention_mask", max_new_tokens, eos, pad, how, features)


def _generate_encoder_decoder(programs: Components, state: dict[str, Any], max_new_tokens: int, eos: set[int],
                              pad: Any, how: Any) -> torch.Tensor:
    encoder = programs["encoder"]
    takes = input_keys(encoder.io)
    # generate(inputs=...) names the main input generically (SpeechEncoderDecoder, whose main_input_name is
    # "inputs"); the encoder was traced on what generate made of it
    main = [k for k in takes if k in _MAIN_INPUTS and k not in state]
    if "inputs" in state and "inputs" not in takes and len(main) == 1:
        state[main[0]] = state.pop("inputs")
    encoder_inputs = {k: state.pop(k) for k in list(state) if k in takes}
    state["encoder_outputs"], cross = split_encoder_output(encoder(**encoder_inputs))
    if "attention_mask" in encoder_inputs:
        state["attention_mask"] = encoder_inputs["attention_mask"]
    prompt_takes = input_keys(programs[prompt_component(programs)].io)
    # what the first decoder step takes as well (T5Gemma 2's prefill is traced with the pixel values too)
    state.update({k: v for k, v in encoder_inputs.items() if k in prompt_takes and k not in state})
    batch = next(iter(encoder_inputs.values())).shape[0]
    start = programs.meta.generation.decoder_start_token_id
    given = {**encoder_inputs, **state}  # eager hands input_ids to the encoder too where it takes them
    tokens = decoder_prompt(given, int(start), batch, from_input_ids=programs.meta.generation.prompts_the_decoder)
    state.pop("decoder_input_ids", None)
    if programs.meta.generation.prompts_the_decoder:
        state.pop("input_ids", None)
    state["decoder_attention_mask"] = torch.ones_like(tokens)
    ids = encoder_inputs.get("input_ids")
    how = functools.partial(how, encoder_input_ids=ids if ids is not None and ids.ndim == 2 else None)
    ids = _loop(programs, state, tokens, "decoder_input_ids", "decoder_attention_mask", max_new_tokens, eos, pad, how,
                cross=cross)
    return ids if programs.meta.generation.returns_start_token else _transcripts(ids[:, 1:], eos, pad)


def _transcripts(ids: torch.Tensor, eos: set[int], pad: Any) -> torch.Tensor:
    """Whisper's ``generate`` output: each row without the padding after its EOS nor the EOS, right-padded again.

    Whisper's generate (the model whose output leaves the start token out) cuts
    each row's segment so (``WhisperGenerationMixin.generate``, step 6.7).
    """
    if not eos or pad is None:
        return ids
    rows = []
    for row in ids:
        end = len(row)
        while end and int(row[end - 1]) == pad:
            end -= 1
        if pad not in eos and end and int(row[end - 1]) in eos:
            end -= 1
        rows.append(row[:end])
    longest = max(len(row) for row in rows)
    return torch.stack([torch.cat([row, row.new_full((longest - len(row),), int(pad))]) for row in rows])


def _generate_internal_cache(programs: Components, state: dict[str, Any], max_new_tokens: int, eos: set[int],
                             how: Any) -> torch.Tensor:
    """The runner's loop over a decode graph that keeps its cache: the prompt at position 0, then one token a step.

    The graph's cache is one sequence (batch 1) without padding: its causal
    attention reads every position before the query's.
    """
    length = programs.meta.roles.internal_cache_length
    tokens = state.get("input_ids")
    mask = state.get("attention_mask")
    if tokens is None or tokens.ndim != 2 or tokens.shape[0] != 1 or (mask is not None and not bool(mask.all())):
        msg = ("generate: the decode component keeps its KV cache inside (decompose(internal_cache_length=...)), "
               "for one unpadded sequence; give input_ids of shape [1, n] and no padding")
        raise InputError(msg)
    if tokens.shape[1] + max_new_tokens - 1 > length:
        msg = (f"generate: a prompt of {tokens.shape[1]} tokens and {max_new_tokens} new ones do not fit the "
               f"decode component's cache of {length} positions; decompose with a larger internal_cache_length")
        raise InputError(msg)
    program = programs["decode"]
    pick = how(prompt_length=tokens.shape[1], mask=None)
    new_tokens, position, ids = tokens, 0, tokens
    steps = DecodeSteps(program, program, cache_key=None)  # from the first one-token step: the prompt's is longer
    for _ in range(max_new_tokens):
        state = {"tokens": new_tokens, "input_pos": torch.tensor([position])}
        if position:
            logits = steps(state)
        else:
            outputs = program(**state)
            logits = outputs if isinstance(outputs, torch.Tensor) else outputs.logits
        token = pick(ids, logits)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        if int(token) in eos:
            break
        position += new_tokens.shape[1]
        new_tokens = token[:, None]
    return ids
