"""``decompose``: split a generative model into the graphs ``generate()`` really runs.

It runs the model's own ``generate()`` once with forward hooks and records the
exact keyword arguments of each call: the encoder (for encoder-decoder
models, called outside ``forward``), the prefill and a decode step.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._caches import is_cache
from hfx._dynamic_shapes import infer_dynamic_shapes, owned_tensors
from hfx._errors import CaptureError, describe
from hfx._records import Capture, Components, DynamicShapes
from hfx.patches import preserve_module_state

_MIN_PAST = 2  # a decode captured with a past of 0 or 1 would specialise that axis


def can_generate(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a working ``generate()`` (a language-model head)."""
    check = getattr(model, "can_generate", None)
    return bool(check()) if callable(check) else False


@contextlib.contextmanager
def _recording(module: torch.nn.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
    """Record a deep copy of the keyword arguments of every call of ``module`` inside the block."""

    def hook(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bound = dict(kwargs)
        if args:
            import inspect

            names = list(inspect.signature(mod.forward).parameters)
            bound.update(zip(names, args))
        calls.append(copy.deepcopy(bound))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


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


def _encoder(model: torch.nn.Module) -> torch.nn.Module | None:
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    get = getattr(model, "get_encoder", None)
    return get() if callable(get) else None


def _generate_calls(
    model: torch.nn.Module, inputs: Mapping[str, Any], steps: int, generation_config: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Run ``generate`` for ``steps`` new tokens; return the encoder calls, the forward calls and the output length."""
    calls: list[dict[str, Any]] = []
    encoder_calls: list[dict[str, Any]] = []
    encoder = _encoder(model)
    options = {"max_new_tokens": steps, "min_new_tokens": steps, "do_sample": False}
    if generation_config is not None:
        options["generation_config"] = generation_config
    with contextlib.ExitStack() as stack:
        stack.enter_context(preserve_module_state(model))
        stack.enter_context(_recording(model, calls))
        if encoder is not None:
            stack.enter_context(_recording(encoder, encoder_calls))
        with torch.no_grad():
            output = model.generate(**copy.deepcopy(dict(inputs)), **options)
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return encoder_calls, calls, int(sequences.shape[-1])


def _with_mask(capture: Capture) -> dict[str, Any]:
    """The generate inputs, with a mask that pads the first position of the first row.

    ``generate()`` drops an all-ones ``attention_mask``, and a graph traced
    without one cannot serve a left-padded batch. Only shapes matter to the
    trace, so one padded position makes every graph take a mask input.
    """
    inputs = dict(capture.kwargs)
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[-1] < 2:
        return inputs
    mask = inputs.get("attention_mask")
    if mask is None or bool(mask.all()):
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        inputs["attention_mask"] = mask
    return inputs


def _with_2d_mask(call: dict[str, Any], inputs: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The call with the 2D padding mask in place of the 4D mask generate builds for static caches.

    ``forward`` builds the same 4D mask from a 2D one (and the cache), so the
    graph takes the mask every runtime's generate loop can grow by one column.
    """
    mask = call.get("attention_mask")
    prompt_mask = inputs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or not isinstance(prompt_mask, torch.Tensor):
        return call
    batch = prompt_mask.shape[0]
    grown = torch.ones(batch, index, dtype=prompt_mask.dtype)
    return {**call, "attention_mask": torch.cat([prompt_mask, grown], dim=-1)}


def _merge_decode_steps(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One decode call for two query tokens: the first step's cache, both steps' new tokens.

    It returns the logits of every new token (``logits_to_keep=0``), which a
    block of speculative tokens needs; generate reads the last one.
    """
    merged = dict(first)
    if "logits_to_keep" in merged:
        merged["logits_to_keep"] = 0
    for key in ("input_ids", "decoder_input_ids", "position_ids", "cache_position", "decoder_position_ids"):
        if isinstance(first.get(key), torch.Tensor) and isinstance(second.get(key), torch.Tensor):
            merged[key] = torch.cat([first[key], second[key]], dim=-1)
    for key in ("attention_mask", "decoder_attention_mask"):
        if isinstance(second.get(key), torch.Tensor):
            merged[key] = second[key]
    return merged


def _decode_shapes(capture: Capture, *, multi_token: bool) -> DynamicShapes:
    """The decode graph's shapes: a single-token step keeps its query axis static."""
    shapes = infer_dynamic_shapes(capture)
    if multi_token:  # the same graph also prefills, from an empty cache
        bounds = {**shapes.bounds}
        if "past_sequence" in bounds:
            bounds["past_sequence"] = (0, bounds["past_sequence"][1])
        return DynamicShapes(axes=shapes.axes, bounds=bounds)
    query = {"sequence", "decoder_sequence"} - {"sequence"} if "decoder_input_ids" in capture.kwargs else {"sequence"}
    axes = {leaf: {a: d for a, d in per_axis.items() if d not in query} for leaf, per_axis in shapes.axes.items()}
    return DynamicShapes(axes=axes, bounds={d: b for d, b in shapes.bounds.items() if d not in query})


@curry
def decompose(
    capture: Capture,
    /,
    *,
    multi_token_decode: bool = False,
    generation_config: Any = None,
) -> Components:
    """Split a captured model into the components ``generate()`` runs, with each call's exact inputs.

    ``capture`` holds the *generate* inputs (``input_ids``, ``attention_mask``,
    ``input_features`` ...). The model's real ``generate()`` runs once with
    hooks (2 new tokens, more when needed so that the decode step sees a past
    of at least 2 and does not specialise that axis).

    Components: decoder-only models give ``prefill`` and ``decode``;
    encoder-decoder models give ``encoder``, ``prefill`` and ``decode``; a
    model that does not generate gives one component, ``model``. With
    ``multi_token_decode`` there is no ``prefill``: the decode graph takes
    1..N new tokens over a past of 0..N, so it prefills too.

    Args:
        capture: a ``Capture`` of generate inputs.
        multi_token_decode: make one decode graph take 1..N new tokens at once
            (prefill with an empty cache, ordinary decode, speculative blocks).
        generation_config: passed to ``generate`` (e.g. a static cache).

    Returns:
        ``Components`` of ``Capture`` records, ready for ``export`` and the lowerings.

    Raises:
        CaptureError: ``generate`` did not call ``forward`` as expected.

    Example:
        >>> from hfx import capture, zoo
        >>> parts = decompose(capture(zoo.inputs("llama"), zoo.build("llama")))
        >>> list(parts)
        ['prefill', 'decode']
    """
    model = capture.source
    if not can_generate(model):
        return Components(items={"model": attrs.evolve(capture, name="model")})
    inputs = _with_mask(capture)
    steps = _steps(model, inputs, multi_token_decode)
    encoder_calls, calls, length = _generate_calls(model, inputs, steps, generation_config)
    calls = [_with_2d_mask(call, inputs, index) for index, call in enumerate(calls)]
    decode = _pick_decode(calls, multi_token=multi_token_decode)
    if not calls or decode is None:
        what = f"generate() made {len(calls)} forward call(s), none a decode step with a past of >= {_MIN_PAST}."
        raise CaptureError(describe("decompose", model, "decode", what, "Pass a prompt of at least 2 tokens."))
    parts: dict[str, Capture] = {}
    if encoder_calls:
        encoder = _encoder(model)
        parts["encoder"] = Capture(module=encoder, source=encoder, kwargs=encoder_calls[0], name="encoder")
    if not multi_token_decode:  # a multi-token decode graph prefills too, from an empty cache
        parts["prefill"] = Capture(module=model, source=model, kwargs=calls[0], name="prefill")
    decode_capture = Capture(module=model, source=model, kwargs=decode, name="decode")
    parts["decode"] = attrs.evolve(decode_capture, dynamic_shapes=_decode_shapes(decode_capture, multi_token=multi_token_decode))
    meta = generation_meta(model, generation_config)
    meta["cache_input"] = next((k for k, v in decode.items() if is_cache(v)), None)
    # Some generate()s (Whisper's) return the decoder ids without the start token.
    meta["returns_start_token"] = length == steps + 1 if meta["is_encoder_decoder"] else True
    return Components(items=parts, meta=meta)


def generation_meta(model: torch.nn.Module, generation_config: Any = None) -> dict[str, Any]:
    """What ``generate`` needs besides the graphs: the generation config and the decoder start token."""
    import json

    config = generation_config if generation_config is not None else model.generation_config
    settings = json.loads(config.to_json_string(use_diff=False))
    start = settings.get("decoder_start_token_id")
    start = start if start is not None else getattr(model.config, "decoder_start_token_id", None)
    return {
        "generation_config": settings,
        "is_encoder_decoder": bool(getattr(model.config, "is_encoder_decoder", False)),
        "decoder_start_token_id": start,
        "model_class": type(model).__name__,
    }


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
