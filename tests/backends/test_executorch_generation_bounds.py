"""``lower_to_pte`` bounds a generating model's components for the sizes the model fixes: the batch of its
generation config's beam search and the encoder's output length its decoder reads (Whisper's 1500 tokens)."""

from __future__ import annotations

import attrs
import pytest
import torch

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx import zoo  # noqa: E402
from hfx.backends._executorch_generation_bounds import generation_max_sizes, with_generation_max_sizes  # noqa: E402
from tests.helpers import one_layer  # noqa: E402


def _beaming(components: hfx.Components, beams: int) -> hfx.Components:
    config = {**components.meta.generation.config, "num_beams": beams}
    generation = attrs.evolve(components.meta.generation, config=config)
    return attrs.evolve(components, meta=attrs.evolve(components.meta, generation=generation))


def test_the_decode_is_bounded_by_the_encoders_output_length_and_each_component_by_the_beams(generative_one_layer):
    model, components = generative_one_layer("whisper")
    length = model.config.max_source_positions  # Whisper's encoder gives exactly this many tokens
    assert generation_max_sizes(components, batch=4) == {"encoder": {}, "decode": {"sequence": length}}
    beaming = generation_max_sizes(_beaming(components, 3), batch=4)
    assert beaming == {"encoder": {"batch": 12}, "decode": {"batch": 12, "sequence": length}}


def test_the_callers_max_sizes_win_and_the_sizes_stay_within_the_export_bounds(generative_one_layer):
    _, components = generative_one_layer("whisper")
    beaming = _beaming(components, 3)
    assert with_generation_max_sizes(beaming, "decode", {"max_sizes": {"batch": 5}}, batch=4)["max_sizes"]["batch"] == 5
    bounded = attrs.evolve(beaming["encoder"], io=attrs.evolve(beaming["encoder"].io, bounds={"batch": (1, 8)}))
    narrow = attrs.evolve(beaming, items={**beaming, "encoder": bounded})
    assert with_generation_max_sizes(narrow, "encoder", {}, batch=4) == {"max_sizes": {"batch": 8}}
    assert with_generation_max_sizes(components, "encoder", {"threads": 1}, batch=4) == {"threads": 1}


def test_a_whisper_past_the_default_bounds_generates_eagers_beams_on_executorch():
    # 600 encoder tokens (the default bound is 512) and two beams over three prompts (a batch of 6; the default is 4):
    # both failed at the first step ("outside the program's bounds") before the bounds came from the model.
    model = one_layer("whisper", max_source_positions=600)
    model.generation_config.num_beams = 2
    programs = hfx.lower_to_pte(hfx.export(hfx.decompose(hfx.capture(zoo.inputs("whisper", batch=2), model))),
                                threads=1)
    assert programs["decode"].max_sizes["sequence"] == 600 and programs["decode"].max_sizes["batch"] == 8
    prompts = zoo.inputs("whisper", batch=3)
    with torch.no_grad():
        want = model.generate(**prompts, max_new_tokens=5, do_sample=False)
        got = hfx.as_model(programs).generate(**prompts, max_new_tokens=5, do_sample=False)
    assert torch.equal(got, want)
