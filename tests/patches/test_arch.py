"""Architecture patches: eager numbers, no-ops elsewhere, a fixed export (their contract: test_contract.py)."""

from __future__ import annotations


import pytest
import torch
from transformers.models.dinov2 import modeling_dinov2

import hfx
from hfx import zoo
from hfx.patches import arch_patches, patch_position_interpolation
from hfx.patches._arch import is_interpolating_vision_model
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE
from tests.tolerances import FP32_SAME_KERNELS

EMBEDDINGS = modeling_dinov2.Dinov2Embeddings
ORIGINAL = vars(EMBEDDINGS)["interpolate_pos_encoding"]


@pytest.fixture(scope="module")
def dinov2():
    return zoo.build("dinov2")


def test_position_interpolation_leaves_other_models_alone():
    model = zoo.build("vit")
    assert not is_interpolating_vision_model(model)
    with patch_position_interpolation(model):
        assert vars(EMBEDDINGS)["interpolate_pos_encoding"] is ORIGINAL


def test_position_interpolation_gives_eager_numbers_at_both_sizes(dinov2):
    for shape in (CAPTURE_SHAPE, NEW_SHAPE):  # the trained 32 px (identity resampling) and 48 px
        pixels = zoo.inputs("dinov2", **shape)
        with torch.no_grad():
            want = dinov2(**pixels).logits
            with patch_position_interpolation(dinov2):
                got = dinov2(**pixels).logits
        assert torch.allclose(got, want, atol=FP32_SAME_KERNELS)


def test_dinov2_exports_with_dynamic_image_size_and_matches_eager_at_a_new_size(dinov2):
    # Without the patch the trained-size shortcut pins height and width to 32 and a 48 px image is rejected.
    exported = hfx.export(hfx.capture(zoo.inputs("dinov2", **CAPTURE_SHAPE), dinov2))
    assert exported.io.inputs[0].shape == ("batch", 3, "height", "width")
    report = hfx.verify(dinov2, zoo.inputs("dinov2", **NEW_SHAPE), exported)
    assert report.passed, str(report)


def test_arch_patches_are_bound_to_the_model(dinov2):
    (patch,) = arch_patches(dinov2)
    assert patch.func is patch_position_interpolation and patch.args == (dinov2,)
