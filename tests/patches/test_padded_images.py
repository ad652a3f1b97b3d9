"""patch_padded_image_batch: Pixtral-style towers and patch mergers over a padded image batch, for any image count."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx.patches import patch_padded_image_batch
from tests.helpers import assert_leaves_forwards
from tests.tolerances import FP32_ONE_BLOCK

MISTRAL3 = "image-text-to-text:mistral3"


def _padded_batch(config) -> tuple[dict[str, torch.Tensor], int]:
    """Three images in one padded batch (32x32, 16x32, 32x16) and prompts holding each one's placeholders."""
    patch, merge = config.vision_config.patch_size, config.spatial_merge_size
    sizes = torch.tensor([[32, 32], [16, 32], [32, 16]])
    counts = [(h // patch // merge) * (w // patch // merge) for h, w in sizes.tolist()]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (3, max(counts) + 6), generator=generator)
    ids[ids == config.image_token_id] = 5
    for row, count in enumerate(counts):
        ids[row, 2:2 + count] = config.image_token_id
    pixels = torch.randn(3, 3, 32, 32, generator=generator)
    pixels[1, :, 16:], pixels[2, :, :, 16:] = 0, 0  # the processor's padding
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels, "image_sizes": sizes}, \
        sum(counts)


def _image_rows(output) -> torch.Tensor:
    """The projected image features as one tensor: transformers 5.22's `image_hidden_states`, or 5.24's
    `image_outputs.pooler_output` (a tuple of one tensor per image in eager, one joined tensor from the program)."""
    rows = output.image_outputs.pooler_output if "image_outputs" in output else output.image_hidden_states
    return torch.cat(list(rows)) if isinstance(rows, (list, tuple)) else rows


def test_a_vlm_exported_on_equal_images_gives_eager_logits_on_a_padded_batch_of_three():
    model = zoo.build(MISTRAL3)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(MISTRAL3, batch=2, sequence=7))(model))
    assert exported.io.inputs[2].shape == ("batch", 3, "height", "width")
    inputs, features = _padded_batch(model.config)
    with torch.no_grad():
        want = model(**inputs)
    got = exported(**inputs)
    torch.testing.assert_close(got.logits, want.logits, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    # eager's rows: the merged cells inside each image's size, not every cell of the padded grid (3 * 2 * 2)
    assert _image_rows(got).shape[0] == features < 3 * 2 * 2
    torch.testing.assert_close(_image_rows(got), _image_rows(want), rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_a_tower_alone_keeps_batch_and_image_size_dynamic():
    name = "feature-extraction:pixtral"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2))(model))
    assert exported.io.inputs[0].shape == ("batch", 3, "height", "width")
    pixels = torch.randn(3, 3, 48, 32, generator=torch.Generator().manual_seed(1))
    report = hfx.verify(model, {"pixel_values": pixels}, exported)
    assert report.passed, report


def test_is_a_no_op_without_a_pixtral_tower():
    assert_leaves_forwards(patch_padded_image_batch, zoo.build("llava"))


def test_a_pixtral_tower_without_a_merger_after_it_is_left_alone():
    # LLaVA over Pixtral splits the tower's tokens per image itself: the padded grid's tokens would mislead it
    import transformers

    config = transformers.LlavaConfig(
        vision_config=transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                       num_attention_heads=2, image_size=32, patch_size=8),
        text_config=transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2), image_token_index=5)
    model = transformers.LlavaForConditionalGeneration(config)
    tower = type(model.model.vision_tower)
    before = vars(tower)["forward"]
    with patch_padded_image_batch(model):
        assert vars(tower)["forward"] is before


def test_a_prompt_with_a_placeholder_more_than_the_images_give_is_refused_as_in_eager():
    model = zoo.build(MISTRAL3)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(MISTRAL3, batch=2, sequence=7))(model))
    inputs, features = _padded_batch(model.config)
    inputs["input_ids"][0, -1] = model.config.image_token_id
    with pytest.raises(ValueError, match="do not match"):
        model(**inputs)
    with pytest.raises(RuntimeError):
        exported(**inputs)
