"""``package``: write, from one decomposed export, a directory that a deployment pipeline loads as it is."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from toolz import curry

from hfx._atomic import staged_directory
from hfx._errors import argument_error
from hfx._package.executorch_runner import write_executorch_runner
from hfx._package.openvino_genai import write_openvino_genai
from hfx._package.ort_genai import write_ort_genai
from hfx._package.transformers_js import VARIANTS as TRANSFORMERS_JS_VARIANTS
from hfx._package.transformers_js import write_transformers_js
from hfx._records import Components

# Consumer name -> the function that writes its files into a staging folder. Read-only: nothing registers here.
CONSUMERS: Mapping[str, Callable[..., None]] = MappingProxyType({
    "ort-genai": write_ort_genai,
    "openvino-genai": write_openvino_genai,
    "executorch-runner": write_executorch_runner,
    "transformers.js": write_transformers_js,
})
# Consumer name -> (the modules writing its package needs, the pip extra that installs them).
_NEEDS: Mapping[str, tuple[tuple[str, ...], str]] = MappingProxyType(
    {
        "openvino-genai": (("openvino", "openvino_tokenizers"), "openvino-genai"),
        "ort-genai": (("onnx", "onnxscript", "onnxruntime"), "onnx"),
        "executorch-runner": (("executorch",), "executorch"),
        "transformers.js": (("onnx", "onnxscript", "onnxruntime"), "onnx"),
    }
)
# Consumer name -> the quantized variants its writer adds on request (``variants=``); the others write none.
_VARIANTS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"transformers.js": TRANSFORMERS_JS_VARIANTS})


@curry
def package(
    directory: str | os.PathLike[str],
    programs: Components,
    /,
    *,
    consumer: str,
    tokenizer: Any = None,
    overwrite: bool = False,
    variants: tuple[str, ...] = (),
) -> Path:
    """Write ``programs`` as the package ``consumer``'s own pipeline loads, unchanged, from ``directory``.

    ``"openvino-genai"``: one stateful ``openvino_model.xml`` (the KV cache kept
    inside OpenVINO, ``beam_idx`` reorders it), the OpenVINO tokenizer and
    detokenizer models, the tokenizer files, ``config.json`` and
    ``generation_config.json``; ``openvino_genai.LLMPipeline(directory, "CPU")``
    loads it. ``programs`` come from ``decompose(multi_token_decode=True)`` of a
    text decoder, as ``Capture``, ``Exported`` or ``OvProgram`` records (the ones
    not yet lowered are lowered here).

    ``"ort-genai"``: ``genai_config.json`` (model type, context length, the
    decoder's sizes and input and output names, special tokens, search defaults),
    the decoder graph ``model.onnx`` (+ ``model.onnx.data``), the tokenizer files,
    ``config.json`` and ``generation_config.json``; ``onnxruntime_genai.Model(directory)``
    loads it.

    ``"transformers.js"``: ``onnx/model.onnx`` (+ ``model.onnx_data``) with
    Transformers.js's names (``past_key_values.N.key`` -> ``present.N.key``),
    ``config.json`` (``model_type``, ``transformers.js_config``), the tokenizer
    files and, for a decoder, ``generation_config.json``; ``pipeline("text-generation",
    directory)`` loads a decoder from ``decompose(multi_token_decode=True)``,
    ``pipeline("feature-extraction", directory)`` a text encoder (the one component
    of ``decompose`` of a model that does not generate); ``Capture``, ``Exported``
    or ``OnnxProgram`` records. ``variants=("q8",)`` adds ``onnx/model_quantized.onnx``
    (``hfx.quantize_onnx``, dynamic int8), loaded with ``dtype: "q8"``.

    ``"executorch-runner"``: ``model.pte`` (``forward(tokens, input_pos)``, the KV
    cache in the program's buffers, ExecuTorch's LLM kernels, the metadata
    methods ``get_max_seq_len``, ``get_eos_ids`` ...), ``tokenizer.json``,
    ``config.json`` and ``generation_config.json``; ExecuTorch's
    ``TextLLMRunner(f"{directory}/model.pte", f"{directory}/tokenizer.json")``
    and its C++ ``llama_main`` run it. ``programs`` come from
    ``decompose(internal_cache_length=N)`` of a text decoder.

    Every package carries ``hfx.json``: ``hfx.load(directory)`` and ``hfx.generate``
    read them too. The directory is written whole or not at all.

    Args:
        directory: where to write; must not exist unless ``overwrite``.
        programs: the decomposed model.
        consumer: the pipeline to write for; one of ``CONSUMERS``.
        tokenizer: the model's tokenizer; defaults to ``programs.processor``.
        overwrite: replace an existing directory.
        variants: quantized copies the consumer loads by name (transformers.js: ``"q8"``, ``"q4"``).

    Returns:
        The directory's path.

    Raises:
        ValueError: an unknown consumer or variant, no tokenizer, or a model or decomposition the
            consumer cannot take (the message names the consumer, the reason and what to do).
        TypeError: ``programs`` is not ``Components`` or ``directory`` not a path (the arguments swapped).
        ImportError: a package writing the consumer's files needs is missing (names the pip extra).
        FileExistsError: ``directory`` exists and ``overwrite`` is false.

    Example:
        >>> import hfx, tempfile
        >>> from toolz import pipe
        >>> parts = pipe(hfx.zoo.build("llama"), hfx.capture(hfx.zoo.inputs("llama")), hfx.decompose(multi_token_decode=True))
        >>> path = package(tempfile.mkdtemp() + "/llama", parts, consumer="openvino-genai", tokenizer=hfx.zoo.tokenizer())
        >>> sorted(p.name for p in path.glob("openvino_*.xml"))
        ['openvino_detokenizer.xml', 'openvino_model.xml', 'openvino_tokenizer.xml']
        >>> path = package(tempfile.mkdtemp() + "/llama", parts, consumer="ort-genai", tokenizer=hfx.zoo.tokenizer())
        >>> sorted(p.name for p in path.glob("*.onnx*")), (path / "genai_config.json").is_file()
        (['model.onnx', 'model.onnx.data'], True)
    """
    require_consumer(consumer)
    call = "package(directory, programs)"
    if not isinstance(programs, Components):
        raise argument_error(call, "programs (the last argument)", "the Components of hfx.decompose", programs)
    if not isinstance(directory, (str, os.PathLike)):
        raise argument_error(call, "directory", "a path (str or os.PathLike)", directory)
    tokenizer = tokenizer if tokenizer is not None else programs.processor
    if tokenizer is None:
        msg = (f"package for {consumer}: no tokenizer; pass tokenizer=AutoTokenizer.from_pretrained(...) "
               "(the pipeline tokenizes prompts itself)")
        raise ValueError(msg)
    unknown = sorted(set(variants) - set(_VARIANTS.get(consumer, ())))
    if unknown:
        msg = (f"package for {consumer}: no variants {unknown}; "
               f"{consumer} takes {sorted(_VARIANTS[consumer]) if consumer in _VARIANTS else 'none'}")
        raise ValueError(msg)
    write = partial(CONSUMERS[consumer], variants=tuple(variants)) if variants else CONSUMERS[consumer]
    with staged_directory(Path(directory), overwrite=overwrite, stage=f"package for {consumer}") as staging:
        write(programs, staging, tokenizer=tokenizer)
    return Path(directory)


def require_consumer(consumer: str) -> None:
    """Raise ``ValueError`` for an unknown consumer, ``ImportError`` naming the pip extra when its writer's packages are missing."""
    from hfx.backends._common import require

    if consumer not in CONSUMERS:
        msg = f"package: unknown consumer {consumer!r}; hfx packages for {sorted(CONSUMERS)}"
        raise ValueError(msg)
    modules, extra = _NEEDS[consumer]
    require(*modules, extra=extra, stage=f"package({consumer})")
