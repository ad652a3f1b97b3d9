"""Size arithmetic the runtimes compute as torch does: floor division and remainder of a size that may be negative.

torch writes a ceiling of a dynamic size as ``-((-n) // k)``; ONNX Runtime (torch.onnx's int64 ``Div``)
and OpenVINO's CPU plugin rounded it toward zero, so an output came out one row short, silently. It
writes a padding up to whole blocks as ``(-n) % k``, whose remainder ExecuTorch took with the dividend's sign.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch

import hfx
from hfx.backends._size_arithmetic import floor_divisions_of_signed_sizes, remainders_of_signed_sizes

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


class _PaddedToBlocks(torch.nn.Module):
    """Tokens padded up to whole blocks of 4 by ``(-n) % 4`` (as LongT5's local attention pads), summed per block."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(input_ids, (0, (-input_ids.shape[1]) % 4))
        return padded.view(input_ids.shape[0], -1, 4).sum(-1)


class _RemainderRows(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids.new_ones(input_ids.shape[0], input_ids.shape[1] % 4 + 1)


def _exported(module: torch.nn.Module) -> hfx.Exported:
    return hfx.export(hfx.capture({"input_ids": torch.ones(2, 7, dtype=torch.long)}, module))


def _rows(program, length: int) -> int:
    return program(input_ids=torch.ones(3, length, dtype=torch.long)).shape[1]


LENGTHS = (1, 4, 7, 9, 13, 1000)


@pytest.mark.parametrize(("rewrite", "target", "signed", "unsigned"), [
    (floor_divisions_of_signed_sizes, operator.floordiv, _CeilingRows, _FloorRows),
    (remainders_of_signed_sizes, operator.mod, _PaddedToBlocks, _RemainderRows),
], ids=["floordiv", "mod"])
def test_only_arithmetic_on_a_possibly_negative_size_is_rewritten(rewrite, target, signed, unsigned):
    rewritten, plain = _exported(signed()).program, _exported(unsigned()).program
    assert rewrite(plain.graph) == 0
    assert rewrite(rewritten.graph) == 1
    nodes = [n for n in rewritten.graph.nodes if n.target is target]
    assert len(nodes) == 1 and nodes[0].args[1] == 4  # the shifted dividend over the same divisor


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


# --- remainders: ExecuTorch's prim mod takes C's remainder ---------------------------------------------------


def test_a_padding_up_to_whole_blocks_has_eagers_values_on_executorch():
    pytest.importorskip("executorch")
    module = _PaddedToBlocks()
    program = hfx.lower_to_pte(_exported(module))
    for length in (5, 7, 8, 9, 13):  # torch narrows the sequence to >= 5 (the blocks' view)
        input_ids = torch.arange(3 * length).view(3, length)
        assert torch.equal(program(input_ids=input_ids), module(input_ids)), length


def test_without_the_rewrite_executorchs_remainder_still_takes_the_dividends_sign(monkeypatch):
    """Canary: when this fails, ExecuTorch's ``executorch_prim::mod.Scalar`` takes Python's remainder and the
    rewrite in ``lower_to_pte`` can go."""
    pytest.importorskip("executorch")
    from hfx.backends import _executorch

    monkeypatch.setattr(_executorch, "remainders_of_signed_sizes", lambda graph: 0)
    program = hfx.lower_to_pte(_exported(_PaddedToBlocks()))
    with pytest.raises(hfx.LoweringError, match="InvalidArgument"):  # "Padding values must be non-negative"
        program(input_ids=torch.ones(3, 7, dtype=torch.long))


# --- powers: ExecuTorch has no power of sizes ----------------------------------------------------------------


class _SquaredWindow(torch.nn.Module):
    """A window clamped to the sequence, its area written as a power (``n ** 2``), as sympy writes Swin's."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = torch.sym_min(input_ids.shape[1], 4)
        return torch.ones(n ** 2, dtype=torch.long).sum() + input_ids[:, :n].sum(-1)


def test_a_size_squared_is_lowered_to_executorch_as_a_product():
    pytest.importorskip("executorch")
    module = _SquaredWindow()
    exported = _exported(module)
    assert operator.pow in {node.target for node in exported.program.graph.nodes}
    program = hfx.lower_to_pte(exported)
    for length in (2, 3, 6, 9):
        input_ids = torch.arange(3 * length).view(3, length)
        assert torch.equal(program(input_ids=input_ids), module(input_ids)), length


def test_without_the_rewrite_executorch_still_has_no_power_of_sizes(monkeypatch):
    """Canary: when this fails, ExecuTorch runs ``operator.pow`` of sizes and ``integer_powers_as_products`` can go."""
    pytest.importorskip("executorch")
    from hfx.backends import _executorch

    monkeypatch.setattr(_executorch, "integer_powers_as_products", lambda graph: 0)
    with pytest.raises(hfx.LoweringError, match="invalid target for call_function <built-in function pow>"):
        hfx.lower_to_pte(_exported(_SquaredWindow()))
