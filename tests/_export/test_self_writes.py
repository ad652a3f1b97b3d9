"""``self_writes``: a buffer re-assigned to itself (CTRL's ``self.pos_encoding = self.pos_encoding.to(...)``)."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx._export.self_writes import self_writes, without_self_writes


class _Recast(torch.nn.Module):
    """CTRL's pattern: a table re-assigned to itself cast to the input's dtype and device."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(1.0, 33.0, dtype=dtype).reshape(16, 2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.table = self.table.to(device=x.device, dtype=x.dtype)
        return x + self.table[: x.shape[1]].sum(-1)


class _Counts(torch.nn.Module):
    """A buffer written with a new value: state, not a self-write."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.ones(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step.copy_(self.step + 1)
        return x + self.step


def _program(module: torch.nn.Module) -> torch.export.ExportedProgram:
    return torch.export.export(module, (torch.ones(2, 5),), strict=False)


def _copies(program: torch.export.ExportedProgram) -> int:
    return sum(node.target is torch.ops.aten.copy_.default for node in program.graph.nodes)


def test_a_buffer_recast_to_its_own_dtype_is_a_self_write_and_is_taken_out():
    program = _program(_Recast())
    assert len(self_writes(program)) == _copies(program) == 1
    before = program.module()(torch.ones(2, 5))
    assert _copies(without_self_writes(program)) == 0
    torch.testing.assert_close(program.module()(torch.ones(2, 5)), before, rtol=0, atol=0)


@pytest.mark.parametrize("module", [_Counts(), _Recast(torch.float64)], ids=["new value", "rounded by a cast"])
def test_a_write_that_changes_the_buffer_is_kept(module):
    program = _program(module)
    assert _copies(program) == 1
    assert self_writes(program) == []


def test_an_export_of_the_pattern_writes_no_buffer():
    exported = hfx.export(hfx.capture({"x": torch.ones(2, 5)}, _Recast()))
    assert _copies(exported.program) == 0
    assert exported.program.run_decompositions({}).graph_signature.buffers_to_mutate == {}
