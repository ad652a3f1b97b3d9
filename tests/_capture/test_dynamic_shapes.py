"""infer_dynamic_shapes: named axes shared by inputs; refine from torch's suggested fixes."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo


def test_token_inputs_share_batch_and_sequence(models):
    shapes = hfx.infer_dynamic_shapes(hfx.capture(zoo.inputs("llama"), models("llama")))
    assert dict(shapes.axes["input_ids"]) == {0: "batch", 1: "sequence"}
    assert dict(shapes.axes["attention_mask"]) == {0: "batch", 1: "sequence"}
    assert shapes.names == ("batch", "sequence")
    assert shapes.bounds["sequence"] == (1, models("llama").config.max_position_embeddings)


def test_images_get_height_and_width(models):
    shapes = hfx.infer_dynamic_shapes(hfx.capture(zoo.inputs("vit"), models("vit")))
    assert dict(shapes.axes["pixel_values"]) == {0: "batch", 2: "height", 3: "width"}


def test_unknown_inputs_get_batch_on_axis_zero_only():
    shapes = hfx.infer_dynamic_shapes(hfx.capture({"input": torch.ones(4, 3)}, torch.nn.Linear(3, 2)))
    assert dict(shapes.axes["input"]) == {0: "batch"}


def test_a_main_input_of_another_name_gets_the_axes_of_the_known_input_it_is():
    # Perceiver takes its tokens as ``inputs`` (its main_input_name): without the alias both axes came out static
    # and a longer text was refused (generated zoo, masked-lm:perceiver).
    name = "masked-lm:perceiver"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert dict(exported.dynamic_shapes.axes["inputs"]) == {0: "batch", 1: "sequence"}
    assert dict(exported.dynamic_shapes.axes["attention_mask"]) == {0: "batch", 1: "sequence"}
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed


def test_frames_of_input_features_are_the_axis_the_config_does_not_name_as_features(models):
    # Speech2Text, Parakeet, Wav2Vec2-BERT and SeamlessM4T take [batch, frames, features]; Whisper [batch, bins,
    # frames]. Marking the last axis as frames for all of them left the frames static (generated zoo: 8 types).
    name = "speech-seq2seq:speech_to_text"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert dict(exported.dynamic_shapes.axes["input_features"]) == {0: "batch", 1: "frames"}
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed
    whisper = hfx.infer_dynamic_shapes(hfx.capture(zoo.inputs("whisper"), models("whisper")))
    assert dict(whisper.axes["input_features"]) == {0: "batch", 2: "frames"}


def test_the_q_former_instruction_has_its_own_dynamic_length():
    # InstructBLIP tokenizes the instruction again for its Q-Former: unnamed, its length came out static.
    name = "image-text-to-text:instructblip"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert dict(exported.dynamic_shapes.axes["qformer_input_ids"]) == {0: "batch", 1: "qformer_sequence"}
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed


def test_bounds_override_defaults(models):
    shapes = hfx.infer_dynamic_shapes(hfx.capture(zoo.inputs("llama"), models("llama")), bounds={"batch": (1, 8)})
    assert shapes.bounds["batch"] == (1, 8)


def test_axes_of_different_sizes_get_different_names(models):
    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.ones(2, 9, dtype=torch.long)  # a decode step: the mask spans past + new tokens
    shapes = hfx.infer_dynamic_shapes(hfx.capture({"input_ids": ids, "attention_mask": mask}, models("llama")))
    assert shapes.axes["input_ids"][1] == "sequence"
    assert shapes.axes["attention_mask"][1] == "total_sequence"
    assert shapes.axes["attention_mask"][0] == "batch"


def test_a_given_shape_record_wins(models):
    given = hfx.DynamicShapes(axes={"input_ids": {0: "b"}}, bounds={"b": (1, 4)})
    assert hfx.infer_dynamic_shapes(hfx.capture(zoo.inputs("llama"), models("llama"), dynamic_shapes=given)) is given


def test_bounds_alone_give_a_stage_that_maps_over_components(models):
    parts = hfx.Components(items={"a": hfx.capture(zoo.inputs("llama"), models("llama")),
                                  "b": hfx.capture({"input": torch.ones(4, 3)}, torch.nn.Linear(3, 2))})
    shapes = pipe(parts, hfx.infer_dynamic_shapes(bounds={"batch": (1, 8)}))
    assert isinstance(shapes, hfx.Components) and [s.bounds["batch"] for s in shapes.values()] == [(1, 8), (1, 8)]


def test_a_subject_that_is_not_a_capture_is_named_with_its_component():
    with pytest.raises(AttributeError) as info:
        hfx.infer_dynamic_shapes(hfx.Components(items={"decode": object()}))
    assert info.value.__notes__ == ["in component 'decode' of infer_dynamic_shapes"]


def test_a_sparse_attention_indexers_keys_grow_with_the_past():
    # DeepSeek-V3.2's indexer caches its own keys, [batch, past, dim]: the same past as the attention's keys
    name = "causal-lm:deepseek_v32"
    model = zoo.build(name)
    parts = hfx.decompose(hfx.capture(zoo.inputs(name, batch=2, sequence=7), model))
    decode = hfx.export(parts["decode"])
    indexer = [spec for spec in decode.io.inputs if spec.name.endswith(".indexer_keys")]
    assert indexer and all(spec.shape[:2] == ("batch", "past_sequence") for spec in indexer)
    inputs = zoo.inputs(name, batch=3, sequence=9)
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert torch.equal(hfx.generate(inputs, hfx.export(parts), max_new_tokens=5), want)


def test_a_decomposed_speech_encoders_frames_axis_is_read_from_the_wrapped_models_config():
    # decompose's encoder (with the cross-attention cache) wraps the model and has no config of its own
    name = "speech-seq2seq:speech_to_text"
    parts = hfx.decompose(hfx.capture(zoo.inputs(name, batch=2, sequence=7), zoo.build(name)))
    encoder = hfx.export(parts["encoder"])
    assert encoder.io.inputs[0].shape == ("batch", "frames", zoo.inputs(name)["input_features"].shape[-1])
