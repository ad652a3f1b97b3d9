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
from hfx._package.executorch_runner import write_executorch_runner
from hfx._package.openvino_genai import write_openvino_genai
from hfx._records import Components

# Consumer name -> the function that writes its files into a staging folder. Read-only: nothing registers here.
CONSUMERS: Mapping[str, Callable[..., None]] = MappingProxyType({
    "openvino-genai": write_openvino_genai,
    "executorch-runner": write_executorch_runner,
})
# Consumer name -> (the modules writing its package needs, the pip extra that installs them).
_NEEDS: Mapping[str, tuple[tuple[str, ...], str]] = MappingProxyType(
    {
        "openvino-genai": (("openvino", "openvino_tokenizers"), "openvino-genai"),
        "executorch-runner": (("executorch",), "executorch"),
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
    loads it. ``programs`` come from ``decompose(multi_token_decode=True)`` of a
    text decoder, as ``Capture``, ``Exported`` or ``OvProgram`` records (the ones
    not yet lowered are lowered here).

    ``"executorch-runner"``: ``model.pte`` (``forward(tokens, input_pos)``, the KV
    cache in the program's buffers, ExecuTorch's LLM kernels, the metadata
    methods ``get_max_seq_len``, ``get_eos_ids`` ...), ``tokenizer.json``,
    ``config.json`` and ``generation_config.json``; ExecuTorch's
    ``TextLLMRunner(f"{directory}/model.pte", f"{directory}/tokenizer.json")``
    and its C++ ``llama_main`` run it. ``programs`` come from
    ``decompose(internal_cache_length=N)`` of a text decoder.

    Both packages carry ``hfx.json``: ``hfx.load(directory)`` and ``hfx.generate``
    read them too. The directory is written whole or not at all.

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
    with staged_directory(Path(directory), overwrite=overwrite, stage=f"package for {consumer}") as staging:
        CONSUMERS[consumer](programs, staging, tokenizer=tokenizer)
    return Path(directory)


def require_consumer(consumer: str) -> None:
    """Raise ``ValueError`` for an unknown consumer, ``ImportError`` naming the pip extra when its writer's packages are missing."""
    from hfx.backends._common import require

    if consumer not in CONSUMERS:
        msg = f"package: unknown consumer {consumer!r}; hfx packages for {sorted(CONSUMERS)}"
        raise ValueError(msg)
    modules, extra = _NEEDS[consumer]
    require(*modules, extra=extra)
