"""Size arithmetic the runtimes compute as torch does: floor division of a size that may be negative.

torch writes a ceiling of a dynamic size as ``-((-n) // k)``; ONNX Runtime (torch.onnx's int64 ``Div``)
and OpenVINO's CPU plugin rounded it toward zero, so an output came out one row short, silently.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch

import hfx
from hfx.backends._size_arithmetic import floor_divisions_of_signed_sizes

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")

from hfx.backends import ONNX_FIXES, OV_GRAPH_FIXES  # noqa: E402
from hfx.backends._onnx_fixes import size_divisions_rounded_down  # noqa: E402
from hfx.backends._openvino_fixes import floor_divisions_in_float_range  # noqa: E402


class _CeilingRows(torch.nn.Module):
    """``ceil(sequence / 4)`` rows, written as torch writes a ceiling of a size: ``-((-n) // 4)``."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = -((-input_ids.shape[1]) // 4)
        return input_ids.new_ones(input_ids.shape[0], rows)


class _FloorRows(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids.new_ones(input_ids.shape[0], input_ids.shape[1] // 4 + 1)


class _TwoCeilings(torch.nn.Module):
    """``ceil(sequence / batch)`` then ``ceil(sequence / 4)`` rows: a symbolic divisor before a constant one."""

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, sequence = input_ids.shape
        per_row = input_ids.new_ones(-((-sequence) // batch))
        return per_row, input_ids.new_ones(-((-sequence) // 4))


def _exported(module: torch.nn.Module) -> hfx.Exported:
    return hfx.export(hfx.capture({"input_ids": torch.ones(2, 7, dtype=torch.long)}, module))


def _rows(program, length: int) -> int:
    return program(input_ids=torch.ones(3, length, dtype=torch.long)).shape[1]


LENGTHS = (1, 4, 7, 9, 13, 1000)


def test_only_divisions_of_a_possibly_negative_size_are_rewritten():
    ceiling, floor = _exported(_CeilingRows()).program, _exported(_FloorRows()).program
    assert floor_divisions_of_signed_sizes(floor.graph) == 0
    assert floor_divisions_of_signed_sizes(ceiling.graph) == 1
    divisions = [n for n in ceiling.graph.nodes if n.target is operator.floordiv]
    assert len(divisions) == 1 and divisions[0].args[1] == 4  # the shifted dividend over the same divisor


@pytest.mark.parametrize("lower", [hfx.lower_to_onnx, hfx.lower_to_ov], ids=["onnx", "ov"])
def test_a_ceiling_of_a_size_has_eagers_rows_on_every_runtime(lower):
    program = lower(_exported(_CeilingRows()))
    assert [_rows(program, n) for n in LENGTHS] == [-(-n // 4) for n in LENGTHS]


def test_without_the_fix_onnx_runtime_still_rounds_toward_zero():
    """Canary: when this fails, torch.onnx floors sizes and ``size_divisions_rounded_down`` can go."""
    fixes = tuple(f for f in ONNX_FIXES if f is not size_divisions_rounded_down)
    program = hfx.lower_to_onnx(_exported(_CeilingRows()), fixes=fixes)
    assert _rows(program, 7) == 1  # eager: 2


def test_without_the_fix_openvino_still_rounds_toward_zero():
    """Canary: when this fails, OpenVINO floors sizes and ``floor_divisions_in_float_range`` can go."""
    fixes = tuple(f for f in OV_GRAPH_FIXES if f is not floor_divisions_in_float_range)
    program = hfx.lower_to_ov(_exported(_CeilingRows()), graph_fixes=fixes)
    assert _rows(program, 7) == 1  # eager: 2


@pytest.mark.parametrize("lower", [hfx.lower_to_onnx, hfx.lower_to_ov], ids=["onnx", "ov"])
def test_each_division_gets_its_own_shift(lower):
    # the shift of one rewritten division (a node, for a symbolic divisor) must not become the next one's
    exported = _exported(_TwoCeilings())
    assert floor_divisions_of_signed_sizes(copy.deepcopy(exported.program.graph_module).graph) == 2
    program = lower(exported)
    for batch, length in ((2, 7), (3, 11), (4, 13)):
        per_row, quarters = program(input_ids=torch.ones(batch, length, dtype=torch.long))
        assert (per_row.shape[0], quarters.shape[0]) == (-(-length // batch), -(-length // 4))
