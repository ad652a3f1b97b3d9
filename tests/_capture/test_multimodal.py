"""The multimodal helpers of decompose: feature rows, and whether a tower's output is its model's features."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hfx._capture.multimodal import feature_rows, same_features


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
