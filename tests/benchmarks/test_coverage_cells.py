"""``benchmarks/_coverage_cells.py``: an image model's forward cell holds the program to eager at another image size."""

from __future__ import annotations

import torch

import hfx
from benchmarks import _coverage_cells as cells


class _Pooled(torch.nn.Module):
    def forward(self, pixel_values, pixel_mask):
        return (pixel_values * pixel_mask[:, None]).mean((-2, -1))


class _Program:
    """A stand-in program over ``_Pooled``: off by ``offset`` from eager, or refusing every call."""

    class io:  # noqa: N801 - what hfx.verify reads
        constants: dict = {}

    name = "program"

    def __init__(self, offset: float = 0.0, refuse: bool = False) -> None:
        self.offset, self.refuse = offset, refuse

    def __call__(self, **inputs):
        if self.refuse:
            raise hfx.InputError("axis 2 of input 'pixel_values' (height) is 48, outside the program's bounds")
        return _Pooled()(**inputs) + self.offset


def test_images_and_their_masks_are_resized_together_and_other_inputs_are_not():
    inputs = {"pixel_values": torch.ones(2, 3, 32, 32), "pixel_mask": torch.ones(2, 32, 32, dtype=torch.long),
              "labels": torch.ones(2, 32)}
    resized = cells.at_another_image_size(inputs)
    assert {name: tuple(value.shape) for name, value in resized.items()} == {
        "pixel_values": (2, 3, 48, 40), "pixel_mask": (2, 48, 40), "labels": (2, 32)}
    assert resized["pixel_mask"].dtype == torch.long and bool((resized["pixel_mask"] == 1).all())
    assert cells.at_another_image_size({"input_ids": torch.ones(2, 7, dtype=torch.long)}) is None
    video = cells.at_another_image_size({"pixel_values": torch.ones(2, 8, 3, 32, 32)})  # batch x frames x C x H x W
    assert tuple(video["pixel_values"].shape) == (2, 8, 3, 48, 40)


def test_a_program_that_takes_the_size_must_match_eager_and_one_that_refuses_it_passes():
    inputs = cells.at_another_image_size({"pixel_values": torch.randn(2, 3, 32, 32), "pixel_mask": torch.ones(2, 32, 32)})
    model = _Pooled()
    assert cells._at_image_size(model, inputs, _Program()) == {"image_size": "48x40: pass"}
    assert cells._at_image_size(model, inputs, _Program(refuse=True)) == {"image_size": "48x40: refused"}
    wrong = cells._at_image_size(model, inputs, _Program(offset=1.0))
    assert wrong["status"] == "fail" and wrong["reason"].startswith("at 48x40: parity")
