"""Vision patches: packed images, per-image splits and window order, as the tower computes them (contract: test_contract.py)."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx.patches import patch_packed_vision_attention
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY, FP32_SAME_KERNELS


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
    torch.testing.assert_close(patched, eager, atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)


def test_flash_attention_is_requested_for_the_towers_config_only(tower):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    text_config = zoo.build("qwen2_vl").config.text_config
    with patch_packed_vision_attention(tower):
        assert modeling.is_flash_attention_requested(tower.config)
        assert not modeling.is_flash_attention_requested(text_config)  # the language model keeps sdpa


def test_a_model_without_packed_towers_is_untouched(models):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    before = modeling.ALL_ATTENTION_FUNCTIONS
    with patch_packed_vision_attention(models("llama")):
        assert modeling.ALL_ATTENTION_FUNCTIONS is before


def _eager_and_patched_features(model, pixels, **kwargs):
    from hfx.patches import patch_per_image_feature_split

    with torch.no_grad():
        eager = model.model.get_image_features(pixels, **kwargs).pooler_output
        with patch_per_image_feature_split(model):
            patched = model.model.get_image_features(pixels, **kwargs).pooler_output
    return eager, patched


@pytest.mark.parametrize("name", ["llava", "idefics3"])
def test_per_image_split_gives_every_images_tokens_joined(models, name):
    model = models(name)
    pixels = zoo.inputs(name, batch=3, sequence=4)["pixel_values"]
    eager, patched = _eager_and_patched_features(model, pixels)
    assert len(eager) == 3 and len(patched) == 1  # one tensor, whatever the number of images
    torch.testing.assert_close(patched[0], torch.cat(list(eager), dim=0), atol=FP32_SAME_KERNELS, rtol=FP32_SAME_KERNELS)


def test_per_image_split_patch_leaves_models_without_the_pattern_alone(models):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Model

    from hfx.patches import patch_per_image_feature_split

    original = vars(Gemma3Model)["get_image_features"]  # projects, no per-image split
    with patch_per_image_feature_split(zoo.build("gemma3")):
        assert vars(Gemma3Model)["get_image_features"] is original


def test_llava_forward_exports_with_a_dynamic_batch(models):
    import hfx

    model = models("llava")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("llava", batch=2, sequence=3), model))
    assert exported.io.inputs[0].shape[0] == "batch"
    inputs = zoo.forward_inputs("llava", batch=3, sequence=4)
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(exported(**inputs).logits, expected, atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)


def test_per_image_split_patch_leaves_a_feature_encoder_stopping_at_the_projector(models):
    from hfx._capture.multimodal import FeatureEncoder
    from hfx.patches import patch_per_image_feature_split

    model = models("llava")
    encoder = FeatureEncoder(model.model, "get_image_features", "multi_modal_projector")
    pixels = zoo.inputs("llava", batch=2, sequence=4)["pixel_values"]
    with torch.no_grad():
        eager = encoder(pixel_values=pixels)
        with patch_per_image_feature_split(model):  # active for the class, the encoder's view included
            patched = encoder(pixel_values=pixels)
    assert torch.equal(patched, eager)


def test_a_packed_towers_per_image_split_gives_every_images_tokens_joined(models):
    model = models("qwen2_5_vl")
    grid = torch.tensor([[1, 4, 4], [1, 2, 6], [2, 2, 2]])  # three images of 4, 3 and 2 tokens
    pixels = _images(model.model.visual, grid)
    eager, patched = _eager_and_patched_features(model, pixels, image_grid_thw=grid)
    assert [len(t) for t in eager] == [4, 3, 2] and len(patched) == 1
    torch.testing.assert_close(patched[0], torch.cat(list(eager), dim=0), atol=0, rtol=0)


def test_the_packed_split_patch_passes_precomputed_inputs_to_the_tower(models):
    from hfx._capture.vision_inputs import tower_inputs
    from hfx.patches import patch_per_image_feature_split

    model = models("qwen2_vl")
    grid = torch.tensor([[1, 4, 4], [1, 2, 2]])
    pixels = _images(model.model.visual, grid)
    given = {f"image_{k}": v for k, v in tower_inputs(model.model.visual, pixels, grid).items()}
    with torch.no_grad(), patch_per_image_feature_split(model):
        computed = model.model.get_image_features(pixels, grid).pooler_output[0]
        precomputed = model.model.get_image_features(pixels, grid, **given).pooler_output[0]
        one_image = {**given, "image_cu_seqlens": given["image_cu_seqlens"][[0, -1]]}
        misread = model.model.get_image_features(pixels, grid, **one_image).pooler_output[0]
    assert torch.equal(precomputed, computed)
    assert not torch.allclose(misread, computed, atol=FP32_PARITY)  # beyond rounding


def test_the_window_order_is_undone_without_a_sort_and_the_tower_gives_its_own_features(models):
    """The tower's own features, and a graph without a sort (ExecuTorch has none) or sizes from ``patches // 4``."""
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as modeling

    from hfx.patches import patch_window_permutation

    model = models("qwen2_5_vl")
    tower = model.model.visual
    grid = torch.tensor([[1, 4, 4], [1, 2, 6], [2, 2, 2]])
    pixels = _images(tower, grid)
    with torch.no_grad():
        eager = tower(pixels, grid_thw=grid).pooler_output
        with patch_window_permutation(model):
            assert modeling.torch.argsort(torch.tensor([2, 0, 1])).tolist() == [1, 2, 0]
            patched = tower(pixels, grid_thw=grid).pooler_output
            program = torch.export.export(_Undo(), (torch.tensor([1, 3, 0, 2]),), strict=False)
    assert torch.equal(patched, eager)
    assert "aten.sort" not in str(program.graph) and "argsort" not in str(program.graph)
    with patch_window_permutation(model):  # unpatched, torch asks for patches = 4*_patches (a guard on every size)
        args = (torch.randn(32, 8), torch.arange(8))
        shapes = ({0: torch.export.Dim("patches")}, {0: torch.export.Dim("window")})
        traced = torch.export.export(_Permute(tower), args, dynamic_shapes=shapes, strict=False)
    windows = traced.graph.find_nodes(op="placeholder")[-1].meta["val"].shape[0]
    rows = traced.graph.find_nodes(op="output")[0].args[0][0].meta["val"].shape[0]
    assert str(rows) == f"4*{windows}"  # sized by the windows, which ExecuTorch can bound


class _Permute(torch.nn.Module):
    def __init__(self, tower):
        super().__init__()
        self.tower = tower

    def forward(self, rows, window_index):
        return self.tower.permute_input_for_window_attn(rows, window_index, rows.shape[0])


class _Undo(torch.nn.Module):
    def forward(self, index):
        import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as modeling

        return modeling.torch.argsort(index)


def test_the_window_patch_leaves_other_models_alone(models):
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as modeling
    import transformers.models.qwen2_vl.modeling_qwen2_vl as qwen2_vl

    from hfx.patches import patch_window_permutation

    with patch_window_permutation(models("qwen2_vl")):  # no windows: nothing to undo
        assert vars(qwen2_vl)["torch"] is torch and vars(modeling)["torch"] is torch


def test_a_projector_after_a_packed_tower_is_joined_so_the_image_count_stays_dynamic():
    # HyperCLOVAX-Vision-V2 splits its projector's output per image: torch.split(image_embeds, split_sizes)
    name = "image-text-to-text:hyperclovax_vision_v2"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7))(model))
    grids = next(spec for spec in exported.io.inputs if spec.name == "image_grid_thw")
    assert grids.shape[0] != 2  # not pinned to the capture's two images
    report = hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported)
    assert report.passed, report


def test_packed_attention_serves_grouped_query_heads_as_eager_attention_does():
    # EXAONE 4.5's tower has 4 query heads over 2 key/value heads: each key head serves two consecutive query
    # heads (transformers' repeat_kv). Before, the mask's sdpa failed to broadcast the heads ("length 2 at -1").
    from transformers.integrations.sdpa_attention import repeat_kv

    from hfx.patches._vision import packed_attention

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 7, 8, generator=generator)
    key, value = torch.randn(2, 1, 2, 7, 8, generator=generator)
    boundaries = torch.tensor([0, 3, 7])
    got, _ = packed_attention(None, query, key, value, cu_seq_lens_q=boundaries, scaling=0.5)
    for start, end in zip(boundaries[:-1].tolist(), boundaries[1:].tolist()):  # each image alone, heads repeated
        want = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end], repeat_kv(key[:, :, start:end], 2), repeat_kv(value[:, :, start:end], 2), scale=0.5)
        torch.testing.assert_close(got[:, start:end], want.transpose(1, 2), rtol=FP32_PARITY, atol=FP32_PARITY)
