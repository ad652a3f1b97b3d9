"""patch_eos_pooling_gather: BART-style classifiers pooled at the last <eos> by a gather."""

from __future__ import annotations

import pytest
import torch

from hfx import zoo
from hfx.patches import patch_eos_pooling_gather, rows_at_last_true
from tests.helpers import assert_leaves_forwards, forward_report_at_a_new_shape

BART_FAMILY = ["sequence-classification:bart", "sequence-classification:mbart", "sequence-classification:plbart",
               "sequence-classification:mvp", "sequence-classification:t5", "sequence-classification:mt5",
               "sequence-classification:umt5"]


def test_the_gather_takes_each_rows_last_true_as_the_boolean_index_does():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 6, 4, generator=generator)
    mask = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 1], [0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(rows_at_last_true(hidden, mask), hidden[mask, :].view(3, -1, 4)[:, -1, :])


@pytest.mark.parametrize("name", BART_FAMILY)
def test_the_patched_classifier_gives_eagers_logits_and_restores_forward(name):
    model = zoo.build(name)
    inputs = zoo.forward_inputs(name, batch=3, sequence=11)
    original = type(model).forward
    with torch.no_grad():
        want = model(**inputs)
        with patch_eos_pooling_gather(model):
            assert type(model).forward is not original
            got = model(**inputs)
            as_tuple = model(**inputs, return_dict=False)  # the original forward's own return
    assert type(model).forward is original
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)
    torch.testing.assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state, rtol=0, atol=0)
    assert isinstance(as_tuple, tuple)


def test_a_call_with_labels_keeps_the_loss():
    name = BART_FAMILY[0]
    model = zoo.build(name)
    inputs = zoo.forward_inputs(name, batch=2, sequence=7)
    labels = torch.tensor([0, 1])
    with torch.no_grad():
        want = model(**inputs, labels=labels).loss
        with patch_eos_pooling_gather(model):
            got = model(**inputs, labels=labels).loss
    torch.testing.assert_close(got, want)
    assert_leaves_forwards(patch_eos_pooling_gather, zoo.build("llama"))


def test_the_t5_family_classifier_exports_with_a_dynamic_sequence_and_matches_eager():
    # the boolean index gave ExecuTorch a data-dependent row count; the BART and T5 families' ExecuTorch cells
    # pass in the coverage record (benchmarks/results/coverage-generated.json)
    report = forward_report_at_a_new_shape("sequence-classification:mt5")
    assert report.passed, report
