"""The package ExecuTorch's LLM runner loads: one ``model.pte`` with its metadata methods, ``tokenizer.json`` and the configs.

``TextLLMRunner("model.pte", "tokenizer.json")`` (Python), ``llama_main
--model_path=model.pte --tokenizer_path=tokenizer.json`` (C++) and the Android
and iOS apps run the program's ``forward(tokens [1, n], input_pos [1])``
for the prompt and every step, the KV cache kept in the program's buffers
(``decompose(internal_cache_length=N)``), and read its constant methods
(executorch extension/llm/runner/constants.h, llm_runner_helper.cpp):
``get_max_seq_len`` (the most tokens one call takes; required),
``get_max_context_len`` (the cache's positions), ``use_kv_cache``,
``enable_dynamic_shape`` (the prompt in one call, not token by token) and
``get_eos_ids``. The runner takes the BOS id and the vocabulary size from the
tokenizer (``get_bos_id`` and ``get_vocab_size`` are written for other readers)
and samples among the tokenizer's ids only. A model with tied embeddings
also gets ``model.ptd``, its weights stored once (``lower_to_pte``), which the
runner takes as its data path: ``TextLLMRunner("model.pte", "tokenizer.json", "model.ptd")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from hfx._package.text_decoder import check_text_decoder, refusal, write_model_files
from hfx._records import Capture, Components, Exported
from hfx.backends._executorch import PteProgram, lower_to_pte, pte_bounds

CONSUMER = "executorch-runner"
# What the runner reads before it runs anything; a program without it is refused at load.
_REQUIRED_METHOD = "get_max_seq_len"


def _refuse(reason: str, todo: str) -> ValueError:
    return refusal(CONSUMER, reason, todo)


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def runner_metadata(programs: Components, exported: Exported) -> dict[str, Any]:
    """The constant methods the runner reads, for the decode graph ``exported`` of ``programs``.

    ``get_max_seq_len`` is the most tokens the lowered program takes in one call
    (its planned bound of ``sequence``), ``get_max_context_len`` the cache's
    positions; the ids come from the generation config, the vocabulary from the logits.
    """
    length = programs.meta.roles.internal_cache_length
    settings, config = programs.meta.generation.config, programs.meta.model.config
    sequence = pte_bounds(exported, max_sizes={"sequence": length})
    vocab = exported.io.outputs[0].shape[-1]
    metadata: dict[str, Any] = {
        "get_max_seq_len": sequence["sequence"][1],
        "get_max_context_len": length,
        "get_vocab_size": int(vocab) if isinstance(vocab, int) else int(config["vocab_size"]),
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
        "use_sdpa_with_kv_cache": False,  # the fused llama::sdpa_with_kv_cache op; hfx writes the cache apart
    }
    bos = settings.get("bos_token_id", config.get("bos_token_id"))
    if bos is not None:
        metadata["get_bos_id"] = int(bos)
    eos = _eos_ids(settings.get("eos_token_id", config.get("eos_token_id")))
    if eos:
        metadata["get_eos_ids"] = eos
    return metadata


def decode_program(programs: Components) -> PteProgram:
    """The runner's ``model.pte``: the decode component lowered with the metadata methods (when given unlowered).

    Raises:
        ValueError: the model is not a text decoder, or its decode graph takes the cache as an input,
            or a given ``PteProgram`` lacks the runner's metadata methods.
        TypeError: the decode component is a program of another runtime.
    """
    check_text_decoder(programs, consumer=CONSUMER, pipeline="TextLLMRunner")
    meta = programs.meta
    if meta.roles.internal_cache_length is None or list(programs) != ["decode"]:
        raise _refuse(f"the runner needs one graph that keeps its KV cache inside, got components {list(programs)} "
                      "with the cache as an input", "Decompose with hfx.decompose(internal_cache_length=N).")
    decode = programs["decode"]
    if isinstance(decode, Capture):
        from hfx._export.export import export

        decode = export(decode)
    if isinstance(decode, Exported):
        metadata = runner_metadata(programs, decode)
        decode = lower_to_pte(decode, max_sizes={"sequence": metadata["get_max_seq_len"]}, constant_methods=metadata)
    if not isinstance(decode, PteProgram):
        msg = (f"package for {CONSUMER}: the decode component is a {type(decode).__name__}; give Components of "
               "Capture, Exported or PteProgram records")
        raise TypeError(msg)
    if _REQUIRED_METHOD not in decode.constant_methods:
        raise _refuse(f"the given PteProgram has no {_REQUIRED_METHOD} method (the runner's metadata)",
                      "Give the Capture or Exported records; the package lowers them with the metadata.")
    return decode if decode.name == "model" else attrs.evolve(decode, name="model")  # saved as model.pte


def write_executorch_runner(programs: Components, staging: Path, *, tokenizer: Any) -> None:
    """Write the runner's files of ``programs`` (``decompose(internal_cache_length=N)`` of a text decoder) into ``staging``.

    ``model.pte`` is also hfx's own saved component (``hfx.json`` names it as
    component ``decode``), so ``hfx.load`` and ``hfx.generate`` read the same package.
    """
    decode = decode_program(programs)
    write_model_files(staging, Components(items={"decode": decode}, meta=programs.meta), tokenizer=tokenizer)
    if not (staging / "tokenizer.json").is_file():
        raise _refuse(f"{type(tokenizer).__name__} writes no tokenizer.json, the file the runner reads",
                      "Pass a fast tokenizer (AutoTokenizer.from_pretrained(..., use_fast=True)).")
