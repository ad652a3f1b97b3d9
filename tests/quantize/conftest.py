"""Shared inputs for the quantization tests: calibration samples, new inputs and the eager reference."""

from __future__ import annotations

import pytest
import torch

from hfx import zoo
from tests.helpers import NEW_SHAPE


@pytest.fixture(scope="session")
def samples():
    """Calibration samples for the tiny Llama, at other shapes than the capture and the check."""
    return [zoo.inputs("llama", batch=batch, sequence=sequence) for batch, sequence in ((1, 5), (2, 9), (1, 13))]


@pytest.fixture(scope="session")
def reference(models):
    """``(new inputs, eager fp32 logits)`` for the tiny Llama."""
    inputs = zoo.inputs("llama", **NEW_SHAPE)
    with torch.no_grad():
        return inputs, models("llama")(**inputs).logits
