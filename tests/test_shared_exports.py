"""The suite's shared exports (tests/shared_exports.py): equal inputs share one export, any difference traces again."""

from __future__ import annotations

import functools

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import one_layer
from tests.shared_exports import fingerprint, sharing

_exported_from_flat = hfx._export.export.exported_from_flat  # noqa: SLF001
_unshared = getattr(_exported_from_flat, "__wrapped__", _exported_from_flat)  # the suite installs the shared one


def _key(*values):
    return fingerprint(*values)[0]


def test_two_models_built_alike_have_one_fingerprint_and_any_change_gives_another():
    first, second = one_layer("llama"), one_layer("llama")
    inputs = zoo.inputs("llama")
    assert _key(first, inputs) == _key(second, inputs)
    with torch.no_grad():
        second.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    assert _key(first, inputs) != _key(second, inputs)
    third = one_layer("llama")
    third.model.rotary_emb.inv_freq[0] += 1  # a buffer torch.export bakes in, not in the state dict
    assert _key(first, inputs) != _key(third, inputs)
    assert _key(first, inputs) != _key(one_layer("llama", rms_norm_eps=1e-3), inputs)  # the config
    assert _key(first, inputs) != _key(first, {**inputs, "input_ids": inputs["input_ids"] + 1})
    assert _key(first, inputs) != _key(first.train(), inputs)


def test_functions_count_by_code_defaults_and_closure():
    def make(scale):
        return lambda x: x * scale

    assert _key(make(2)) == _key(make(2))
    assert _key(make(2)) != _key(make(3))
    assert _key(functools.partial(max, 1)) != _key(functools.partial(max, 2))


def test_what_has_no_value_counts_by_identity_and_is_kept_alive():
    lock = torch.Generator()
    digest, pinned = fingerprint(lock)
    assert any(p is lock for p in pinned)
    assert digest != _key(torch.Generator())


def test_an_export_is_shared_until_its_weights_change():
    calls = []

    def export_counting(flat, shapes, patches):
        calls.append(flat.name)
        return _unshared(flat, shapes, patches)

    model = torch.nn.Linear(3, 2)
    capture = hfx.flatten_signature(hfx.capture({"input": torch.ones(2, 3)}, model))
    shapes = hfx.infer_dynamic_shapes(capture)
    shared = sharing(export_counting)
    first = shared(capture, shapes, ())
    assert shared(capture, shapes, ()) is first and len(calls) == 1
    with torch.no_grad():
        model.weight[0, 0] += 1  # the stored program reads the same parameter: it no longer matches its digest
    again = shared(hfx.flatten_signature(hfx.capture({"input": torch.ones(2, 3)}, model)), shapes, ())
    assert again is not first and len(calls) == 2


@pytest.mark.fresh_exports
def test_a_test_marked_fresh_exports_traces_again():
    model = torch.nn.Linear(3, 2)
    capture = hfx.capture({"input": torch.ones(2, 3)}, model)
    assert hfx.export(capture).program is not hfx.export(capture).program
