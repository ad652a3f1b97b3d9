"""patch_functional_token_shift: MBart's decoder inputs rotated without in-place writes."""

from __future__ import annotations

import torch
from transformers.models.mbart import modeling_mbart
from transformers.models.plbart import modeling_plbart

import hfx
from hfx import zoo
from hfx.patches import patch_functional_token_shift, rotated_decoder_inputs
from tests.helpers import assert_leaves_forwards, forward_report_at_a_new_shape

MBART = "sequence-classification:mbart"


def test_the_rotation_equals_mbarts_and_plbarts_shift():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (4, 9), generator=generator)
    ids[1, 6:], ids[2, 3:] = 1, 1  # right padding
    ids[3, 4] = -100  # a label's ignored position
    for module in (modeling_mbart, modeling_plbart):
        assert torch.equal(rotated_decoder_inputs(ids, 1), module.shift_tokens_right(ids, 1))
    model = zoo.build(MBART)
    with patch_functional_token_shift(model):
        assert modeling_mbart.shift_tokens_right is rotated_decoder_inputs
    assert modeling_mbart.shift_tokens_right is not rotated_decoder_inputs
    assert_leaves_forwards(patch_functional_token_shift, zoo.build("bart"))


def test_mbart_on_openvino_matches_eager_at_another_batch():
    report = forward_report_at_a_new_shape(MBART, hfx.lower_to_ov)
    assert report.passed, report
