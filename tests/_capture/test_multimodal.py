"""The multimodal helpers of decompose: feature methods, feature rows, and whether a tower's output is its model's
features."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hfx import zoo
from hfx._capture.multimodal import feature_methods, feature_rows, same_features
from tests.helpers import forward_report_at_a_new_shape

QWEN35_CLASSIFIER = "sequence-classification:qwen3_5"


def test_feature_rows_prefers_the_pooled_output_and_joins_per_image_lists():
    hidden, pooled = torch.randn(2, 3, 4), torch.randn(5, 4)
    assert feature_rows(BaseModelOutputWithPooling(last_hidden_state=hidden)).shape == (6, 4)
    assert torch.equal(feature_rows(BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)), pooled)
    assert torch.equal(feature_rows({"pooler_output": [pooled[:2], pooled[2:]]}), pooled)


def test_a_split_of_the_towers_output_is_the_same_features_and_an_aligned_one_is_not():
    merged = torch.randn(6, 4)
    tower = BaseModelOutputWithPooling(last_hidden_state=torch.randn(6, 8), pooler_output=merged)
    assert same_features({"pooler_output": list(merged.split([2, 4]))}, tower)  # Qwen2-VL's per-image split
    assert not same_features({"pooler_output": merged * 2}, tower)  # an aligner after the tower
    assert not same_features(merged, (merged,))  # a tuple holds no named features


def test_a_head_that_says_text_has_its_base_models_feature_methods():
    model = zoo.build(QWEN35_CLASSIFIER)
    assert model.input_modalities == "text" and "image" in model.base_model.input_modalities
    assert feature_methods(model) == {"image": "get_image_features", "video": "get_video_features"}
    assert feature_methods(torch.nn.Linear(1, 1)) == {}


def test_qwen35s_classifier_exports_with_its_images_and_matches_eager_at_another_shape():
    report = forward_report_at_a_new_shape(QWEN35_CLASSIFIER)
    assert report.passed, report
