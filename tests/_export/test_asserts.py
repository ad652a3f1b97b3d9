"""Which runtime asserts an exported program keeps (hfx/_export/asserts.py), and what that means for a whole export."""

from __future__ import annotations

import torch

import hfx
from hfx import zoo
from hfx._export.asserts import is_assert, on_input_sizes_only, without_asserts
from tests.helpers import DataDependent


def test_a_data_dependent_check_is_not_an_input_size_assert():
    program = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, DataDependent())).program
    asserts = [node for node in program.graph.nodes if is_assert(node)]
    assert asserts and not any(on_input_sizes_only(node) for node in asserts)
    assert without_asserts(program, drop=on_input_sizes_only) is program  # nothing to drop: the same program


def test_a_traced_size_assumption_does_not_refuse_a_smaller_valid_input():
    # ResNet's export is deferred (its pooling leaves guards torch cannot prove); tracing at 32 x 32 px left
    # ``Ne((width - 1) // 8, 0)``, which refused 8 x 8 px and batch 1 although eager and the graph agree there.
    model = zoo.build("resnet")
    exported = hfx.export(hfx.capture(zoo.forward_inputs("resnet", batch=2, sequence=7), model))
    assert not any(on_input_sizes_only(node) for node in exported.program.graph.nodes if is_assert(node))
    small = zoo.forward_inputs("resnet", batch=1, sequence=1)
    assert small["pixel_values"].shape == (1, 3, 8, 8)
    assert hfx.verify(model, small, exported).passed
