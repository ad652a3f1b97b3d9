"""``without_runtime_asserts`` (hfx/_export/asserts.py), the pass every runtime but torch lowers through, in isolation."""

from __future__ import annotations

import torch

import hfx
from hfx._export.asserts import without_runtime_asserts
from tests.helpers import DataDependent


def _asserts(exported: hfx.Exported) -> int:
    return sum(node.target is torch.ops.aten._assert_scalar.default for node in exported.program.graph.nodes)


def test_runtime_asserts_are_dropped_and_the_given_program_is_kept():
    exported = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, DataDependent()))
    stripped = without_runtime_asserts(exported)
    assert _asserts(exported) > 0 and _asserts(stripped) == 0
    doubled, zeros = stripped.program.module()(input=torch.ones(4, 3))
    assert torch.equal(doubled, torch.full((4, 3), 2.0)) and zeros.shape == (12,)
    # the copy keeps the input's name (a graph copy renames a builtin's, ``input`` -> ``input_1``)
    assert [n.name for n in stripped.program.graph.find_nodes(op="placeholder")] == ["input"]
