"""Shared, session-scoped models and exports: each expensive export runs once per test session."""

from __future__ import annotations

import warnings

import pytest
import torch

import hfx
from hfx import zoo

# Capture shapes, and the different shapes every parity test uses.
CAPTURE_SHAPE = {"batch": 2, "sequence": 7}
NEW_SHAPE = {"batch": 3, "sequence": 11}
PARITY_MODELS = ("llama", "qwen3", "bert", "vit")


@pytest.fixture(autouse=True)
def _hfx_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="hfx")
        yield


@pytest.fixture(scope="session")
def models():
    """One tiny model per parity architecture, built lazily."""
    cache: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in cache:
            cache[name] = zoo.build(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def exported(models):
    """One ``Exported`` per parity architecture, exported once per session from capture-shaped inputs."""
    cache: dict[str, hfx.Exported] = {}

    def get(name: str) -> hfx.Exported:
        if name not in cache:
            cache[name] = hfx.export(hfx.capture(zoo.inputs(name, **CAPTURE_SHAPE), models(name)))
        return cache[name]

    return get


def new_inputs(name: str) -> dict[str, torch.Tensor]:
    """Inputs of a different batch size and sequence length than the capture."""
    return zoo.inputs(name, **NEW_SHAPE)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A deep copy of the model's parameters and buffers, to compare after a stage."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
