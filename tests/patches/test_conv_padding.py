"""patch_integer_conv_padding: EnCodec-style padded convolutions with int padding sizes."""

from __future__ import annotations

import torch
from transformers.models.mimi import modeling_mimi

import hfx
from hfx import zoo
from hfx.patches import extra_padding, patch_integer_conv_padding
from tests.helpers import forward_report_at_a_new_shape

MIMI = "feature-extraction:mimi_encoder"


def _convs(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, modeling_mimi.MimiConv1d)]


def test_the_integer_padding_is_mimis_for_every_length_and_conv():
    convs = _convs(zoo.build(MIMI))
    assert len({(int(c.kernel_size), int(c.stride)) for c in convs}) > 1
    for conv in convs:
        for length in range(1, 40):
            x = torch.zeros(1, 1, length)
            assert int(conv._get_extra_padding_for_conv1d(x)) == extra_padding(conv, x)  # noqa: SLF001


def test_the_sizes_are_ints_inside_and_the_buffers_come_back():
    model = zoo.build(MIMI)
    conv = _convs(model)[0]
    buffers = dict(model.named_buffers())
    with patch_integer_conv_padding(model):
        assert isinstance(conv.padding_total, int) and isinstance(conv.padding_left, int)
        assert "stride" not in conv._buffers  # noqa: SLF001
    assert dict(model.named_buffers()).keys() == buffers.keys()
    assert all(a is b for a, b in zip(dict(model.named_buffers()).values(), buffers.values(), strict=True))
    assert isinstance(conv.padding_left, torch.Tensor)


def test_mimis_encoder_on_onnx_takes_another_length():
    # was: "Could not guard on data-dependent expression" at the convolutions' padding
    report = forward_report_at_a_new_shape(MIMI, hfx.lower_to_onnx)
    assert report.passed, report
