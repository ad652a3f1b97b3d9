"""What the package tests write from: the zoo's Llama decomposed into one graph for prompt and steps, exported once."""

from __future__ import annotations

import pytest
from toolz import pipe

import hfx
from hfx import zoo


@pytest.fixture(scope="session")
def llama(models):
    return models("llama")


@pytest.fixture(scope="session")
def parts(llama):
    """``Components`` with one ``Exported`` decode, captured from a padded batch of two prompts."""
    prompt = zoo.tokenizer()(["hello world, export once", "the quick brown fox"], return_tensors="pt", padding=True)
    return pipe(llama, hfx.capture(dict(prompt)), hfx.decompose(multi_token_decode=True), hfx.export)
