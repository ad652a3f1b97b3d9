"""patch_deepstack_gather: Qwen3-VL's deepstack features added at the visual tokens without a boolean index."""

from __future__ import annotations

import torch

from hfx import zoo
from hfx.patches import patch_deepstack_gather, rows_added_at_mask

QWEN3_VL = "image-text-to-text:qwen3_vl"


def _text_model(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if "_deepstack_process" in vars(type(m)))


def test_the_gather_adds_transformers_rows_for_any_mask():
    text_model = _text_model(zoo.build(QWEN3_VL))
    generator = torch.Generator().manual_seed(0)
    for rows in (0, 1, 5):
        hidden = torch.randn(2, 6, 4, generator=generator)
        mask = torch.zeros(12, dtype=torch.bool)
        mask[torch.randperm(12, generator=generator)[:rows]] = True
        mask = mask.reshape(2, 6)
        embeds = torch.randn(rows, 4, generator=generator)
        want = text_model._deepstack_process(hidden, mask, embeds)
        assert torch.equal(rows_added_at_mask(hidden, mask, embeds), want)
        with patch_deepstack_gather(text_model):
            assert torch.equal(text_model._deepstack_process(hidden, mask, embeds), want)


def _class_attributes(model: torch.nn.Module) -> dict[type, dict[str, object]]:
    return {type(m): dict(vars(type(m))) for m in model.modules()}


def test_is_a_no_op_without_deepstack_and_restores_the_method():
    model = zoo.build("llama")
    before = _class_attributes(model)
    with patch_deepstack_gather(model):
        assert _class_attributes(model) == before
    text_model = _text_model(zoo.build(QWEN3_VL))
    original = vars(type(text_model))["_deepstack_process"]
    with patch_deepstack_gather(text_model):
        assert vars(type(text_model))["_deepstack_process"] is not original
    assert vars(type(text_model))["_deepstack_process"] is original
