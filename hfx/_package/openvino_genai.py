"""The package ``openvino_genai.LLMPipeline`` loads: one stateful model, OpenVINO tokenizer models and the configs.

``LLMPipeline(directory, "CPU")`` reads ``openvino_model.xml`` (one graph for
the prompt and every step, the KV cache kept as state, inputs ``input_ids``,
``attention_mask``, ``position_ids``, ``beam_idx``), ``openvino_tokenizer.xml``
and ``openvino_detokenizer.xml`` (made by ``openvino_tokenizers``), and
``config.json`` / ``generation_config.json`` (EOS, BOS, pad and the defaults of
its search).

OpenVINO's CPU defaults are fast, not exact: bf16 arithmetic on a CPU that has it
(AVX512_BF16, AMX) and a u8 KV cache for stateful models (measured on the zoo's Llama:
1.5e-3 off in the first decode step's logits). ``EXACT_PROPERTIES`` give eager's
numbers: ``LLMPipeline(directory, "CPU", **EXACT_PROPERTIES)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfx._package.text_decoder import decode_component, write_model_files
from hfx._records import Components
from hfx.backends._openvino import STATEFUL_COMPILE_OPTIONS, OvProgram, as_stateful, lower_to_ov

CONSUMER = "openvino-genai"
# The properties that give eager's numbers, as hfx's own stateful OvProgram compiles.
EXACT_PROPERTIES = STATEFUL_COMPILE_OPTIONS
# What LLMPipeline feeds a model, besides the cache it keeps as state (openvino.genai src/cpp/src/utils.cpp).
_FED_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})


def decode_program(programs: Components) -> Any:
    """The one OpenVINO program that prefills and decodes (lowered here when given as a ``Capture`` or ``Exported``).

    Raises:
        ValueError: the model is not a text decoder, or its components are not one graph for prompt and steps.
        TypeError: the decode component is a program of another runtime.
    """
    return decode_component(programs, consumer=CONSUMER, pipeline="LLMPipeline", fed=_FED_INPUTS | {"beam_idx"},
                            lower=lower_to_ov, record=OvProgram)


def write_openvino_genai(programs: Components, staging: Path, *, tokenizer: Any) -> None:
    """Write the OpenVINO GenAI files of ``programs`` (a decomposed text decoder) into ``staging``.

    The stateful decode is also hfx's own saved component (``hfx.json`` names
    ``openvino_model.xml`` as component ``decode``), so ``hfx.load`` and
    ``hfx.generate`` read the same package.
    """
    import openvino as ov
    import openvino_tokenizers

    # Named "model": saved as openvino_model.xml, the file LLMPipeline reads.
    decode = as_stateful(decode_program(programs), stage=f"package for {CONSUMER}", name="model")
    write_model_files(staging, Components(items={"decode": decode}, meta=programs.meta), tokenizer=tokenizer)
    encoder, decoder = openvino_tokenizers.convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(encoder, staging / "openvino_tokenizer.xml")
    ov.save_model(decoder, staging / "openvino_detokenizer.xml")
