"""patch_packed_vision_attention: one masked attention over packed images, the tower's own result; restored after."""

from __future__ import annotations

import pytest
import torch

from hfx import zoo
from hfx.patches import patch_packed_vision_attention


@pytest.fixture(scope="module")
def tower(models):
    return models("qwen2_vl").model.visual


def _images(tower, grid):
    generator = torch.Generator().manual_seed(int(grid.sum()))
    patch_dim = tower.patch_embed.proj.weight[0].numel()
    return torch.randn(int(grid.prod(-1).sum()), patch_dim, generator=generator)


def test_packed_images_give_the_towers_own_features(tower):
    grid = torch.tensor([[1, 4, 4], [1, 2, 6], [1, 4, 2]])
    pixels = _images(tower, grid)
    with torch.no_grad():
        eager = tower(pixels, grid_thw=grid).pooler_output
        with patch_packed_vision_attention(tower):
            patched = tower(pixels, grid_thw=grid).pooler_output
    torch.testing.assert_close(patched, eager, atol=1e-5, rtol=1e-5)


def test_only_the_towers_modeling_module_is_swapped_and_restored(tower):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    before = (modeling.is_flash_attention_requested, modeling.ALL_ATTENTION_FUNCTIONS)
    text_config = zoo.build("qwen2_vl").config.text_config
    with patch_packed_vision_attention(tower):
        assert modeling.is_flash_attention_requested(tower.config)
        assert not modeling.is_flash_attention_requested(text_config)  # the language model keeps sdpa
    assert (modeling.is_flash_attention_requested, modeling.ALL_ATTENTION_FUNCTIONS) == before


def test_restored_after_an_exception(tower):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    before = modeling.ALL_ATTENTION_FUNCTIONS
    with pytest.raises(RuntimeError), patch_packed_vision_attention(tower):
        raise RuntimeError
    assert modeling.ALL_ATTENTION_FUNCTIONS is before


def test_a_model_without_packed_towers_is_untouched(models):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    before = modeling.ALL_ATTENTION_FUNCTIONS
    with patch_packed_vision_attention(models("llama")):
        assert modeling.ALL_ATTENTION_FUNCTIONS is before
