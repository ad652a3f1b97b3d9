"""The logits processors ``hfx.generate`` applies: transformers' own list, built without transformers' generation
code when the config asks for none (``hfx._generation_config.asks_for_no_processor``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

import hfx
from hfx import zoo
from hfx._generation_config import asks_for_no_processor, logits_processors, transformers_processors
from tests.helpers import CAPTURE_SHAPE, one_layer

# A config's settings -> whether hfx knows it asks for no processor (then transformers builds none; it may build
# none where hfx does not know: sampling with transformers 5's defaults).
CONFIGS = {
    "the default": ({}, True),
    "lengths and special tokens": ({"max_length": 40, "bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0}, True),
    "a model config's output flags": ({"output_attentions": False, "output_hidden_states": False,
                                       "_from_model_config": True}, True),
    "sampling settings while not sampling": ({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.1}, True),
    "a static cache": ({"cache_implementation": "static"}, True),
    "sampling with the defaults": ({"do_sample": True}, False),
    "sampling at a temperature": ({"do_sample": True, "temperature": 0.7}, False),
    "repetition penalty": ({"repetition_penalty": 1.3}, False),
    "no repeated bigram": ({"no_repeat_ngram_size": 2}, False),
    "minimum new tokens": ({"min_new_tokens": 4, "eos_token_id": 2}, False),
    "minimum length": ({"min_length": 30, "eos_token_id": 2}, False),
    "forced BOS and EOS": ({"forced_bos_token_id": 1, "forced_eos_token_id": 2}, False),
    "suppressed tokens": ({"suppress_tokens": [5, 6], "begin_suppress_tokens": [7]}, False),
    "bad words": ({"bad_words_ids": [[7], [8, 9]], "eos_token_id": 2}, False),
    "sequence bias": ({"sequence_bias": [[[4], 2.0]]}, False),
    "invalid values removed": ({"remove_invalid_values": True}, False),
    "renormalized": ({"renormalize_logits": True}, False),
    "length penalty decay": ({"exponential_decay_length_penalty": (2, 1.5), "eos_token_id": 2}, False),
}


def _types(processors):
    return [type(processor).__name__ for processor in processors]


def _both(config, *, is_encoder_decoder=False):
    kwargs = {"is_encoder_decoder": is_encoder_decoder, "prompt_length": 5, "encoder_input_ids": None,
              "mask": torch.ones(2, 5, dtype=torch.long)}
    return logits_processors(config, **kwargs), transformers_processors(config, **kwargs)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_processors_are_transformers_own_and_none_only_when_it_builds_none(name):
    settings, asks_for_none = CONFIGS[name]
    config = GenerationConfig(**settings)
    assert asks_for_no_processor(config, is_encoder_decoder=False) is asks_for_none
    ours, theirs = _both(config)
    assert _types(ours) == _types(theirs)
    assert not (asks_for_none and theirs)


@pytest.mark.parametrize("name", zoo.names(generative=True))
def test_each_generative_zoo_models_config_gets_transformers_processors(name):
    """The configs models ship with (Whisper's suppressed tokens, BART's forced EOS ...), from the zoo's configs."""
    model_config = zoo.entry(name).config()
    config = GenerationConfig.from_model_config(model_config)
    ours, theirs = _both(config, is_encoder_decoder=bool(getattr(model_config, "is_encoder_decoder", False)))
    assert _types(ours) == _types(theirs)


def test_an_unknown_setting_is_left_to_transformers():
    config = GenerationConfig()
    config.a_setting_of_a_newer_transformers = 1  # not a field here; to_diff_dict lists it as set
    assert "a_setting_of_a_newer_transformers" in config.to_diff_dict()
    assert not asks_for_no_processor(config, is_encoder_decoder=False)


def test_an_encoder_decoder_without_a_start_token_gets_transformers_error():
    config = GenerationConfig()
    assert not asks_for_no_processor(config, is_encoder_decoder=True)
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        _both(config, is_encoder_decoder=True)


_GENERATE = textwrap.dedent(
    """
    import json, sys
    import torch
    import hfx
    from hfx import zoo

    programs = hfx.load(sys.argv[1])
    greedy = hfx.generate(zoo.inputs("llama", batch=2, sequence=9), programs, max_new_tokens=6)
    after_greedy = "transformers.generation.utils" in sys.modules
    penalised = hfx.generate(zoo.inputs("llama", batch=2, sequence=9), programs, max_new_tokens=6,
                             settings={"repetition_penalty": 1.5})
    print(json.dumps({"greedy": greedy.tolist(), "penalised": penalised.tolist(), "after_greedy": after_greedy,
                      "after_penalised": "transformers.generation.utils" in sys.modules}))
    """
)


def test_a_process_that_loads_an_export_and_generates_greedily_imports_no_generation_code(tmp_path):
    model = one_layer("llama")
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), model)))
    hfx.save(tmp_path / "llama", parts)
    prompt = zoo.inputs("llama", batch=2, sequence=9)
    with torch.no_grad():
        greedy = model.generate(**prompt, max_new_tokens=6, do_sample=False)
        penalised = model.generate(**prompt, max_new_tokens=6, do_sample=False, repetition_penalty=1.5)
    result = subprocess.run([sys.executable, "-c", _GENERATE, str(tmp_path / "llama")], capture_output=True,
                            text=True, timeout=600, cwd=Path(__file__).parents[1],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    ran = json.loads(result.stdout.strip().splitlines()[-1])
    assert ran["greedy"] == greedy.tolist() and ran["penalised"] == penalised.tolist()
    assert not ran["after_greedy"]  # the greedy call imported no generation code ...
    assert ran["after_penalised"]  # ... which the penalty's processor is built by
