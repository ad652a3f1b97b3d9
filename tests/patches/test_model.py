"""Model patches: state preserved, eval mode given back, attention switched and restored."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hfx import PatchError, zoo
from hfx.patches import (
    default_patches,
    patch_attention_implementation,
    patch_eval_mode,
    preserve_module_state,
    with_patches,
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


def test_preserve_module_state_restores_after_an_exception():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError), preserve_module_state(model):
        model.cached = 1
        raise RuntimeError
    assert "cached" not in vars(model)


def test_eval_mode_inside_training_flags_back_after():
    model = torch.nn.Sequential(torch.nn.Dropout(), torch.nn.Linear(1, 1)).train()
    model[1].eval()
    with patch_eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == [True, True, False]


def test_attention_switch_active_inside_restored_after():
    model = zoo.build("llama")
    model.config._attn_implementation_internal = "flex_attention"
    with patch_attention_implementation(model):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "flex_attention"
    assert vars(model.config)["_attn_implementation_internal"] == "flex_attention"


def test_attention_switch_unwound_when_a_later_patch_fails():
    model = zoo.build("llama")
    model.config._attn_implementation_internal = "flash_attention_2"

    @contextlib.contextmanager
    def broken():
        raise ValueError
        yield

    with pytest.raises(PatchError), with_patches(lambda: patch_attention_implementation(model), broken):
        pass
    assert model.config._attn_implementation == "flash_attention_2"


def test_attention_switch_leaves_sdpa_and_eager_alone():
    model = zoo.build("llama")
    with patch_attention_implementation(model):
        assert "_attn_implementation_internal" in vars(model.config)
        assert model.config._attn_implementation == "sdpa"


def test_default_patches_is_a_plain_tuple():
    patches = default_patches(torch.nn.Linear(1, 1))
    names = [getattr(p, "func", p).__name__ for p in patches]
    assert isinstance(patches, tuple) and all(callable(p) for p in patches) and len(set(names)) == len(names)
