"""The suite's shared exports (tests/shared_exports.py): equal inputs share one export, any difference traces again."""

from __future__ import annotations

import functools

import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import one_layer
from tests.shared_exports import fingerprint, identity_key, sharing, sharing_by_identity, suspended

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


def test_identity_key_reads_plain_values_and_containers_and_counts_the_rest_by_identity():
    record = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 2)))
    key, pinned = identity_key(record, {"sequence": (1, 8)}, ("a", 2))
    assert key == identity_key(record, {"sequence": (1, 8)}, ("a", 2))[0]
    assert any(p is record for p in pinned)
    assert key != identity_key(record, {"sequence": (1, 9)}, ("a", 2))[0]
    twin = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 2)))
    assert key != identity_key(twin, {"sequence": (1, 8)}, ("a", 2))[0]


def test_a_conversion_is_shared_for_one_exported_until_its_weights_change_and_each_caller_gets_a_copy():
    calls = []

    def convert(exported, options, log):
        calls.append(log)
        return [exported.name, options]

    shared = sharing_by_identity(convert, skip=("log",), copy=list)
    model = torch.nn.Linear(3, 2)
    exported = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, model), patches=())
    first = shared(exported, (1, 2), log="first")
    second = shared(exported, (1, 2), log="second")
    assert first == second and first is not second and calls == ["first"]  # the log is not in the key
    shared(exported, (1, 3), log="other options")
    with suspended():
        shared(exported, (1, 2), log="suspended")
    with torch.no_grad():
        exported.program.state_dict["weight"][0, 0] += 1
    shared(exported, (1, 2), log="new weights")
    assert calls == ["first", "other options", "suspended", "new weights"]


def test_the_suite_shares_each_runtime_conversion_of_one_exported():
    exported = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 2)))
    first, second = hfx.lower_to_ov(exported), hfx.lower_to_ov(exported)
    assert first.model is not second.model  # each program compiled its own copy of the one conversion
    assert hfx.lower_to_onnx(exported).model is hfx.lower_to_onnx(exported).model
    assert hfx.lower_to_onnx(exported).model is not hfx.lower_to_onnx(exported, optimize=False).model
