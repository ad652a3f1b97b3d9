"""long_scatter_indices: an int32 index of ``scatter_add`` cast to the int64 ExecuTorch's edge dialect requires."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx.backends._executorch_dtypes import long_scatter_indices

pytest.importorskip("executorch")


class _TopkMask(torch.nn.Module):
    """GLM-5-Next's pattern: a mask built by ``scatter_add`` at int32 top-k indices."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        scores = input_ids.float().sin()
        picked = scores.topk(2, dim=-1).indices.to(torch.int32)
        mask = torch.zeros_like(input_ids, dtype=torch.int32)
        counts = torch.zeros_like(input_ids, dtype=torch.int32)
        counts.scatter_add_(-1, picked, torch.ones_like(picked))  # in place, as GLM-5-Next writes it
        return mask.scatter_add(-1, picked, torch.ones_like(picked)) + counts


def _exported() -> hfx.Exported:
    return hfx.export(hfx.capture({"input_ids": torch.arange(14).view(2, 7)}, _TopkMask()))


def test_the_int32_index_is_cast_and_the_values_kept():
    program = _exported().program.module()  # the graph as exported: the in-place op kept
    assert long_scatter_indices(program.graph) == 2
    program.recompile()
    scatters = [n for n in program.graph.nodes if n.target in (torch.ops.aten.scatter_add.default,
                                                                 torch.ops.aten.scatter_add_.default)]
    assert all(n.args[2].target is torch.ops.aten._to_copy.default and n.args[2].kwargs["dtype"] is torch.int64
               for n in scatters)
    input_ids = torch.arange(21).view(3, 7) * 7 % 11
    assert torch.equal(program(input_ids=input_ids), _TopkMask()(input_ids))


def test_a_scatter_add_at_int32_indices_lowers_to_executorch_with_eagers_values():
    program = hfx.lower_to_pte(_exported())
    for batch, length in ((2, 7), (3, 9)):
        input_ids = torch.arange(batch * length).view(batch, length) * 7 % 11
        assert torch.equal(program(input_ids=input_ids), _TopkMask()(input_ids))


def test_without_the_cast_executorch_still_refuses_an_int32_index(monkeypatch):
    """Canary: when this fails, ExecuTorch's edge dialect takes an int32 scatter_add index and the cast can go."""
    from hfx.backends import _executorch

    monkeypatch.setattr(_executorch, "long_scatter_indices", lambda graph: 0)
    with pytest.raises(hfx.LoweringError, match="mismatched dtypes"):
        hfx.lower_to_pte(_exported())
