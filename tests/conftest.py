"""Shared, session-scoped models and exports: each expensive export runs once per test session."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import decomposed_by_name, exported_by_name, memoized, one_layer

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: one thread each, so they do not fight over the cores.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _hfx_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="hfx")
        yield


@pytest.fixture(scope="session")
def models():
    """One tiny model per parity architecture, built lazily."""
    return memoized(zoo.build)


@pytest.fixture(scope="session")
def exported(models):
    """One ``Exported`` per parity architecture, exported once per session from capture-shaped inputs."""
    return exported_by_name(models)


@pytest.fixture(scope="session")
def lowered_onnx(exported):
    """``lowered_onnx(name, **options)``: the parity architecture's ``Exported`` lowered to ONNX once per session
    for each set of options (a program is immutable: tests that quantize or wrap it get new ones)."""
    return memoized(lambda name, **options: hfx.lower_to_onnx(exported(name), **options))


@pytest.fixture(scope="session")
def generative(models):
    """``(model, exported Components)`` per generative architecture, decomposed and exported once per session."""
    return decomposed_by_name(models)


@pytest.fixture(scope="session")
def generative_one_layer():
    """``(model, exported Components)`` of ``tests.helpers.one_layer(name)``, decomposed and exported once per session."""
    return decomposed_by_name(memoized(one_layer))
