"""vision_inputs: what a whole-forward graph of a packed-image model takes besides the processor's inputs."""

from __future__ import annotations

import copy

import pytest
import torch

import hfx
from hfx import zoo
from hfx._capture.vision_inputs import precomputed_input_names, tower_inputs, vision_inputs
from tests.helpers import packed_image_inputs
from tests.tolerances import FP32_PARITY


def _mixed_images(config):
    """Two prompts whose images differ in size: 4x4 and 2x6 patches, as one packed batch."""
    first = packed_image_inputs(config, 1, 3, (1, 4, 4))
    second = packed_image_inputs(config, 1, 5, (1, 2, 6))
    # 1 + 4 + 1 + 3 = 9 and 1 + 3 + 1 + 5 = 10 tokens: pad the first prompt on the left by one.
    ids = torch.cat([torch.cat([torch.zeros(1, 1, dtype=torch.long), first["input_ids"]], 1), second["input_ids"]])
    mask = torch.cat([torch.cat([torch.zeros(1, 1, dtype=torch.long), first["attention_mask"]], 1),
                      second["attention_mask"]])
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long(),
            "pixel_values": torch.cat([first["pixel_values"], second["pixel_values"]]),
            "image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 6]])}


def test_the_values_are_the_models_own(models):
    from transformers import vision_utils

    model = models("qwen2_vl")
    inputs = _mixed_images(model.config)
    computed = vision_inputs(model, inputs)
    grid = inputs["image_grid_thw"]
    assert sorted(computed) == ["image_cu_seqlens", "image_position_ids", "position_ids"]
    assert computed["image_cu_seqlens"].tolist() == [0, 16, 28]
    assert torch.equal(computed["image_position_ids"], vision_utils.get_vision_position_ids(grid, 2))
    rope, _ = model.model.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                         attention_mask=inputs["attention_mask"], image_grid_thw=grid)
    assert torch.equal(computed["position_ids"], rope)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_the_eager_model_reads_them_and_gives_the_same_outputs(models, name):
    model = models(name)
    inputs = _mixed_images(model.config)
    computed = vision_inputs(model, inputs)
    wrong = {**computed, "image_cu_seqlens": computed["image_cu_seqlens"][[0, -1]]}  # one image instead of two
    with torch.no_grad():
        plain = model(**copy.deepcopy(inputs)).logits
        given = model(**copy.deepcopy(inputs), **computed).logits
        misread = model(**copy.deepcopy(inputs), **wrong).logits
    assert torch.equal(given, plain)
    assert not torch.allclose(misread, plain, atol=FP32_PARITY)  # beyond rounding: the model reads what it is given


def test_qwen2_5_vl_also_gets_its_windows(models):
    model = models("qwen2_5_vl")
    computed = vision_inputs(model, _mixed_images(model.config))
    assert {"image_window_index", "image_cu_window_seqlens"} <= computed.keys()
    assert computed["image_window_index"].shape == (7,)  # 28 patches merged 2x2
    assert precomputed_input_names(model) >= {"image_window_index", "video_cu_window_seqlens"}
    assert "image_window_index" not in precomputed_input_names(models("qwen2_vl"))


def test_the_towers_layers_do_not_run_and_the_model_is_unchanged(models):
    tower = models("qwen2_vl").model.visual
    calls = []
    handles = [child.register_forward_pre_hook(lambda *_: calls.append(1)) for child in tower.children()]
    try:
        found = tower_inputs(tower, None, torch.tensor([[1, 4, 4]]))
    finally:
        for handle in handles:
            handle.remove()
    assert sorted(found) == ["cu_seqlens", "position_ids"] and not calls
    assert "patch_embed" not in vars(tower) and isinstance(tower.patch_embed, torch.nn.Module)


def test_given_positions_are_kept_and_other_models_get_nothing(models):
    model = models("qwen2_vl")
    inputs = zoo.inputs("qwen2_vl")
    assert "position_ids" not in vision_inputs(model, {**inputs, "position_ids": torch.zeros(3, 2, 13)})
    assert vision_inputs(models("llava"), zoo.inputs("llava")) == {}
    assert vision_inputs(model, {k: v for k, v in inputs.items() if k not in ("image_grid_thw", "pixel_values")}) == {}


def test_the_model_alone_gives_a_stage_and_swapped_arguments_are_a_type_error(models):
    model = models("qwen2_vl")
    inputs = zoo.inputs("qwen2_vl")
    piped = hfx.vision_inputs(model)(inputs)
    assert piped.keys() == vision_inputs(model, inputs).keys()
    assert all(torch.equal(piped[k], value) for k, value in vision_inputs(model, inputs).items())
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got dict; call vision_inputs\(model, inputs\)"):
        vision_inputs(inputs, model)


def test_the_whole_forward_exports_for_any_image_count_and_size(models):
    model = models("qwen2_vl")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("qwen2_vl", batch=2, sequence=7), model))
    assert hfx.verify(model, zoo.forward_inputs("qwen2_vl", batch=3, sequence=11), exported).passed  # 3 images of 4x6
    inputs = _mixed_images(model.config)
    assert hfx.verify(model, {**inputs, **vision_inputs(model, inputs)}, exported).passed  # 2 images, 4x4 and 2x6


def test_interpolated_position_tables_are_inputs_too():
    # Qwen3-VL resamples its learned position table to each image's grid (get_vision_interpolation_indices_and_
    # weights, a repeat_interleave over the grids): computed outside, the graph takes any image count. Its
    # get_image_features splits the tower's output and each deepstack feature per image with .tolist() sizes,
    # which patch_per_image_feature_split joins. Without both the image count came out static (generated zoo).
    from transformers import vision_utils

    from hfx._capture.vision_inputs import computed_vision_inputs

    name = "image-text-to-text:qwen3_vl"
    model = zoo.build(name)
    inputs = zoo.forward_inputs(name, batch=2, sequence=7)
    assert {"image_interp_indices", "image_interp_weights"} <= set(inputs)
    exported = hfx.export(hfx.capture(inputs, model))
    assert exported.dynamic_shapes.axes["image_interp_indices"] == {0: "image_patches"}
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed  # 3 images
    options = {"num_grid_per_side": 4, "mode": "bilinear", "align_corners": False, "spatial_merge_size": 2}
    grid = torch.tensor([[1, 4, 4], [1, 2, 6]])
    computed = computed_vision_inputs({"get_vision_interpolation_indices_and_weights": options}, grid)
    indices, weights = vision_utils.get_vision_interpolation_indices_and_weights(grid, **options)
    assert torch.equal(computed["interp_indices"], indices) and torch.equal(computed["interp_weights"], weights)


def test_a_tower_alone_takes_its_own_inputs_for_any_image_count(models):
    # A packed-image tower exported on its own (GLM-Image's vision model is a feature-extraction type): its
    # getters' results go in unprefixed (cu_seqlens, position_ids), and the image count varies (generated
    # zoo: glm_image_vision's grid_thw came out static at 2 images without them).
    tower = models("qwen2_vl").model.visual
    capture_images = _mixed_images(models("qwen2_vl").config)
    inputs = {"hidden_states": capture_images["pixel_values"], "grid_thw": capture_images["image_grid_thw"]}
    computed = vision_inputs(tower, inputs)
    assert sorted(computed) == ["cu_seqlens", "position_ids"] and computed["cu_seqlens"].tolist() == [0, 16, 28]
    assert precomputed_input_names(tower) == {"cu_seqlens", "position_ids"}
    exported = hfx.export(hfx.capture({**inputs, **computed}, tower))
    assert exported.dynamic_shapes.axes["grid_thw"] == {0: "image_count"}
    assert exported.dynamic_shapes.axes["hidden_states"] == {0: "image_patches"}
    grid = torch.tensor([[1, 2, 2], [1, 4, 6], [1, 2, 4]])  # three images, other sizes
    patches = torch.randn(int(grid.prod(-1).sum()), inputs["hidden_states"].shape[1], generator=torch.Generator().manual_seed(3))
    new = {"hidden_states": patches, "grid_thw": grid}
    assert hfx.verify(tower, {**new, **vision_inputs(tower, new)}, exported).passed
    assert vision_inputs(tower, {"hidden_states": patches}) == {}  # no grid: nothing to compute


def test_a_feature_method_with_its_own_projector_takes_the_towers_inputs_prefixed():
    # HyperCLOVA X Vision v2: a Qwen2.5-VL-style tower, then a projector of the model's own. The image encoder is
    # the feature method stopped at the projector; the tower's window index, positions and boundaries go in as
    # the method's image_-prefixed keywords (before: its getters ran in the graph, "Could not extract
    # specialized integer"), and generate computes them for new images.
    from tests.helpers import assert_eager_tokens, decomposed

    name = "image-text-to-text:hyperclovax_vision_v2"
    model, parts = decomposed(name)
    encoder = parts["image_encoder"]
    assert {"image_cu_seqlens", "image_window_index", "image_cu_window_seqlens"} <= set(encoder.kwargs)
    assert encoder.dynamic_shapes.axes["image_cu_seqlens"] == {0: "image_boundaries"}
    programs = hfx.export(parts)
    assert len(programs["image_encoder"].io.outputs) == 1  # the projector's input, not the tower's output past it
    assert_eager_tokens(model, programs, name)
