"""Model patches: state preserved, untraceable attention switched (their contract: test_contract.py)."""

from __future__ import annotations

import pytest
import torch

from hfx import zoo
from hfx.patches import (
    default_patches,
    patch_attention_implementation,
    preserve_module_state,
)


def test_preserve_module_state_undoes_attribute_and_buffer_changes():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    weight = model[0].weight
    with preserve_module_state(model):
        model[0].cached = torch.ones(1)
        model[0].register_buffer("extra", torch.zeros(1))
        model[0].weight = torch.nn.Parameter(torch.zeros(2, 2))
    assert "cached" not in vars(model[0]) and "extra" not in model[0]._buffers
    assert model[0].weight is weight


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_attention_that_cannot_be_traced_is_sdpa_inside(implementation):
    model = zoo.build("llama")
    model.config._attn_implementation_internal = implementation
    with patch_attention_implementation(model):
        assert model.config._attn_implementation == "sdpa"


def test_attention_switch_leaves_sdpa_and_eager_alone():
    model = zoo.build("llama")
    with patch_attention_implementation(model):
        assert "_attn_implementation_internal" in vars(model.config)
        assert model.config._attn_implementation == "sdpa"


def test_default_patches_is_a_plain_tuple():
    patches = default_patches(torch.nn.Linear(1, 1))
    names = [getattr(p, "func", p).__name__ for p in patches]
    assert isinstance(patches, tuple) and all(callable(p) for p in patches) and len(set(names)) == len(names)
