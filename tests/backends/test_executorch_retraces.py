"""The lowering-speed patches: an unchanged graph is not retraced, bilinear patterns are not built while torch keeps
the op whole, a decomposition with nothing to do is skipped, the edge dtype check reads recorded values, and the program
is the same bytes with and without each."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx.backends import PTE_PATCHES  # noqa: E402
from hfx.backends._executorch_retraces import (  # noqa: E402
    bilinear_kept_whole,
    decomposes_nothing,
    patch_bilinear_patterns_not_built_when_kept_whole,
    patch_decompositions_in_one_retrace,
    patch_decompositions_skipped_when_nothing_decomposes,
    patch_edge_dtype_check_reads_metadata,
    patch_export_pass_skips_unchanged_retraces,
)


class _Block(torch.nn.Module):
    """Linear layers, an activation and a concatenation: partitions that XNNPACK's passes change and leave alone."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(6, 8), torch.nn.Linear(8, 4)

    def forward(self, values):
        hidden = torch.relu(self.first(values))
        return torch.cat([self.second(hidden), values[..., :2].clone()], dim=-1)


def _graph_module():
    program = torch.export.export(_Block(), (torch.randn(3, 6),))
    return program.graph_module


def test_a_plain_pass_returns_an_unchanged_graph_as_it_is_and_retraces_a_changed_one():
    from executorch.exir.pass_base import ExportPass

    graph_module = _graph_module()
    with patch_export_pass_skips_unchanged_retraces():
        traced = ExportPass()(graph_module).graph_module  # never traced by ExportPass: retraced
        assert traced is not graph_module
        again = ExportPass()(traced)
        assert again.graph_module is traced and not again.modified
        node = next(n for n in traced.graph.nodes if n.op == "call_function")
        with traced.graph.inserting_after(node):
            traced.graph.call_function(torch.ops.aten.relu.default, (node,))  # a pass's change: retraced
        assert ExportPass()(traced).graph_module is not traced
    assert "call" not in vars(ExportPass)  # restored: ExportPass inherits it again


def test_a_pass_that_works_in_a_per_node_hook_always_retraces():
    from executorch.exir.pass_base import ExportPass

    class Counting(ExportPass):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def call_operator(self, op, args, kwargs, meta):
            self.calls += 1
            return super().call_operator(op, args, kwargs, meta)

    with patch_export_pass_skips_unchanged_retraces():
        traced = ExportPass()(_graph_module()).graph_module
        counting = Counting()
        assert counting(traced).graph_module is not traced and counting.calls > 0


def test_the_program_is_the_same_bytes_with_and_without_the_patch(monkeypatch):
    """Also the canary: ExecuTorch's lowering still reaches ExportPass.call with graphs no pass has changed."""
    skips = _block_lowered_with_and_without(patch_export_pass_skips_unchanged_retraces, "works_in_call_only",
                                            monkeypatch)
    assert sum(skips) >= 10  # XNNPACK's no-op passes over each partition, at least


def _block_lowered_with_and_without(patch, check_name: str, monkeypatch, block=None) -> list[bool]:
    """Lower ``block`` (a ``_Block``) with every patch and without ``patch``: the same bytes, eager's values at another
    batch. Returns what the patch's check ``_executorch_retraces.<check_name>`` answered in the patched lowering."""
    from hfx.backends import _executorch_retraces

    torch.manual_seed(0)
    block = (block or _Block()).eval()
    shapes = hfx.DynamicShapes(axes={"values": {0: "batch"}}, bounds={"batch": (1, 8)})
    exported = hfx.export(hfx.capture({"values": torch.randn(3, 6)}, block, dynamic_shapes=shapes))
    answers = []
    check = getattr(_executorch_retraces, check_name)
    monkeypatch.setattr(_executorch_retraces, check_name, lambda *a: answers.append(check(*a)) or answers[-1])
    patched = hfx.lower_to_pte(exported)
    monkeypatch.undo()
    plain = hfx.lower_to_pte(exported, patches=tuple(p for p in PTE_PATCHES if p is not patch))
    assert patched.buffer == plain.buffer
    values = torch.randn(4, 6)  # another batch than the capture's, within the planned 4
    torch.testing.assert_close(patched(values=values), block(values), atol=1e-5, rtol=0)
    return answers


class _Upsample(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, pixels):
        return torch.nn.functional.interpolate(self.conv(pixels), scale_factor=2, mode="bilinear", align_corners=False)


def test_xnnpacks_bilinear_patterns_are_the_whole_op_while_torch_keeps_it():
    """The canary: when torch decomposes the op again, the patterns hold its parts and the patch steps aside."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    assert bilinear_kept_whole()
    for pattern in bilinear_2d.get_graphs():
        calls = [str(node.target) for node in pattern.graph.nodes if node.op == "call_function"]
        assert len(calls) == 1 and "upsample_bilinear2d.vec" in calls[0]


def test_a_bilinear_upsample_lowers_to_the_same_bytes_without_building_the_patterns(monkeypatch):
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    torch.manual_seed(0)
    model = _Upsample().eval()
    static = hfx.DynamicShapes(axes={}, bounds={})  # XNNPACK's bilinear resize takes static shapes only
    exported = hfx.export(hfx.capture({"pixels": torch.randn(1, 3, 8, 8)}, model, dynamic_shapes=static))
    plain = hfx.lower_to_pte(exported, patches=tuple(p for p in PTE_PATCHES if p is not patch_bilinear_patterns_not_built_when_kept_whole))
    built = []
    monkeypatch.setattr(bilinear_2d, "get_graphs_dict", lambda: built.append(1) or {})
    patched = hfx.lower_to_pte(exported)
    assert not built and patched.buffer == plain.buffer
    pixels = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(patched(pixels=pixels), model(pixels), atol=1e-5, rtol=0)


class _CacheWrite(torch.nn.Module):
    """A linear layer written into a cache buffer by ExecuTorch's ``llama::update_cache`` (a mutating op)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.register_buffer("cache", torch.zeros(1, 8, 2, 3))

    def forward(self, values):
        torch.ops.llama.update_cache(self.linear(values).view(1, -1, 2, 3), self.cache, 0)
        return torch.nn.functional.silu(self.cache.sum(dim=(2, 3)))


def test_a_decomposition_with_nothing_to_do_is_recognised():
    from executorch.exir.program._program import _default_decomposition_table

    from hfx._capture.internal_cache import load_custom_ops

    load_custom_ops()
    program = torch.export.export(_CacheWrite(), (torch.randn(1, 4, 6),))
    table = _default_decomposition_table()
    assert not decomposes_nothing(program, {})  # llama::update_cache writes its cache: not functional yet
    functional = program.run_decompositions({})  # the mutation becomes auto_functionalized
    assert decomposes_nothing(functional, {}) and not decomposes_nothing(functional, table)  # silu has an entry
    assert decomposes_nothing(functional.run_decompositions(table), table)


def test_an_empty_decomposition_returns_the_program_and_a_lowering_is_the_same_bytes(monkeypatch):
    """Also the canary: ExecuTorch's lowering still runs a decomposition that has nothing to do."""
    program = torch.export.export(_Block(), (torch.randn(3, 6),)).run_decompositions({})
    with patch_decompositions_skipped_when_nothing_decomposes():
        functional = program.run_decompositions({})
        assert functional.run_decompositions({}) is functional
        assert functional.run_decompositions(None) is not functional  # the default table: run as asked
    assert not hasattr(torch.export.ExportedProgram.run_decompositions, "hfx_skips_empty")  # put back
    assert any(_block_lowered_with_and_without(patch_decompositions_skipped_when_nothing_decomposes,
                                               "decomposes_nothing", monkeypatch))


class _Pad(torch.nn.Module):
    """A linear layer whose features are padded at the end (as Mamba 2 pads its sequence to whole chunks) or cropped
    (a negative pad, RWKV's token shift)."""

    def __init__(self, pad):
        super().__init__()
        self.linear, self.pad = torch.nn.Linear(6, 6), pad

    def forward(self, values):
        return torch.nn.functional.pad(self.linear(values), self.pad)


@pytest.mark.parametrize(("pad", "declined"), [((0, 2), True), ((1, -1), False)])
def test_a_pad_that_hfxs_cropping_decomposition_declines_is_nothing_to_decompose(pad, declined):
    from executorch.exir.program import _program

    from hfx.backends._executorch_fixes import patch_edge_decomposition_table

    with patch_edge_decomposition_table():
        table = _program._default_decomposition_table()
    without_pad = {op: entry for op, entry in table.items() if op is not torch.ops.aten.constant_pad_nd.default}
    program = torch.export.export(_Pad(pad), (torch.randn(3, 6),)).run_decompositions(without_pad)
    assert decomposes_nothing(program, without_pad)
    assert decomposes_nothing(program, table) is declined
    decomposed = program.run_decompositions(table)
    assert decomposes_nothing(decomposed, table)
    pads = [node for node in decomposed.graph.nodes if node.target is torch.ops.aten.constant_pad_nd.default]
    assert len(pads) == 1 and list(pads[0].args[1]) == ([0, 2] if declined else [1, 0])  # kept / cropped positive


def test_a_lowering_that_skips_the_declined_pads_decomposition_is_the_same_bytes(monkeypatch):
    answers = _block_lowered_with_and_without(patch_decompositions_skipped_when_nothing_decomposes,
                                              "decomposes_nothing", monkeypatch, block=_Pad((0, 2)))
    assert answers.count(True) >= 2  # ExecuTorch's two decompositions after the one that functionalised


def _retraces(monkeypatch, patches) -> int:
    """How many times torch's own ``run_decompositions`` retraces ``_CacheWrite`` (a mutation, and a SiLU that the
    table decomposes) while it is lowered with ``patches``; its outputs are eager's."""
    from hfx._capture.internal_cache import load_custom_ops

    load_custom_ops()
    calls = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    module, values = _CacheWrite().eval(), torch.randn(1, 4, 6)
    program = hfx.lower_to_pte(hfx.export(hfx.capture({"values": values}, module)), patches=patches)
    monkeypatch.undo()
    torch.testing.assert_close(program(values=values), module(values), atol=1e-5, rtol=0)
    return len(calls)


def test_one_decomposition_retrace_lowers_to_the_same_bytes_with_one_retrace_less(monkeypatch):
    """Also the canary: ExecuTorch still functionalises in a retrace of its own before it decomposes."""
    answers = _block_lowered_with_and_without(patch_decompositions_in_one_retrace, "partitioner_table", monkeypatch)
    assert len(answers) == 1  # one table, for XNNPACK's partitioner
    without = tuple(p for p in PTE_PATCHES if p is not patch_decompositions_in_one_retrace)
    assert _retraces(monkeypatch, PTE_PATCHES) == _retraces(monkeypatch, without) - 1 == 1


def test_one_decomposition_retrace_steps_aside_without_the_skip(monkeypatch):
    # Without the skip, ExecuTorch's own calls would retrace again: the patch would add one, so it does nothing.
    without_skip = tuple(p for p in PTE_PATCHES if p is not patch_decompositions_skipped_when_nothing_decomposes)
    alone = tuple(p for p in without_skip if p is not patch_decompositions_in_one_retrace)
    assert _retraces(monkeypatch, without_skip) == _retraces(monkeypatch, alone)


class _MatMul(torch.nn.Module):
    def forward(self, left, right):
        return torch.mm(left, right).relu()


def _edge_graph_module():
    from executorch.exir import to_edge

    program = torch.export.export(_MatMul(), (torch.randn(3, 4), torch.randn(4, 2)))
    return to_edge(program).exported_program().graph_module


def test_the_edge_dtype_check_reads_the_recorded_values_and_still_refuses_a_mismatch():
    """Also the canary: ExecuTorch's check still runs the ops (a recorded shape mm refuses fails it)."""
    from executorch.exir.verification.verifier import SpecViolationError, _check_tensor_args_matching_op_allowed_dtype

    graph_module = _edge_graph_module()
    left = next(node for node in graph_module.graph.nodes if node.op == "placeholder")
    recorded = left.meta["val"]
    left.meta["val"] = recorded.new_empty(3, 5)  # a shape mm would refuse: only a check that runs it fails
    with pytest.raises(Exception, match="reduction dim"):
        _check_tensor_args_matching_op_allowed_dtype(graph_module)
    with patch_edge_dtype_check_reads_metadata():
        _check_tensor_args_matching_op_allowed_dtype(graph_module)
        left.meta["val"] = recorded.to(torch.int32)  # mm's arguments of two dtypes: refused as without the patch
        with pytest.raises(SpecViolationError, match=r"aten\.mm\.default.*'self': torch\.int32, 'mat2': torch\.float32"):
            _check_tensor_args_matching_op_allowed_dtype(graph_module)
    with pytest.raises(SpecViolationError, match=r"aten\.mm\.default"):
        _check_tensor_args_matching_op_allowed_dtype(graph_module)


def test_the_dtype_check_from_recorded_values_lowers_to_the_same_bytes(monkeypatch):
    validators = _block_lowered_with_and_without(patch_edge_dtype_check_reads_metadata, "_recorded_value_validator",
                                                 monkeypatch)
    assert len(validators) == 1 and validators[0].hfx_reads_metadata
