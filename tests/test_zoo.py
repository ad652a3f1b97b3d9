"""The zoo: every entry builds and runs eager; one representative per family matches eager on every runtime."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE

# One architecture per family that the other test files do not already export on every runtime (they cover
# llama, qwen3, bert, vit, t5, whisper, llava and mamba): each is exported once and lowered to every runtime.
REPRESENTATIVES = (
    "gemma2", "roberta", "convnext", "mamba2", "wav2vec2",  # wav2vec2: a derived dim (audio_length = 10*_a)
)
# (arch, runtime) -> why it fails today. The test checks that exactly these fail, so a fix shows up here too.
KNOWN_GAPS: dict[tuple[str, str], str] = {}
# runtime -> (module that must be importable, the lowering; None runs the Exported program itself)
LOWERINGS = {"torch": ("torch", None), "onnx": ("onnxruntime", "lower_to_onnx"),
             "pte": ("executorch", "lower_to_pte"), "ov": ("openvino", "lower_to_ov")}


@pytest.mark.parametrize("name", list(zoo.ENTRIES))
def test_entry_builds_and_runs_eager_at_two_shapes(name):
    model = zoo.build(name)
    spec = zoo.entry(name)
    assert not model.training
    with torch.no_grad():
        for shape in (CAPTURE_SHAPE, NEW_SHAPE):
            outputs = model(**zoo.forward_inputs(name, **shape))
            assert torch.isfinite(outputs[0]).all()
        if spec.generative:
            prompt = zoo.inputs(name, batch=2, sequence=5)
            tokens = model.generate(**prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False)
            assert tokens.shape[0] == 2 and tokens.shape[1] >= 2


def test_zoo_covers_every_family_of_the_issue():
    families = {spec.family for spec in zoo.ENTRIES.values()}
    assert families == {"decoder", "encoder", "vision", "encoder-decoder", "state-space", "audio", "vision-language"}
    assert len(zoo.ENTRIES) >= 40
    assert len(zoo.names(family="decoder")) >= 15


def test_names_filters_by_family_and_generation():
    assert zoo.names(family="audio") == ("wav2vec2", "hubert")
    assert "bert" in zoo.names(generative=False) and "bert" not in zoo.names(generative=True)


def test_forward_inputs_add_decoder_ids_only_to_encoder_decoders():
    assert zoo.forward_inputs("bart", batch=3, sequence=11)["decoder_input_ids"].shape == (3, 6)
    assert zoo.forward_inputs("gemma2").keys() == zoo.inputs("gemma2").keys()


def test_any_size_images_change_with_sequence_and_fixed_ones_do_not():
    assert zoo.inputs("convnext", **CAPTURE_SHAPE)["pixel_values"].shape[-2:] == (32, 32)
    assert zoo.inputs("convnext", **NEW_SHAPE)["pixel_values"].shape[-2:] == (48, 48)
    assert zoo.inputs("deit", **NEW_SHAPE)["pixel_values"].shape[-2:] == (32, 32)


def test_unknown_entry_names_the_known_ones():
    with pytest.raises(KeyError, match="known: .*gemma2"):
        zoo.build("no-such-model")


def _lowered(exported: hfx.Exported, runtime: str):
    module, lowering = LOWERINGS[runtime]
    pytest.importorskip(module)
    return exported if lowering is None else getattr(hfx, lowering)(exported)


def _passes(exported: hfx.Exported, model: torch.nn.Module, runtime: str, inputs: dict) -> bool:
    try:
        return hfx.verify(_lowered(exported, runtime), model, inputs).passed
    except hfx.LoweringError:
        return False


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_representative_matches_eager_on_every_runtime_at_a_new_shape(models, name):
    # One export per model, lowered to every runtime inside one test so that xdist never exports it twice.
    model = models(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, **CAPTURE_SHAPE), model))
    new = zoo.forward_inputs(name, **NEW_SHAPE)
    failing = {runtime for runtime in LOWERINGS if not _passes(exported, model, runtime, new)}
    assert failing == {runtime for arch, runtime in KNOWN_GAPS if arch == name}
