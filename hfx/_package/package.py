"""``package``: write, from one decomposed export, a directory that a deployment pipeline loads as it is."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from toolz import curry

from hfx._atomic import staged_directory
from hfx._errors import argument_error
from hfx._package.openvino_genai import write_openvino_genai
from hfx._package.ort_genai import write_ort_genai
from hfx._records import Components

# Consumer name -> the function that writes its files into a staging folder. Read-only: nothing registers here.
CONSUMERS: Mapping[str, Callable[..., None]] = MappingProxyType({
    "openvino-genai": write_openvino_genai,
    "ort-genai": write_ort_genai,
})
# Consumer name -> (the modules writing its package needs, the pip extra that installs them).
_NEEDS: Mapping[str, tuple[tuple[str, ...], str]] = MappingProxyType(
    {
        "openvino-genai": (("openvino", "openvino_tokenizers"), "openvino-genai"),
        "ort-genai": (("onnx", "onnxscript", "onnxruntime"), "onnx"),
    }
)


@curry
def package(
    directory: str | os.PathLike[str],
    programs: Components,
    /,
    *,
    consumer: str,
    tokenizer: Any = None,
    overwrite: bool = False,
) -> Path:
    """Write ``programs`` as the package ``consumer``'s own pipeline loads, unchanged, from ``directory``.

    ``"openvino-genai"``: one stateful ``openvino_model.xml`` (the KV cache kept
    inside OpenVINO, ``beam_idx`` reorders it), the OpenVINO tokenizer and
    detokenizer models, the tokenizer files, ``config.json`` and
    ``generation_config.json``; ``openvino_genai.LLMPipeline(directory, "CPU")``
    loads it.

    ``"ort-genai"``: ``genai_config.json`` (model type, context length, the
    decoder's sizes and input and output names, special tokens, search defaults),
    the decoder graph ``model.onnx`` (+ ``model.onnx.data``), the tokenizer files,
    ``config.json`` and ``generation_config.json``; ``onnxruntime_genai.Model(directory)``
    loads it.

    ``programs`` come from ``decompose(multi_token_decode=True)`` of a text
    decoder, as ``Capture``, ``Exported`` or the consumer's program records
    (``OvProgram``, ``OnnxProgram``; the ones not yet lowered are lowered here).
    Each package also holds hfx's ``hfx.json`` over the same graph, so ``hfx.load``
    and ``hfx.generate`` read it. The directory is written whole or not at all.

    Args:
        directory: where to write; must not exist unless ``overwrite``.
        programs: the decomposed model.
        consumer: the pipeline to write for; one of ``CONSUMERS``.
        tokenizer: the model's tokenizer; defaults to ``programs.processor``.
        overwrite: replace an existing directory.

    Returns:
        The directory's path.

    Raises:
        ValueError: an unknown consumer, no tokenizer, or a model or decomposition the
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
    from hfx.backends._common import require

    if consumer not in CONSUMERS:
        msg = f"package: unknown consumer {consumer!r}; hfx packages for {sorted(CONSUMERS)}"
        raise ValueError(msg)
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
    modules, extra = _NEEDS[consumer]
    require(*modules, extra=extra)
    with staged_directory(Path(directory), overwrite=overwrite, stage=f"package for {consumer}") as staging:
        CONSUMERS[consumer](programs, staging, tokenizer=tokenizer)
    return Path(directory)
