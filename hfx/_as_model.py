"""``as_model``: exported graphs as a transformers model that transformers' own ``generate()`` and ``pipeline()`` drive.

The model is the original class built on the ``meta`` device from the saved
config (its methods, no weights), with ``forward`` running the prompt or decode
component, ``get_encoder`` the encoder component, and the saved generation
config. Everything ``GenerationMixin`` does (beam search with the cache
reordered, every logits processor, stopping criteria, streamers) and every
``pipeline`` that takes a model then runs over the programs, on any runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from hfx._capture.cross_cache import CROSS_KEY, filled_cross_cache, split_encoder_output, stacked_cross_cache
from hfx._capture.decompose import prompt_component, step_component
from hfx._capture.positions import model_class
from hfx._contract import input_keys
from hfx._errors import InputError, argument_error
from hfx._generate import initial_cache, run_feature_encoders, step, with_positions
from hfx._kept_positions import KEPT_INPUT, kept_positions
from hfx._pytree import spec_caches
from hfx._records import Components
from hfx._upstream import cache_argument

_CPU = torch.device("cpu")


def as_model(programs: Components, /) -> Any:
    """A transformers model over ``programs``: ``generate(...)``, beam search and ``pipeline(...)`` on any runtime.

    ``programs``: the ``Components`` of ``decompose``, exported, lowered or
    loaded with ``hfx.load``. The model is the original class (its name, config,
    generation config and methods) with no weights: its parameters are on the
    ``meta`` device, so it holds only what the runtime holds. Its ``forward``
    runs the prompt component while the cache is empty, then ``decode`` (a
    multimodal model's ``embed_tokens``, ``language_model`` and ``lm_head`` when
    its language model takes the steps); an encoder-decoder's ``get_encoder()``
    runs the ``encoder`` component. Use it where ``hfx.generate``'s greedy/sampling loop is not enough: beam search,
    stopping strings, streamers, ``transformers.pipeline(..., model=as_model(parts))``.

    Raises:
        TypeError: ``programs`` is not ``Components``.
        ValueError: the components lack what transformers' generate needs (a
            ``decode`` component or a ``language_model`` that takes the steps, the model
            class), keep their cache in the program's
            buffers (``internal_cache_length``), which transformers cannot reorder or
            hand back, or put a prefill before a stateful OpenVINO decode. A stateful
            decode keeps its cache inside OpenVINO: beam search reorders it through
            ``beam_idx`` (``RuntimeCache``); assisted decoding, which crops the cache, is
            an error.

    Example:
        >>> import hfx
        >>> from hfx import zoo
        >>> parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama"), zoo.build("llama"))))
        >>> model = as_model(parts)
        >>> prompt = zoo.inputs("llama", batch=1, sequence=4)
        >>> model.generate(**prompt, max_new_tokens=3, num_beams=2, do_sample=False).shape
        torch.Size([1, 7])
        >>> all(p.is_meta for p in model.parameters())
        True
    """
    _check(programs)
    meta = programs.meta
    cls = _view_class(model_class(meta.model.class_name))
    config = cls.config_class.from_dict(dict(meta.model.config))
    with torch.device("meta"):
        model = cls(config)
    model.eval()
    model.hfx_programs = programs
    model.generation_config = _saved_generation_config(meta.generation.config, model.generation_config)
    return model


def _check(programs: Any) -> None:
    if not isinstance(programs, Components):
        raise argument_error("as_model(programs)", "programs", "the Components of decompose", programs)
    roles = programs.meta.roles
    if step_component(programs) is None or not programs.meta.model.class_name:
        msg = ("as_model takes the Components of decompose (a 'decode' component, or a 'language_model' that takes "
               f"the steps, and the model's class), exported, lowered or loaded; got {list(programs)}")
        raise ValueError(msg)
    if roles.internal_cache_length is not None:
        msg = ("as_model: the decode component keeps its KV cache in the program's buffers "
               "(decompose(internal_cache_length=...)), one sequence at a time, which transformers' generate cannot "
               "hand in nor reorder. Decompose without internal_cache_length for as_model, or run hfx.generate.")
        raise ValueError(msg)
    if getattr(programs.get("decode"), "state", ()) and prompt_component(programs) != "decode":
        msg = (f"as_model: the decode component keeps its cache inside the runtime, so it prefills too; the "
               f"{prompt_component(programs)!r} component cannot hand it a cache. Decompose with "
               "multi_token_decode=True (no prefill component).")
        raise ValueError(msg)
    if any(len(spec.shape) == 3 and isinstance(spec.shape[0], int)
           for name in ("prefill", "decode", "language_model") if name in programs
           for spec in programs[name].io.inputs if spec.name == "position_ids"):
        msg = ("as_model: the model's rotary positions have M-RoPE sections (Qwen2-VL and kin), which its own "
               "forward computes from the whole prompt; as_model does not rebuild them. Run hfx.generate.")
        raise ValueError(msg)


def _saved_generation_config(settings: Mapping[str, Any], default: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig.from_dict(dict(settings)) if settings else default


@functools.cache
def _view_class(cls: type) -> type:
    """A subclass of the transformers class ``cls`` whose forward runs exported programs (same name, for pipelines)."""
    namespace = {
        "__module__": cls.__module__,
        "__doc__": f"{cls.__name__} over exported programs (hfx.as_model): no weights, forward runs the programs.",
        "forward": _as_method_of(cls.forward, _forward),
        "device": property(lambda self: _CPU),
        "get_encoder": _get_encoder,
        "generate": _as_method_of(cls.generate, _generate),
        "prepare_inputs_for_generation": _as_method_of(cls.prepare_inputs_for_generation, _prepared_inputs),
        # Image and audio features are encoded by the programs inside forward, not by transformers before it.
        "_supports_mm_encoder_outputs": classmethod(lambda cls: False),
    }
    return type(cls.__name__, (cls,), namespace)


def _as_method_of(original: Any, body: Any) -> Any:
    """A new function running ``body`` that shows ``original``'s name and signature (transformers reads them).

    A new one per class: ``functools.wraps`` writes onto the function it is given, so wrapping ``body``
    itself would give every view class the signature of the last class wrapped.
    """

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return body(self, *args, **kwargs)

    return method


def _generate(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' ``generate`` with the programs' cache classes registered for the whole call."""
    settings = kwargs.get("generation_config") or self.generation_config
    drafts = [key for key in ("assistant_model", "prompt_lookup_num_tokens")
              if kwargs.get(key) is not None or getattr(settings, key, None) is not None]
    if drafts and getattr(self.hfx_programs.get("decode"), "state", ()):
        raise ValueError(RuntimeCache.CANNOT_CROP)
    with spec_caches(*(program.io for program in self.hfx_programs.values())):
        return super(type(self), self).generate(*args, **kwargs)


def _prepared_inputs(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' step inputs with the 2D attention mask: for a static (compilable) cache transformers makes
    a 4D mask here, but the exported graphs take the 2D one and build their own."""
    inputs = super(type(self), self).prepare_inputs_for_generation(*args, **kwargs)
    key = "decoder_attention_mask" if self.config.is_encoder_decoder else "attention_mask"
    if kwargs.get(key) is not None:
        inputs[key] = kwargs[key]
    return inputs


def _get_encoder(self: Any, *args: Any, **kwargs: Any) -> Any:
    programs = self.hfx_programs
    if "encoder" not in programs:
        msg = f"as_model: the programs have no 'encoder' component ({list(programs)})"
        raise ValueError(msg)
    return _Encoder(programs["encoder"])


class _Encoder:
    """The ``encoder`` component, called as transformers calls ``model.get_encoder()``."""

    def __init__(self, program: Any) -> None:
        self.program = program

    def forward(self, **kwargs: Any) -> Any:
        outputs, cross = split_encoder_output(self.program(**{k: v for k, v in kwargs.items() if k in input_keys(self.program.io)}))
        if cross is not None:  # handed to the first decode step through generate, which expands it for beams
            outputs[CROSS_KEY] = stacked_cross_cache(cross)
        return outputs

    __call__ = forward


# What transformers' generate passes to forward that no exported program takes.
_NOT_INPUTS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states", "logits_to_keep")


def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The prompt component while the cache is empty, else ``decode``: ``logits`` and the cache handed back."""
    if args:
        msg = "as_model: call the model with keyword arguments (input_ids=..., attention_mask=...)"
        raise TypeError(msg)
    programs = self.hfx_programs
    meta = programs.meta
    encoder_decoder = meta.generation.is_encoder_decoder
    token_key, mask_key = ("decoder_input_ids", "decoder_attention_mask") if encoder_decoder else ("input_ids", "attention_mask")
    state = {k: v for k, v in kwargs.items() if v is not None and k not in _NOT_INPUTS}
    if token_key not in state:
        msg = f"as_model: forward needs {token_key} (inputs_embeds are not an input of the exported graphs)"
        raise InputError(msg)
    tokens = state[token_key]
    state[KEPT_INPUT] = kept_positions(kwargs.get(KEPT_INPUT), tokens.shape[-1])  # a multi-token decode graph's
    cache_key = cache_argument(state) or meta.roles.cache_input or "past_key_values"
    cache = state.get(cache_key)
    past = int(cache.get_seq_length()) if cache is not None else 0
    name = prompt_component(programs) if past == 0 else step_component(programs)
    program = programs[name]
    if getattr(program, "state", ()):
        return _stateful_forward(programs, program, state, cache_key, past, mask_key, encoder_decoder)
    own_key = cache_argument(input_keys(program.io)) or cache_key
    state[own_key] = initial_cache(program, tokens.shape[0], own_key) if past == 0 else state.pop(cache_key)
    stacked = state["encoder_outputs"].get(CROSS_KEY) if encoder_decoder and "encoder_outputs" in state else None
    if stacked is not None:  # an EncoderWithCrossCache encoder: the decode graph takes the outputs without the cache
        state["encoder_outputs"] = type(state["encoder_outputs"])(
            **{k: v for k, v in state["encoder_outputs"].items() if k != CROSS_KEY})
        if past == 0:
            state[own_key] = filled_cross_cache(state[own_key], stacked)
    if mask_key not in state:
        state[mask_key] = torch.ones(tokens.shape[0], past + tokens.shape[1], dtype=torch.long)
    features = run_feature_encoders(programs, state) if past == 0 else {}
    with_positions(programs, 0, state, tokens, state[mask_key], None)
    logits, returned = step(programs, name, program, state, features)
    return _output(encoder_decoder, logits, returned or state[own_key])


class RuntimeCache:
    """The KV cache a stateful program keeps inside the runtime, as transformers' ``generate`` sees it.

    It counts the tokens the runtime holds and the row order beam search asks for
    (``reorder_cache``), which the next call hands the program as ``beam_idx``.
    It cannot be cropped (assisted decoding) nor its rows read.
    """

    def __init__(self, run: Any, batch: int) -> None:
        self.run = run  # the program's session: its calls share one request, so the cache grows inside
        self.length = 0
        self.beam_idx = torch.arange(batch, dtype=torch.int32)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The tokens the runtime's cache holds."""
        return self.length

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Reorder the rows at the next call (composed with a reorder not yet applied)."""
        self.beam_idx = self.beam_idx[beam_idx.to(torch.long)]

    is_croppable = False
    CANNOT_CROP = ("as_model: a stateful program's cache lives inside the runtime and cannot be cropped (assisted "
                   "and prompt-lookup decoding roll back rejected tokens); lower with lower_to_ov(stateful=False) "
                   "for them.")

    def crop(self, max_length: int) -> None:
        raise ValueError(self.CANNOT_CROP)


def _stateful_forward(programs: Components, program: Any, state: dict[str, Any], cache_key: str, past: int,
                      mask_key: str, encoder_decoder: bool) -> Any:
    """One call of a stateful decode: a new session for a new cache, the pending beam order as ``beam_idx``."""
    from hfx._generate import runner

    tokens = state[next(key for key in ("input_ids", "decoder_input_ids") if key in state)]
    given = state.pop(cache_key, None)
    cache = given if isinstance(given, RuntimeCache) and past else RuntimeCache(runner(program), tokens.shape[0])
    if mask_key not in state:
        state[mask_key] = torch.ones(tokens.shape[0], past + tokens.shape[1], dtype=torch.long)
    with_positions(programs, 0, state, tokens, state[mask_key], None)
    state["beam_idx"] = cache.beam_idx
    logits, _ = step(programs, "decode", cache.run, state, {})
    cache.length += tokens.shape[1]
    cache.beam_idx = torch.arange(tokens.shape[0], dtype=torch.int32)
    return _output(encoder_decoder, logits, cache)


def _output(encoder_decoder: bool, logits: torch.Tensor, cache: Any) -> Any:
    """The model output transformers' generate reads: the logits, and the cache under the installed release's name."""
    from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput

    cls = Seq2SeqLMOutput if encoder_decoder else CausalLMOutputWithPast
    return cls(logits=logits, **{cache_argument(cls.__dataclass_fields__): cache})
