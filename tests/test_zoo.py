"""The zoo: every entry builds and runs eager; one representative per family matches eager on every runtime."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, one_layer
from tests.tolerances import FP32_PARITY, FP32_PARITY_RTOL

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


def _row(inputs: dict, row: int) -> dict:
    """Row ``row`` of a batch of inputs; packed images (Qwen2-VL ``pixel_values``) are cut by ``image_grid_thw``."""
    one = {k: v[row : row + 1] for k, v in inputs.items()}
    if "image_grid_thw" in inputs:
        patches = inputs["image_grid_thw"].prod(-1).tolist()
        one["pixel_values"] = inputs["pixel_values"][sum(patches[:row]) : sum(patches[: row + 1])]
    return one


def _rows_alone_match_the_batch(model: torch.nn.Module, inputs: dict) -> tuple[float, float]:
    """How far each row's first output, run alone, is from the same row run in the batch; and its largest magnitude."""
    with torch.no_grad():
        batched = model(**inputs)[0]
        alone = [model(**_row(inputs, row))[0] for row in range(batched.shape[0])]
    return max((batched[row] - out[0]).abs().max().item() for row, out in enumerate(alone)), batched.abs().max().item()


@pytest.mark.parametrize("name", list(zoo.ENTRIES))
def test_entry_inputs_give_a_row_the_same_output_alone_and_in_a_padded_batch(models, name):
    # Parity at batch 1 is only meaningful if eager itself agrees with the padded batch: PaliGemma without
    # token_type_ids did not (its all-ones mask is dropped and attention turns bidirectional).
    # Packed-image models' forward inputs hold batch-wide tensors (cu_seqlens); their generate inputs slice by row.
    inputs = (zoo.inputs if zoo.entry(name).forward else zoo.forward_inputs)(name, **NEW_SHAPE)
    # One row alone and in a batch of 3 run GEMMs of other shapes, so other blockings sum in another order: the
    # float32 parity bound, scaled with the output (logits reach ~15 in Whisper and BART, ~360 in T5; Whisper was 1.5e-4 off on an AVX2-only CPU).
    diff, scale = _rows_alone_match_the_batch(models(name), inputs)
    assert diff <= FP32_PARITY + FP32_PARITY_RTOL * scale


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


def _passes(exported: hfx.Exported, model: torch.nn.Module, runtime: str, checks: list[dict]) -> bool:
    try:
        program = _lowered(exported, runtime)
    except hfx.LoweringError:
        return False
    return all(hfx.verify(model, inputs, program).passed for inputs in checks)


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_representative_matches_eager_on_every_runtime_at_a_new_shape(models, name):
    # One export per model, lowered to every runtime inside one test so that xdist never exports it twice. One
    # layer per stack (the same operators, lowered in less time), except Gemma 2, whose layers alternate sliding and
    # global attention, and ConvNeXt, whose stages are its hidden sizes.
    model = models(name) if name in ("gemma2", "convnext") else one_layer(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, **CAPTURE_SHAPE), model))
    # A new padded batch, and one unpadded row: masks that are all ones take other paths in eager attention.
    checks = [zoo.forward_inputs(name, **NEW_SHAPE), zoo.forward_inputs(name, batch=1, sequence=13)]
    failing = {runtime for runtime in LOWERINGS if not _passes(exported, model, runtime, checks)}
    assert failing == {runtime for arch, runtime in KNOWN_GAPS if arch == name}
