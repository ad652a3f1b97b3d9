"""``decompose``: split a generative model into the graphs ``generate()`` really runs.

It runs the model's own ``generate()`` once with forward hooks and records the
exact keyword arguments of each call: the encoder (for encoder-decoder
models, called outside ``forward``), the prefill and a decode step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._capture.dynamic_shapes import declared_shapes, dim_sizes, infer_dynamic_shapes
from hfx._capture.multimodal import FeatureEncoder, feature_methods, placeholder_tokens
from hfx._capture.recording import recorded_generate, with_padding_mask
from hfx._errors import CaptureError, describe
from hfx._generation_config import decoder_prompt
from hfx._kept_positions import KEPT_INPUT, new_token_count
from hfx._pytree import is_cache, owned_tensors
from hfx._records import Capture, ComponentRoles, Components, DynamicShapes, GenerationMeta, GenerationSettings, ModelSpec

_MIN_PAST = 2  # a decode captured with a past of 0 or 1 would specialise that axis


def can_generate(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a working ``generate()`` (a language-model head)."""
    check = getattr(model, "can_generate", None)
    return bool(check()) if callable(check) else False


def _past_length(kwargs: Mapping[str, Any]) -> int | None:
    """How many tokens the call's self-attention cache holds; ``None`` for a cache with no growing keys (SSMs)."""
    cache = next((v for v in kwargs.values() if is_cache(v)), None)
    if cache is None:
        return 0
    tensors = owned_tensors({"past": cache})
    if not tensors:
        return 0
    lengths = [int(t.shape[2]) for name, t, _ in tensors
               if name.endswith((".keys", ".values")) and ".cross_attention_cache." not in name and t.ndim == 4]
    return max(lengths) if lengths else None


def _one_item(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A feature encoder's inputs cut to the first image (or clip), when every tensor input is batched alike.

    Some encoders split their output per image in Python (LLaVA's
    ``list(image_features)``), which fixes the number of images in the graph;
    captured on one image, ``generate`` runs such an encoder once per image.
    """
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.ndim]
    if not tensors or len({int(t.shape[0]) for t in tensors}) != 1:
        return kwargs
    return {k: v[:1] if isinstance(v, torch.Tensor) and v.ndim else v for k, v in kwargs.items()}


def as_multi_token_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """``call`` as a multi-token decode graph takes it: ``logits_to_keep`` as the tensor of positions whose logits
    it returns, the last new token's, as ``hfx.generate`` passes it; the call as it was for a model that takes none."""
    count = new_token_count(call) if KEPT_INPUT in call else None
    return dict(call) if count is None else {**call, KEPT_INPUT: torch.tensor([count - 1])}


# Per-token inputs of a step and their token axis (M-RoPE's position ids are [sections, batch, tokens]).
_TOKEN_AXES = {"input_ids": -1, "decoder_input_ids": -1, "position_ids": -1, "cache_position": -1,
               "decoder_position_ids": -1, "inputs_embeds": -2}


def _merge_decode_steps(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One decode call for two query tokens: the first step's cache, both steps' new tokens.

    It returns the logits of every new token (``logits_to_keep=0``); ``_with_kept_positions`` makes that an input.
    """
    merged = {**first, KEPT_INPUT: 0} if KEPT_INPUT in first else dict(first)
    for key, axis in _TOKEN_AXES.items():
        if isinstance(first.get(key), torch.Tensor) and isinstance(second.get(key), torch.Tensor):
            merged[key] = torch.cat([first[key], second[key]], dim=axis)
    for key in ("attention_mask", "decoder_attention_mask"):
        if isinstance(second.get(key), torch.Tensor):
            merged[key] = second[key]
    return merged


def _eager_output(model: torch.nn.Module, call: Mapping[str, Any]) -> Any:
    """``model``'s output on a copy of ``call``, its state left as it was; ``None`` when the model refuses the call."""
    import copy

    from hfx.patches import preserve_module_state

    try:
        with torch.no_grad(), preserve_module_state(model):
            return model(**copy.deepcopy(dict(call)))
    except Exception:  # noqa: BLE001 - the model refuses the call, for whatever reason
        return None


def _with_kept_positions(model: torch.nn.Module, call: dict[str, Any], output: Any) -> dict[str, Any]:
    """``call`` (a multi-token step) with ``logits_to_keep`` as a tensor of positions, an input of the graph
    (``hfx._kept_positions``), when ``model`` honours one as transformers' causal LMs do
    (``hidden_states[:, logits_to_keep]``); else as it is, the graph returning every position's logits.

    Checked eagerly: asked for position ``[1]``, the model must return the logits of position 1 in ``output``
    (its output on ``call``, every position; ``None``: it refused the call).
    """
    keep, count = call.get(KEPT_INPUT), new_token_count(call) or 0
    if not isinstance(keep, int) or keep != 0 or count < 2 or output is None:
        return call
    kept = getattr(_eager_output(model, {**call, KEPT_INPUT: torch.tensor([1])}), "logits", None)
    every = getattr(output, "logits", None)
    second = every[:, 1:2] if isinstance(every, torch.Tensor) and every.ndim == 3 else None
    if second is None or not isinstance(kept, torch.Tensor) or kept.shape != second.shape:
        return call
    if not torch.allclose(kept, second, rtol=1e-4, atol=1e-5):
        return call
    return {**call, KEPT_INPUT: torch.arange(count)}


def _decode_shapes(capture: Capture, *, multi_token: bool, whole_sequence: bool = False) -> DynamicShapes:
    """The decode graph's shapes: a single-token step keeps its query axis static; one handed the whole
    sequence (``_takes_the_whole_sequence``) keeps it dynamic."""
    shapes = infer_dynamic_shapes(capture)
    if whole_sequence and not multi_token:
        # its own name: torch states the length's relation to the past as a fix on a root dim it sympifies, and
        # "sequence" is a sympy function
        renamed = {"sequence": "tokens"}
        axes = {leaf: {a: renamed.get(d, d) for a, d in per_axis.items()} for leaf, per_axis in shapes.axes.items()}
        return DynamicShapes(axes=axes, bounds={renamed.get(d, d): b for d, b in shapes.bounds.items()})
    if multi_token:  # the same graph also prefills, from an empty cache
        bounds = {**shapes.bounds}
        if "past_sequence" in bounds:
            bounds["past_sequence"] = (0, bounds["past_sequence"][1])
        return DynamicShapes(axes=shapes.axes, bounds=bounds)
    query = {"decoder_sequence"} if "decoder_input_ids" in capture.kwargs else {"sequence"}
    mask = _one_token_mask_axis(capture, shapes)
    axes = {leaf: {a: mask.get(d, d) for a, d in per_axis.items() if d not in query}
            for leaf, per_axis in shapes.axes.items()}
    return DynamicShapes(axes=axes, bounds={d: b for d, b in shapes.bounds.items() if d not in query | set(mask)})


def _one_token_mask_axis(capture: Capture, shapes: DynamicShapes) -> dict[str, str]:
    """``{"total_sequence": "past_sequence + 1"}`` when a one-token step's mask spans the past and that token.

    Told so up front, torch.export traces the step once; given two independent
    dims it fails on their relation and the mask's range and traces again with
    its suggested fixes, three traces in all.
    """
    sizes = dim_sizes(capture.kwargs, shapes)
    if "total_sequence" in sizes and sizes["total_sequence"] == sizes.get("past_sequence", -2) + 1:
        return {"total_sequence": "past_sequence + 1"}
    return {}


def encoder_capture(name: str, module: torch.nn.Module, kwargs: dict[str, Any], packed: bool) -> Capture:
    """An encoder's capture; a feature encoder that splits per image in Python is cut to one image.

    ``packed``: a tower taking every image's patches in one sequence (and
    their positions and boundaries, computed outside the graph): the patch,
    image and boundary counts vary.
    """
    splits = isinstance(module, FeatureEncoder) and module.projector is None
    capture = Capture(module=module, source=module, kwargs=_one_item(kwargs) if splits else kwargs, name=name)
    if not packed:
        return capture
    modality = name.removesuffix("_encoder")
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.ndim}
    patches = max(int(v.shape[0]) for v in tensors.values())  # the packed patches outnumber the images

    def dim(key: str, tensor: torch.Tensor) -> str:
        key = key.removeprefix(f"{modality}_")  # a feature method takes the tower's inputs prefixed
        if key.startswith("cu_"):  # boundaries: of the images, or of Qwen2.5-VL's windows
            return f"{modality}_{key.removeprefix('cu_').replace('seqlens', 'boundaries')}"
        if key.endswith("grid_thw"):
            return f"{modality}_count"
        return f"{modality}_patches" if tensor.shape[0] == patches else f"{modality}_{key}"

    axes = {k: {0: dim(k, v)} for k, v in tensors.items()}
    shapes = declared_shapes(capture, axes)
    # A list of boundaries holds at least two (one image, one window).
    bounds = {d: (2, None) if d.endswith("boundaries") else b for d, b in shapes.bounds.items()}
    return attrs.evolve(capture, dynamic_shapes=attrs.evolve(shapes, bounds=bounds))


def _without_broadcast_positions(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without ``position_ids`` when they are one row for the whole batch counting on from the cache's
    length, which the language model computes itself when given none.

    Model pattern: EXAONE 4.5's forward gives its language model ``arange(past, past + length)[None]`` for
    every prompt, padded or not (its ``prepare_inputs_for_generation`` passes no positions). Kept, the row
    would be a batch-1 input beside batch-2 embeddings ("Constraints violated (batch)").
    """
    positions, embeds, cache = kwargs.get("position_ids"), kwargs.get("inputs_embeds"), kwargs.get("past_key_values")
    if not (isinstance(positions, torch.Tensor) and isinstance(embeds, torch.Tensor) and positions.ndim == 2
            and positions.shape[0] == 1 < embeds.shape[0]):
        return kwargs
    past = cache.get_seq_length() if callable(getattr(cache, "get_seq_length", None)) else 0
    if not torch.equal(positions[0], torch.arange(past, past + positions.shape[1], device=positions.device)):
        return kwargs
    return {k: v for k, v in kwargs.items() if k != "position_ids"}


def part_capture(name: str, module: torch.nn.Module, kwargs: dict[str, Any]) -> Capture:
    """A multimodal prefill part's capture, with the axes of inputs no shape rule knows by name."""
    if name == "language_model":
        kwargs = _without_broadcast_positions(kwargs)
    capture = Capture(module=module, source=module, kwargs=kwargs, name=name)
    if name in ("embed_tokens", "lm_head"):  # one input: token ids, or the hidden states of the kept positions
        key = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        return attrs.evolve(capture, dynamic_shapes=declared_shapes(capture, {key: {0: "batch", 1: "sequence"}}))
    if name.endswith("projector"):  # the selected features of each image (or every image's tokens in a row)
        modality = name.removesuffix("projector").rstrip("_") or "image"
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.ndim}
        axes = {k: {0: f"{modality}_count" if v.ndim >= 3 else f"{modality}_tokens"} for k, v in tensors.items()}
        return attrs.evolve(capture, dynamic_shapes=declared_shapes(capture, axes))
    return capture


@curry
def decompose(
    capture: Capture,
    /,
    *,
    multi_token_decode: bool | None = None,
    generation_config: Any = None,
    internal_cache_length: int | None = None,
    custom_ops: bool = True,
) -> Components:
    """Split a captured model into the components ``generate()`` runs, with each call's exact inputs.

    ``capture`` holds the *generate* inputs (``input_ids``, ``attention_mask``,
    ``input_features`` ...). The model's real ``generate()`` runs once with
    hooks (2 new tokens, more when needed so that the decode step sees a past
    of at least 2 and does not specialise that axis).

    Components: decoder-only models give ``prefill`` and ``decode`` (one
    ``decode`` for prompt and steps by default when the cache is all
    full-attention layers, see ``multi_token_decode``);
    encoder-decoder models give ``encoder`` and ``decode`` (the encoder also
    computes the decoder's cross-attention cache, ``EncoderWithCrossCache``, so
    that ``decode`` takes the first step too: by default when its self-attention
    cache is all full-attention layers and the encoder reproduces the
    cross-attention cache ``generate()`` built), else ``encoder``, ``prefill``
    and ``decode``;
    multimodal models give ``image_encoder`` / ``video_encoder`` /
    ``audio_encoder`` (the model's ``get_<modality>_features``, which
    ``generate()`` runs before ``forward``, up to the projector's input),
    ``projector`` (``<modality>_projector`` when there are several),
    ``embed_tokens``, ``language_model`` (``get_decoder()``) and ``lm_head``,
    where the language model takes the prompt's embeddings (the features
    written over the placeholder tokens) and each step's, when its cache is all
    full-attention layers (LLaVA, Qwen2-VL, SmolVLM ...), else those and
    ``decode``; a model whose forward builds its language model's mask itself
    (PaliGemma, Gemma 3) gives its encoders, ``prefill`` and ``decode``. A model
    that does not generate gives one component, ``model`` (its ``meta`` holds
    only the model's class and config). With ``multi_token_decode`` there is no
    ``prefill``: the decode graph (a multimodal model's language model) takes
    1..N new tokens over a past of 0..N, so it prefills too. That is the
    default for a text decoder whose cache is all full-attention layers (a
    Llama, Qwen, Phi ...), for an encoder-decoder as above (T5, BART, Marian,
    Whisper ...) and for a multimodal model as above: the decoder's weights are
    then in one graph, stored and loaded once on every runtime, where
    ``prefill`` and ``decode`` would each hold a copy. Such a graph takes
    ``logits_to_keep``, the positions whose logits it returns, as an input where
    the model honours a tensor of positions (``hfx._kept_positions``):
    ``hfx.generate`` asks the prompt for its last position only.

    With ``internal_cache_length`` a text decoder gives one component,
    ``decode``, in the contract of ExecuTorch's LLM runner: ``forward(tokens
    [1, n], input_pos [1]) -> logits [1, 1, vocab]``, the KV cache kept in the
    program's own buffers of that many positions and written in place, ``n``
    from 1 to the cache length (the prompt and each step); ``hfx.package(...,
    consumer="executorch-runner")`` writes it for the runner.

    Args:
        capture: a ``Capture`` of generate inputs.
        multi_token_decode: make one decode graph take 1..N new tokens at once
            (prefill with an empty cache, ordinary decode, speculative blocks).
            ``None`` (default): for a text decoder, an encoder-decoder or a split
            multimodal prefill's language model with a full-attention cache and no
            static cache (an encoder-decoder's encoder must reproduce the
            cross-attention cache), whose forward runs a step of two new tokens
            over a cache (ProphetNet's asserts one); ``False`` keeps a separate ``prefill`` (the
            language model prefills, ``decode`` steps).
        generation_config: passed to ``generate`` (e.g. a static cache).
        internal_cache_length: keep the KV cache inside the decode graph, in
            buffers of this many positions (batch 1; ExecuTorch's runner contract).
        custom_ops: with ``internal_cache_length``, write the cache and attend
            with ExecuTorch's LLM kernels (``llama::update_cache``,
            ``llama::custom_sdpa``; needs executorch, lowers to ExecuTorch only);
            ``False``: the model's own attention and ``index_copy_``.

    Returns:
        ``Components`` of ``Capture`` records, ready for ``export`` and the lowerings.

    Raises:
        CaptureError: ``generate`` did not call ``forward`` as expected.
        ValueError: ``internal_cache_length`` for a model that is not a text decoder
            with full-attention layers, or not an int >= 2; ``multi_token_decode`` or
            ``generation_config`` for a model that does not generate;
            ``multi_token_decode=True`` for an encoder-decoder whose first decoder step
            does more than fill the cross-attention cache, or a multimodal model whose
            language model cannot take the prompt and the steps.
        ImportError: ``custom_ops`` without executorch.

    Example:
        >>> from hfx import capture, zoo
        >>> parts = decompose(capture(zoo.inputs("llama"), zoo.build("llama")))
        >>> list(parts)  # one graph for prompt and steps: a Llama's cache is all full-attention layers
        ['decode']
        >>> list(decompose(capture(zoo.inputs("llama"), zoo.build("llama")), multi_token_decode=False))
        ['prefill', 'decode']
    """
    model = capture.source
    if internal_cache_length is not None:
        return _internal_cache_decode(capture, internal_cache_length, custom_ops=custom_ops,
                                      generation_config=generation_config)
    if not can_generate(model):
        asked = [name for name, value in (("multi_token_decode", multi_token_decode),
                                          ("generation_config", generation_config)) if value is not None]
        if asked:
            msg = (f"decompose: {type(model).__name__} does not generate, so {' and '.join(asked)} has nothing to "
                   "shape; drop it (decompose gives one component, 'model')")
            raise ValueError(msg)
        return Components(items={"model": attrs.evolve(capture, name="model")}, meta=GenerationMeta(model=_model_spec(model)))
    inputs = with_padding_mask(capture)
    merge = _may_merge_steps(model, generation_config) if multi_token_decode is None else multi_token_decode
    steps = _steps(model, inputs, merge)
    recorded = recorded_generate(model, inputs, steps, generation_config)
    calls = recorded.calls
    stepping = recorded.generating or model  # the module generate steps through
    multimodal = bool(feature_methods(model))
    language_model = _merged_language_model(model, recorded, merge, asked=multi_token_decode) if multimodal else None
    if multimodal:  # its steps merge in the language model, if anywhere: a whole forward takes the features
        merge = False
    elif multi_token_decode is None:  # the default merges only what one graph can fill from an empty cache
        # (a model handed the whole sequence slices off its cache itself: CPM-Ant branches on the cache's length)
        merge = merge and full_attention_cache(calls) and not _takes_the_whole_sequence(calls)
    decode = _pick_decode(calls, multi_token=merge)
    merged_output = _eager_output(stepping, decode) if merge and decode is not None else None
    if merge and multi_token_decode is None and decode is not None and merged_output is None:
        merge = False  # ProphetNet asserts a step of one token over a cache: it keeps a prefill
        decode = _pick_decode(calls, multi_token=False)
    if merge and decode is not None:
        decode = _with_kept_positions(stepping, decode, merged_output)
    if decode is None and not multimodal and _cache_free(calls):
        return _cache_free_components(model, calls, inputs.get("input_ids"), recorded, generation_config)
    if not calls or decode is None:
        what = f"generate() made {len(calls)} forward call(s), none a decode step with a past of >= {_MIN_PAST}."
        raise CaptureError(describe("decompose", model, "decode", what, "Pass a prompt of at least 2 tokens."))
    settings = _generation_settings(model, generation_config)
    cross_encoder = _cross_cache_encoder(model, settings) if merge and settings.is_encoder_decoder else None
    if cross_encoder is not None and not _encoder_fills_cross_cache(cross_encoder, recorded, decode):
        if multi_token_decode:
            msg = (f"decompose(multi_token_decode=True): {type(model).__name__}'s first decoder step does more than "
                   "fill the cross-attention cache from the encoder's states, so one decode graph cannot take it; "
                   "decompose with multi_token_decode=False (a prefill graph) or None")
            raise ValueError(msg)
        merge, cross_encoder = False, None
        decode = _pick_decode(calls, multi_token=False)
    parts = {
        name: encoder_capture(name, module, kwargs, packed=bool(name in recorded.encoder_inputs and recorded.encoder_inputs[name].computed))
        for name, (module, kwargs) in recorded.encoders.items()
    }
    parts.update({name: part_capture(name, module, kwargs) for name, (module, kwargs) in recorded.parts.items()})
    if not merge and "language_model" not in parts:  # a multi-token decode graph prefills too
        parts["prefill"] = Capture(module=stepping, source=stepping, kwargs=calls[0], name="prefill")
    if cross_encoder is not None:  # the decode graph's first step reads the cross-attention cache
        # The wrapper is the source: export flattens and patches what it traces (it holds the model).
        parts["encoder"] = attrs.evolve(parts["encoder"], module=cross_encoder, source=cross_encoder)
    if language_model is not None:  # the language model takes the prompt's embeddings and every step's
        shapes = _decode_shapes(language_model, multi_token=True)
        parts["language_model"] = attrs.evolve(language_model, dynamic_shapes=shapes)
        decode = language_model.kwargs  # the step the cache input is read from
    else:
        decode_capture = Capture(module=stepping, source=stepping, kwargs=decode, name="decode")
        shapes = _decode_shapes(decode_capture, multi_token=merge, whole_sequence=_takes_the_whole_sequence(calls))
        parts["decode"] = attrs.evolve(decode_capture, dynamic_shapes=shapes)
    if settings.is_encoder_decoder:  # some generate()s (Whisper's) return the decoder ids without the start token
        start = int(settings.decoder_start_token_id or 0)
        first = decoder_prompt(inputs, start, 1, from_input_ids=settings.prompts_the_decoder)
        settings = attrs.evolve(settings, returns_start_token=recorded.length == steps + first.shape[-1])
    encoders = {f"{m}_encoder": m for m in feature_methods(model) if f"{m}_encoder" in parts}
    roles = ComponentRoles(
        feature_encoders=encoders,
        projectors=recorded.projectors,
        cache_input=next((k for k, v in decode.items() if is_cache(v)), None),
        placeholder_tokens=placeholder_tokens(model, tuple(encoders.values())),
        whole_sequence_steps=_takes_the_whole_sequence(calls),
        # XLM with transformers 5.24 fills its cache and still takes the whole sequence, its mask token and langs
        appended_tokens=_appended_tokens(calls, inputs.get("input_ids")),
        token_fills=_token_fills(calls),
    )
    meta = GenerationMeta(generation=settings, roles=roles, model=_model_spec(model), encoder_inputs=recorded.encoder_inputs)
    return Components(items=parts, meta=meta)


def _takes_the_whole_sequence(calls: list[dict[str, Any]]) -> bool:
    """Whether ``generate`` handed the model every token so far with its cache at each step (the steps' ids
    grow by one as the cache does).

    CPM-Ant's ``prepare_inputs_for_generation`` keeps the full ``input_ids``: its forward drops the cached
    prefix itself (its cache also holds a learned prompt, so the lengths differ).
    """
    steps = [call for call in calls[1:] if _past_length(call)]
    ids = [call.get("input_ids") for call in steps]
    return len(ids) >= 2 and all(isinstance(t, torch.Tensor) and t.ndim == 2 for t in ids) and all(  # noqa: PLR2004
        later.shape[-1] == earlier.shape[-1] + 1 > 2 for earlier, later in zip(ids, ids[1:], strict=False))  # noqa: PLR2004


def _cache_free(calls: list[dict[str, Any]]) -> bool:
    """Whether ``generate`` ran the whole growing sequence each step: no call holds a cache, each takes one more token.

    Models without a KV cache (GPT-1) or whose config turns it off (the generated zoo's MPT), and XLM, whose
    generate appends its mask token and fills ``langs`` each step. Not XLNet, which appends a dummy token
    with its own masks.
    """
    ids = [call.get("input_ids") for call in calls]
    if len(calls) < 2 or not all(_holds_no_tokens(call) for call in calls):  # noqa: PLR2004 - prompt, a step
        return False  # (generate hands such a model an empty cache it never fills)
    return all(isinstance(t, torch.Tensor) for t in ids) and all(
        later.shape[-1] == earlier.shape[-1] + 1 for earlier, later in zip(ids, ids[1:], strict=False))


def _holds_no_tokens(call: Mapping[str, Any]) -> bool:
    """Whether the call's cache (if any) holds no tensor with elements: an empty cache, its layers unfilled
    (transformers 5.24's lazily built layers hold empty placeholders)."""
    cache = next((v for v in call.values() if is_cache(v)), None)
    return cache is None or all(t.numel() == 0 for _, t, _ in owned_tensors({"past": cache}))


def _cache_free_components(model: torch.nn.Module, calls: list[dict[str, Any]], prompt: Any, recorded: Any,
                           generation_config: Any) -> Components:
    """One ``decode`` graph of the whole forward over the sequence so far, as ``generate`` calls a cache-free model."""
    settings = _generation_settings(model, generation_config)
    call = calls[1]
    roles = ComponentRoles(feature_encoders={}, projectors=recorded.projectors, cache_input=None, placeholder_tokens={},
                           appended_tokens=_appended_tokens(calls, prompt), token_fills=_token_fills(calls))
    meta = GenerationMeta(generation=settings, roles=roles, model=_model_spec(model),
                          encoder_inputs=recorded.encoder_inputs)
    kwargs = {k: v for k, v in call.items() if not is_cache(v)}
    if "use_cache" in kwargs:  # the empty cache generate handed it is not an input; nothing to return either
        kwargs["use_cache"] = False
    return Components(items={"decode": Capture(module=model, source=model, kwargs=kwargs, name="decode")}, meta=meta)


def _appended_tokens(calls: list[dict[str, Any]], prompt: Any) -> tuple[int, ...]:
    """The tokens ``generate`` put after the sequence in every call of a cache-free model, the same in each row
    (XLM's ``prepare_inputs_for_generation`` appends its mask token); ``()`` when there are none."""
    first, second = calls[0].get("input_ids"), calls[1].get("input_ids") if len(calls) > 1 else None
    if not all(isinstance(t, torch.Tensor) for t in (prompt, first, second)) or first.shape[-1] <= prompt.shape[-1]:
        return ()
    tail = first[:, prompt.shape[-1]:]
    if not torch.equal(first[:, :prompt.shape[-1]], prompt) or not bool((tail == tail[:1]).all()):
        return ()
    if not torch.equal(second[:, -tail.shape[-1]:], tail):
        return ()
    return tuple(int(t) for t in tail[0])


# Per-token inputs the decode loop builds itself.
_LOOP_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids", "token_type_ids", "mm_token_type_ids",
                          "cache_position"})


def _token_fills(calls: list[dict[str, Any]]) -> dict[str, int]:
    """``{input: value}`` of the integer inputs shaped like ``input_ids`` that hold one value in every call
    (XLM's ``langs``: ``torch.full_like(input_ids, config.lang_id)``)."""
    fills: dict[str, int] = {}
    if not all(isinstance(call.get("input_ids"), torch.Tensor) for call in calls):
        return fills
    for name, value in calls[0].items():
        if name in _LOOP_INPUTS or not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        same = [call.get(name) for call in calls]
        if all(isinstance(t, torch.Tensor) and t.shape == call["input_ids"].shape and t.numel()
               and bool((t == t.flatten()[0]).all()) and int(t.flatten()[0]) == int(value.flatten()[0])
               for t, call in zip(same, calls, strict=True)):
            fills[name] = int(value.flatten()[0])
    return fills


def _merged_language_model(model: torch.nn.Module, recorded: Any, merge: bool, *, asked: bool | None) -> Capture | None:
    """A split multimodal prefill's language model over two merged steps, which also takes the prompt; ``None``
    when ``merge`` is off, the prefill stays whole or the cache is not all full-attention layers.

    The prompt's embeddings (with the features written in) and each step's go through
    one graph, so its weights are stored once; generate steps through ``embed_tokens``,
    ``language_model`` and ``lm_head``.

    Raises:
        ValueError: ``asked`` (``multi_token_decode=True``) and the language model cannot take the steps.
    """
    calls = recorded.part_calls.get("language_model", [])
    mergeable = (merge and len(calls) >= 3  # noqa: PLR2004 - the prompt and two steps
                 and full_attention_cache(calls) and not _prompt_only_inputs(calls))
    if asked and not mergeable:
        msg = (f"decompose(multi_token_decode=True): {type(model).__name__}'s prefill cannot be split around a "
               "language model that takes the 2D padding mask, or its cache is not all full-attention layers, so "
               "one graph cannot take the prompt and the steps; decompose with multi_token_decode=None or False")
        raise ValueError(msg)
    kwargs = _pick_decode(calls, multi_token=True) if mergeable else None
    if kwargs is None:
        return None
    module = recorded.parts["language_model"][0]
    return Capture(module=module, source=module, kwargs=kwargs, name="language_model")


def _prompt_only_inputs(calls: list[dict[str, Any]]) -> list[str]:
    """The language model's keywords that hold tensors for the prompt and ``None`` for the steps.

    Qwen3-VL adds its tower's deepstack features to the prompt's hidden states in the first layers
    (``deepstack_visual_embeds``, ``visual_pos_masks``): a graph traced on a step, where they are ``None``,
    has no input for them, so it cannot take the prompt.
    """
    prompt, step = calls[0], calls[1]
    return [name for name, value in prompt.items()
            if step.get(name) is None and owned_tensors({"value": value}) and not is_cache(value)]


def _cross_cache_encoder(model: torch.nn.Module, settings: GenerationSettings) -> Any:
    """``model``'s ``EncoderWithCrossCache``, run from its first decoder token (any token does; 0 when it has none)."""
    from hfx._capture.cross_cache import EncoderWithCrossCache

    start = settings.decoder_start_token_id
    return EncoderWithCrossCache(model, start if start is not None else 0)


def _encoder_fills_cross_cache(encoder: Any, recorded: Any, decode: Mapping[str, Any]) -> bool:
    """Whether the recorded decode step's cross-attention cache is what ``encoder`` (``EncoderWithCrossCache``) computes."""
    from hfx._capture.cross_cache import reproduces_cross_cache

    cache = next((v for v in decode.values() if is_cache(v)), None)
    return "encoder" in recorded.encoders and reproduces_cross_cache(encoder, recorded.encoders["encoder"][1], cache)


def _model_spec(model: torch.nn.Module) -> ModelSpec:
    """The model's class and config (none for a plain ``nn.Module``)."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    return ModelSpec(class_name=type(model).__name__, config=json.loads(to_json(use_diff=False)) if to_json else {})


def _internal_cache_decode(capture: Capture, length: Any, *, custom_ops: bool, generation_config: Any) -> Components:
    """The one ``decode`` component of ``InternalCacheLM``: the runner's ``forward(tokens, input_pos)``."""
    from hfx._capture.internal_cache import InternalCacheLM, cache_layers, load_custom_ops

    model = capture.source
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        msg = f"decompose: internal_cache_length must be an int >= 2 (the cache's positions), got {length!r}"
        raise ValueError(msg)
    kind = ("an encoder-decoder" if getattr(model.config, "is_encoder_decoder", False)
            else "a multimodal model" if feature_methods(model) else None if can_generate(model) else "not generative")
    if kind is not None or "input_ids" not in capture.kwargs:
        what = kind or "captured without input_ids"
        msg = (f"decompose(internal_cache_length=...): {type(model).__name__} is {what}; a cache in buffers "
               "serves a text decoder (tokens in, logits out)")
        raise ValueError(msg)
    if custom_ops:
        load_custom_ops()
    prompt = capture.kwargs["input_ids"][:1]
    # Two tokens at least, so that the token axis is not specialised to 1.
    tokens = (prompt if prompt.shape[1] >= 2 else prompt.repeat(1, 2))[:, :length]
    module = InternalCacheLM(model, cache_layers(model, tokens), length, custom_ops=custom_ops)
    shapes = DynamicShapes(axes={"tokens": {1: "sequence"}}, bounds={"sequence": (1, length)})
    # The wrapper is the source: export flattens and patches what it traces (it holds the model, and the patches reach it).
    decode = Capture(module=module, source=module, kwargs={"tokens": tokens, "input_pos": torch.zeros(1, dtype=torch.long)},
                     dynamic_shapes=shapes, name="decode")
    meta = GenerationMeta(generation=_generation_settings(model, generation_config),
                          roles=ComponentRoles(internal_cache_length=length), model=_model_spec(model))
    return Components(items={"decode": decode}, meta=meta)


def _generation_settings(model: torch.nn.Module, generation_config: Any = None) -> GenerationSettings:
    """The generation config ``decompose`` runs with, as JSON, the decoder start token and whether the model is an encoder-decoder."""
    config = generation_config if generation_config is not None else model.generation_config
    settings = json.loads(config.to_json_string(use_diff=False))
    # As generate() picks the first decoder token (GenerationMixin._get_decoder_start_token_id): the start token,
    # else BOS (MBart, PLBart, T5Gemma leave the start token unset).
    start = next((v for v in (settings.get("decoder_start_token_id"), getattr(model.config, "decoder_start_token_id", None),
                              settings.get("bos_token_id")) if v is not None), None)
    return GenerationSettings(
        config=settings,
        decoder_start_token_id=start,
        is_encoder_decoder=bool(getattr(model.config, "is_encoder_decoder", False)),
        prompts_the_decoder=bool(getattr(model.config, "is_encoder_decoder", False))
        and getattr(model, "main_input_name", "input_ids") != "input_ids",
    )


def _may_merge_steps(model: torch.nn.Module, generation_config: Any) -> bool:
    """Whether ``decompose`` merges ``model``'s steps by default: without a static cache (the recorded cache,
    and for a multimodal model the split of its prefill, decide after)."""
    config = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    return getattr(config, "cache_implementation", None) is None


def prompt_component(names: Iterable[str]) -> str | None:
    """Which of the components ``names`` takes the prompt: ``language_model`` (a split multimodal prefill),
    ``prefill``, else ``decode`` (one graph for prompt and steps); ``None`` without any."""
    names = set(names)
    return next((name for name in ("language_model", "prefill", "decode") if name in names), None)


def step_component(names: Iterable[str]) -> str | None:
    """Which of the components ``names`` takes the steps after the prompt: ``decode``, else a split multimodal
    prefill's ``language_model`` (it takes the steps too when there is no ``decode``); ``None`` without either."""
    names = set(names)
    return next((name for name in ("decode", "language_model") if name in names), None)


def full_attention_cache(calls: list[dict[str, Any]]) -> bool:
    """Whether the recorded steps' cache holds only full-attention layers, which one graph fills from empty.

    A sliding-window layer trims its past inside the graph and a state-space
    layer takes one token per step: those models keep a ``prefill``.
    """
    from transformers.cache_utils import DynamicLayer

    cache = next((v for call in calls[1:] for v in call.values() if is_cache(v)), None)
    cache = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's: the part that grows
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _steps(model: torch.nn.Module, inputs: Mapping[str, Any], multi_token: bool) -> int:
    """New tokens to generate so that a decode step has a past of at least ``_MIN_PAST`` (+1 to merge two)."""
    prompt = 1 if getattr(model.config, "is_encoder_decoder", False) else int(inputs["input_ids"].shape[-1]) if "input_ids" in inputs else 1
    needed = max(0, _MIN_PAST - prompt)
    return 2 + needed + (1 if multi_token else 0)


def _pick_decode(calls: list[dict[str, Any]], *, multi_token: bool) -> dict[str, Any] | None:
    for index, call in enumerate(calls[1:], start=1):
        past = _past_length(call)
        if past is None or past >= _MIN_PAST:
            if not multi_token:
                return call
            if index + 1 < len(calls):
                return _merge_decode_steps(call, calls[index + 1])
    return None
