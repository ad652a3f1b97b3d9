"""The package Transformers.js (``@huggingface/transformers``) loads: ``onnx/model.onnx``, the configs and the tokenizer.

``pipeline("text-generation", directory)`` and ``pipeline("feature-extraction", directory)``
read (Transformers.js 4.3, ``src/models/session.js``, ``src/utils/model-loader.js``, ``src/configs.js``):

* ``config.json``: ``model_type`` picks the model class (``llama`` -> ``LlamaForCausalLM``,
  ``bert`` -> ``BertModel``); ``transformers.js_config`` holds the default ``dtype`` and, per
  ONNX file, whether its weights are in a ``<file>_data`` file (``use_external_data_format``).
* ``onnx/model<suffix>.onnx`` (+ ``onnx/model<suffix>.onnx_data``), the suffix chosen by ``dtype``:
  ``""`` for fp32, ``"_quantized"`` for q8, ``"_q4"`` for q4 (``src/utils/dtypes.js``).
* a decoder's cache inputs ``past_key_values.N.key/value`` and outputs ``present.N.key/value``
  (``getPastKeyValues`` turns ``present`` into ``past_key_values``); the empty cache of the first
  call is built from the graph's input shapes, where only an axis named ``batch_size`` is known
  (``addPastKeyValues``), and ``position_ids`` are made from the attention mask.
* ``generation_config.json`` for decoders, ``tokenizer.json`` + ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from hfx._package.every_position import every_position
from hfx._package.text_decoder import decode_component, graph_arguments
from hfx._records import Capture, Components, Exported, TensorSpec

CONSUMER = "transformers.js"
# A quantized variant -> (the file suffix Transformers.js reads for that dtype, the quantize_onnx mode that makes it).
VARIANTS: Mapping[str, tuple[str, str]] = MappingProxyType({"q8": ("_quantized", "dynamic"), "q4": ("_q4", "int4")})
# What Transformers.js feeds a decoder besides its cache (decoder_forward), and an encoder (its tokenizer's outputs).
_DECODER_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})
_ENCODER_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
# hfx's per-layer cache names -> Transformers.js's (past_key_values.layers.0.keys -> past_key_values.0.key).
_CACHE_NAME = re.compile(r"^(past_key_values|present)\.layers\.(\d+)\.(key|value)s$")


def _refuse(reason: str, todo: str) -> ValueError:
    return ValueError(f"package for {CONSUMER}: {reason}. {todo}")


def transformers_js_names(program: Any) -> Any:
    """A new ``OnnxProgram`` of ``program`` with Transformers.js's cache names and ``batch_size`` as its batch axis.

    ``past_key_values.layers.N.keys`` becomes ``past_key_values.N.key`` and
    ``present.layers.N.values`` ``present.N.value``, in the graph and in ``io``;
    Transformers.js sizes its first, empty cache by the axis named ``batch_size``.
    ``io`` keeps hfx's axis names, which ``hfx.generate`` reads. ``program`` is not changed.
    """
    import onnx_ir as ir

    model = program.model.clone()  # the graph is new, the weights are shared
    for value in (*model.graph.inputs, *model.graph.outputs):
        value.name = _js_name(value.name)
        if value.shape is not None:
            value.shape = ir.Shape(["batch_size" if str(dim) == "batch" else dim for dim in value.shape])
    io = attrs.evolve(program.io, inputs=_renamed(program.io.inputs), outputs=_renamed(program.io.outputs),
                      updates=[_js_name(name) for name in program.io.updates])
    return attrs.evolve(program, model=model, io=io, name="model")


def _js_name(name: str) -> str:
    return _CACHE_NAME.sub(r"\1.\2.\3", name)


def _renamed(specs: tuple[TensorSpec, ...]) -> list[TensorSpec]:
    return [attrs.evolve(spec, name=_js_name(spec.name)) for spec in specs]


def lowered_for_node(record: Any) -> Any:
    """``record`` lowered with the fusions onnxruntime-node runs: ``ORT_FUSIONS``, without the attention fusion.

    Transformers.js 4.3.2 runs graphs on onnxruntime-node 1.30, whose ``GroupQueryAttention``
    takes 16 inputs; hfx's attention fusion (``ORT_ATTENTION_FUSIONS``) writes ONNX Runtime
    1.32's form with 17 (``query_seqlens``), which node refuses to load ("input size 17 not in range").
    """
    from hfx.backends._onnx import lower_to_onnx
    from hfx.backends._onnx_fusions import ORT_FUSIONS, attention

    return lower_to_onnx(record, fusions=tuple(fusion for fusion in ORT_FUSIONS if fusion is not attention))


def _runs_in_node(program: Any) -> Any:
    """``program`` once it holds no fused attention, which onnxruntime-node 1.30 cannot load (see ``lowered_for_node``)."""
    if program.fusions.get("attention"):
        raise _refuse("the graph holds ONNX Runtime 1.32's fused GroupQueryAttention/MultiHeadAttention, which "
                      "Transformers.js's onnxruntime-node (1.30) cannot load",
                      "Give the Exported (hfx lowers it for node), or lower with the default "
                      "fusions (hfx.backends.ORT_FUSIONS, no attention fusion).")
    return program


def _graph(record: Any, fed: frozenset[str], where: str) -> Any:
    """``record`` as an ``OnnxProgram`` (lowered here when a ``Capture`` or ``Exported``), once its inputs are
    known to be ones Transformers.js feeds (checked before the lowering, which is the slow part)."""
    from hfx.backends._onnx import OnnxProgram

    if not isinstance(record, Capture | Exported | OnnxProgram):
        msg = (f"package for {CONSUMER}: the {getattr(record, 'name', '')!r} component is a {type(record).__name__}; "
               "give Components of Capture, Exported or OnnxProgram records")
        raise TypeError(msg)
    others = sorted(graph_arguments(record) - fed)
    if others:
        raise _refuse(f"the graph takes {others}, which Transformers.js does not feed ({where} feeds {sorted(fed)})",
                      "Capture the model with only the tokenizer's outputs (input_ids, attention_mask).")
    return _runs_in_node(record) if isinstance(record, OnnxProgram) else lowered_for_node(record)


def _decoder(programs: Components) -> Any:
    """The one ONNX graph that prefills and decodes, checked against what Transformers.js feeds it."""
    from hfx.backends._onnx import OnnxProgram

    program = every_position(_runs_in_node(decode_component(
        programs, consumer=CONSUMER, pipeline="Transformers.js's decoder_forward", fed=_DECODER_INPUTS,
        lower=lowered_for_node, record=OnnxProgram)))
    if program.io.updates:
        raise _refuse("the decode graph writes a static cache in place; Transformers.js grows the cache from the "
                      "present.* outputs", "Decompose without a static-cache generation_config.")
    other = sorted(spec.name for spec in program.io.inputs
                   if spec.name.startswith("past_key_values.") and not _CACHE_NAME.match(spec.name))
    if other:
        raise _refuse(f"the cache inputs {other} are not keys and values per layer, which Transformers.js names "
                      "past_key_values.N.key/value", "Package an attention decoder (Llama, Qwen, Mistral, Phi-3 ...).")
    return program


def _encoder(programs: Components) -> Any:
    """The one ONNX graph of a model that does not generate, checked against what its tokenizer returns."""
    if len(programs) != 1:
        raise _refuse(f"an encoder package holds one graph, got components {list(programs)}",
                      "Capture the encoder alone and decompose it (one component, 'model').")
    return _graph(next(iter(programs.values())), _ENCODER_INPUTS, "encoder_forward")


def _files(stem: str) -> dict[str, str]:
    return {"filename": f"onnx/{stem}.onnx", "data": f"{stem}.onnx_data"}


def write_transformers_js(programs: Components, staging: Path, *, tokenizer: Any, variants: tuple[str, ...] = ()) -> None:
    """Write the Transformers.js files of ``programs`` (a decoder's ``decode`` graph, or an encoder) into ``staging``.

    The fp32 graph is also hfx's own saved component (``hfx.json`` names ``onnx/model.onnx``), so ``hfx.load``,
    ``hfx.generate`` and ``hfx inspect`` read the same package; ``variants`` (``"q8"``, ``"q4"``) add
    ``onnx/model_quantized.onnx`` / ``onnx/model_q4.onnx``, quantized by ``hfx.quantize_onnx``.
    """
    from hfx._save import write_saved
    from hfx.backends._onnx import save_files
    from hfx.quantize._onnx import quantize_onnx

    meta = programs.meta
    if not meta.model.config.get("model_type"):
        raise _refuse("no model config (config.json's model_type picks the Transformers.js class)",
                      "Give the Components of hfx.decompose, which record the model's config.")
    decoder = "decode" in programs
    program = transformers_js_names(_decoder(programs) if decoder else _encoder(programs))
    quantized = {variant: quantize_onnx(program, mode=VARIANTS[variant][1]) for variant in dict.fromkeys(variants)}
    name = "decode" if decoder else "model"
    write_saved(staging, Components(items={name: program}, meta=meta), processor=tokenizer,
                layout={name: _files("model")})
    written = ["model.onnx"]
    for variant, variant_program in quantized.items():
        stem = f"model{VARIANTS[variant][0]}"
        save_files(variant_program, staging, **_files(stem))
        written.append(f"{stem}.onnx")
    tokenizer.save_pretrained(staging)
    if not (staging / "tokenizer.json").is_file():
        raise _refuse(f"the tokenizer ({type(tokenizer).__name__}) wrote no tokenizer.json, the file Transformers.js "
                      "reads", "Pass a fast tokenizer (AutoTokenizer.from_pretrained(..., use_fast=True)).")
    external = {file: 1 for file in written if (staging / "onnx" / f"{file}_data").is_file()}
    config = {**meta.model.config, "transformers.js_config": {"dtype": "fp32", "use_external_data_format": external}}
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    if decoder:
        # Only the values set: Transformers.js's GenerationConfig takes a null as a value, not as "unset".
        settings = {key: value for key, value in meta.generation.config.items() if value is not None}
        (staging / "generation_config.json").write_text(json.dumps(settings, indent=2))
