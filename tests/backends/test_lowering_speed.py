"""The lowering-speed patch every runtime's lowering enters (hfx.backends._lowering_speed)."""

from __future__ import annotations

import torch
from torch._export import utils
from torch.export import decomp_utils, exported_program

import hfx
from hfx.backends import _lowering_speed
from hfx.backends._lowering_speed import (
    materialisations,
    materialises_per_namespace,
    patch_cia_ops_materialized_once_per_collection,
)


def test_torch_still_materialises_once_per_namespace():
    """The canary: while this holds, the patch has work to do (delete the module when it fails)."""
    assert materialises_per_namespace()
    _, times = materialisations(utils._collect_all_valid_cia_ops)
    assert times > 10  # one per op namespace: aten's answer is cached, each other namespace materialises again


def test_inside_the_patch_a_collection_materialises_once_and_finds_the_same_ops():
    unpatched, _ = materialisations(utils._collect_all_valid_cia_ops)
    with patch_cia_ops_materialized_once_per_collection():
        patched, times = materialisations(utils._collect_all_valid_cia_ops)
        assert decomp_utils._collect_all_valid_cia_ops is utils._collect_all_valid_cia_ops
        assert exported_program._collect_all_valid_cia_ops is utils._collect_all_valid_cia_ops
    assert times == 1
    assert patched == unpatched and len(patched) > 100
    assert not hasattr(utils._collect_all_valid_cia_ops, "__wrapped__")


def test_a_nested_entry_steps_aside():
    with patch_cia_ops_materialized_once_per_collection():
        outer = utils._collect_all_valid_cia_ops
        with patch_cia_ops_materialized_once_per_collection():
            assert utils._collect_all_valid_cia_ops is outer
        assert utils._collect_all_valid_cia_ops is outer
        assert utils._materialize_cpp_cia_ops is not _lowering_speed._materialised  # noqa: SLF001


def test_a_lowering_runs_under_the_patch_and_leaves_torch_as_it_was(monkeypatch):
    seen = []
    original = utils._materialize_cpp_cia_ops

    def spied():
        seen.append(hasattr(utils._collect_all_valid_cia_ops, "__wrapped__"))
        original()

    monkeypatch.setattr(utils, "_materialize_cpp_cia_ops", spied)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU())
    exported = hfx.export(hfx.capture({"input": torch.randn(2, 4)})(model))
    program = hfx.lower_to_onnx(exported)
    assert seen and all(seen)  # ONNX's run_decompositions asked, always inside the patch
    assert not hasattr(utils._collect_all_valid_cia_ops, "__wrapped__")
    new = torch.randn(5, 4)
    torch.testing.assert_close(program(input=new), model(new))
