"""The package ONNX Runtime GenAI loads: ``genai_config.json``, one decoder ONNX graph, the tokenizer files and the configs.

``onnxruntime_genai.Model(directory)`` reads ``genai_config.json`` (the model
type, the context length, the decoder's file, sizes and input and output names,
the special tokens and the defaults of its search) and runs the graph it names
for the prompt and every step, feeding ``input_ids``, ``attention_mask``,
``position_ids`` and the cache of the step before. hfx's decode graph takes those
names as they are: the name templates (``past_key_values.layers.%d.keys`` ...)
are the config's own, as its builder writes them for ``past_key_values.%d.key``
(onnxruntime_genai ``models/builders/base.py``, ``make_genai_config``). The cache
grows each step (``past_present_share_buffer`` false: the graph's GroupQueryAttention takes
the cache as its past and returns the grown cache, as every row's length is the mask's). ``onnxruntime_genai.Tokenizer``
reads ``tokenizer.json`` and ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from hfx._package.every_position import every_position
from hfx._package.text_decoder import decode_component, refusal, write_model_files
from hfx._records import Components, GenerationMeta, IoSpec
from hfx.backends._onnx import OnnxProgram, lower_to_onnx

CONSUMER = "ort-genai"
# transformers model_type -> the model type onnxruntime-genai 0.18 runs it as: one it lists and runs as a plain
# decoder (the graph is hfx's; the type picks genai's path). genai's own "gpt2" is a legacy path (one combined
# past_%d per layer), so GPT-2 runs as "llama", the decoder-only path. Read-only.
GENAI_TYPES: Mapping[str, str] = MappingProxyType(
    {**{name: name for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "granite", "smollm3")},
     "gpt2": "llama", "olmo2": "olmo"}
)
_FED_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})
_KEYS, _VALUES = "past_key_values.layers.%d.keys", "past_key_values.layers.%d.values"
_PRESENT_KEYS, _PRESENT_VALUES = "present.layers.%d.keys", "present.layers.%d.values"
# The search options genai reads, with its defaults where the generation config leaves them unset.
_SEARCH_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
     "repetition_penalty": 1.0, "length_penalty": 1.0, "diversity_penalty": 0.0, "no_repeat_ngram_size": 0,
     "min_length": 0}
)


def _cache_layers(io: IoSpec) -> int:
    """The number of layers whose keys and values the graph takes and returns under genai's name templates."""
    past = {spec.name for spec in io.inputs if spec.name.startswith("past_key_values.")}
    layers = len(past) // 2
    expected = {template % i for i in range(layers) for template in (_KEYS, _VALUES)}
    present = {template % i for i in range(layers) for template in (_PRESENT_KEYS, _PRESENT_VALUES)}
    if not layers or past != expected or not present <= set(io.output_names) or "logits" not in io.output_names:
        raise refusal(CONSUMER, f"the decode graph's cache is not per-layer keys and values (inputs {sorted(past)})",
                      "Package a transformer decoder with a DynamicCache (not a state-space or hybrid model).")
    if io.updates or any(not isinstance(spec.shape[2], str) for spec in io.inputs if spec.name in past):
        raise refusal(CONSUMER, "the decode graph holds a static cache; genai feeds a cache that grows each step",
                      "Decompose without a static cache (no generation_config with cache_implementation='static').")
    return layers


def _model_config(meta: GenerationMeta) -> Any:
    """The transformers config the model was captured with (its ``attribute_map`` reads ``n_embd`` as ``hidden_size``)."""
    import transformers

    config = dict(meta.model.config)
    model_type = config.pop("model_type", None)
    if model_type not in GENAI_TYPES:
        raise refusal(CONSUMER, f"model type {model_type!r} is not one ONNX Runtime GenAI runs as a decoder",
                      f"Package one of {sorted(GENAI_TYPES)}.")
    config = transformers.AutoConfig.for_model(model_type, **config)
    layer_types = getattr(config, "layer_types", None)
    windowed = ("sliding_attention" in layer_types if layer_types is not None
                else getattr(config, "sliding_window", None) is not None)
    if windowed:
        raise refusal(CONSUMER, f"{model_type} has sliding-window layers, whose cache transformers crops to the "
                      "window; genai grows every layer's cache by each step",
                      "Package a model whose layers all attend to the full sequence.")
    return config


def _special_tokens(meta: GenerationMeta, config: Any, tokenizer: Any) -> dict[str, Any]:
    """BOS, EOS (an int or a list) and pad: the generation config's, else the model's, else the tokenizer's."""
    generation = meta.generation.config

    def first(name: str) -> Any:
        values = (generation.get(name), getattr(config, name, None), getattr(tokenizer, name, None))
        return next((value for value in values if value is not None), None)

    eos = first("eos_token_id")
    if eos is None:
        raise refusal(CONSUMER, "the model, its generation config and the tokenizer name no EOS token",
                      "Set model.generation_config.eos_token_id before decompose.")
    eos_ids = list(eos) if isinstance(eos, list | tuple) else [eos]
    pad = first("pad_token_id")
    bos = first("bos_token_id")
    return {"bos_token_id": bos if bos is not None else eos_ids[0], "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else eos_ids[0]}


def _context_length(io: IoSpec, config: Any) -> int:
    """The longest prompt plus answer: the export's bound on ``total_sequence`` or the model's positions, the smaller."""
    limits = [io.bounds.get("total_sequence", (1, None))[1], getattr(config, "max_position_embeddings", None)]
    limits = [int(limit) for limit in limits if isinstance(limit, int)]
    if not limits:
        raise refusal(CONSUMER, "neither the export nor the model bounds the sequence (genai needs a context length)",
                      "Capture with infer_dynamic_shapes(bounds={'total_sequence': (1, N)}) or set max_position_embeddings.")
    return min(limits)


def genai_config(decode: OnnxProgram, meta: GenerationMeta, *, filename: str, tokenizer: Any) -> dict[str, Any]:
    """The ``genai_config.json`` of ``decode`` (saved as ``filename``), in the layout genai's builder writes."""
    io = decode.io
    layers = _cache_layers(io)
    config = _model_config(meta)
    context = _context_length(io, config)
    key = next(spec for spec in io.inputs if spec.name == _KEYS % 0)
    logits = next(spec for spec in io.outputs if spec.name == "logits")
    inputs = {name: name for name in ("input_ids", "attention_mask", "position_ids") if name in io.input_names}
    generation = meta.generation.config
    search = {name: generation.get(name) if generation.get(name) is not None else default
              for name, default in _SEARCH_DEFAULTS.items()}
    return {
        "model": {
            **_special_tokens(meta, config, tokenizer),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": key.shape[3],
                "hidden_size": config.hidden_size,
                "inputs": {**inputs, "past_key_names": _KEYS, "past_value_names": _VALUES},
                "outputs": {"logits": "logits", "present_key_names": _PRESENT_KEYS,
                            "present_value_names": _PRESENT_VALUES},
                "num_attention_heads": config.num_attention_heads,
                "num_hidden_layers": layers,
                "num_key_value_heads": key.shape[1],
            },
            "type": GENAI_TYPES[config.model_type],
            "vocab_size": logits.shape[-1] if isinstance(logits.shape[-1], int) else config.vocab_size,
        },
        "search": {**search, "early_stopping": True, "past_present_share_buffer": False,
                   "max_length": min(generation.get("max_length") or context, context)},
    }


def write_ort_genai(programs: Components, staging: Path, *, tokenizer: Any) -> None:
    """Write the ONNX Runtime GenAI files of ``programs`` (a decomposed text decoder) into ``staging``.

    The decoder graph is also hfx's own saved component (``hfx.json`` names
    ``model.onnx`` as component ``decode``), so ``hfx.load`` and ``hfx.generate``
    read the same package and the weights are stored once.
    """
    from hfx._save import MANIFEST


    def lower(record: Any) -> OnnxProgram:
        _model_config(programs.meta)  # refuse a model genai cannot take before the slow lowering
        # Named model.onnx as genai's builder names it, after the lowering: the record's other lowerings are the same one.
        return attrs.evolve(lower_to_onnx(record), name="model")

    decode = every_position(decode_component(programs, consumer=CONSUMER, pipeline="onnxruntime_genai.Model",
                                             fed=_FED_INPUTS, lower=lower, record=OnnxProgram))
    write_model_files(staging, Components(items={"decode": decode}, meta=programs.meta), tokenizer=tokenizer)
    filename = json.loads((staging / MANIFEST).read_text())["components"]["decode"]["files"][0]
    config = genai_config(decode, programs.meta, filename=filename, tokenizer=tokenizer)
    (staging / "genai_config.json").write_text(json.dumps(config, indent=4))
