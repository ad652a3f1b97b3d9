"""``PTE_PATCHES``: what each ExecuTorch workaround does, that it steps aside without its bug, and the patch contract.

Each tiny module below has the pattern one patch handles; lowering it (2-10 s)
checks that the ``.pte`` computes what eager does. The canaries lower without the
patch (``lower_to_pte(patches=...)``) and fail when ExecuTorch has fixed the bug.
"""

from __future__ import annotations


import pytest
import torch
from transformers.pytorch_utils import Conv1D

pytest.importorskip("executorch")

import hfx  # noqa: E402
from hfx._verify import verify  # noqa: E402
from hfx.backends import PTE_PATCHES  # noqa: E402
from hfx.backends import _executorch_fixes as fixes  # noqa: E402
from hfx.backends._decompositions import dense_scatter_reduce  # noqa: E402
from hfx.backends._executorch import DEFAULT_MAX_SIZES, PteProgram, lower_to_pte  # noqa: E402
from hfx.backends._executorch_fixes import (  # noqa: E402
    acyclic_partitions,
    exact_upper_bound,
    flash_attention_for_cpu_like_query,
    laid_out_like,
    patch_edge_decomposition_table,
    patch_edge_validator_list_returns,
    patch_dim_order_of_data_dependent_strides,
    patch_view_copies_of_static_bases_kept,
    patch_symbolic_empties_as_zeros,
    patch_edge_verifier_sym_functions,
    patch_exact_upper_bounds,
    patch_unbacked_upper_bounds,
    patch_sdpa_decomposition_layout,
    patch_xnnpack_acyclic_partitions,
    patch_xnnpack_conv1d_dynamic_dims,
    patch_xnnpack_max_dim,
    patch_xnnpack_prelu_4d,
    patch_xnnpack_tanh_gelu,
    stable_dim_order,
    UnbackedBounds,
)
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE, EmptyValues, empty_values_export, empty_values_step  # noqa: E402
from tests.tolerances import FP32_ONE_BLOCK, FP32_SAME_KERNELS  # noqa: E402

_FLASH_FOR_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_HIDDEN, _HEADS = 32, 4


class _Conv1d(torch.nn.Module):
    """A wav2vec2-like feature extractor: a strided 1-D convolution over ``[batch, channels, frames]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 4, kernel_size=3, stride=2)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.conv(input_values).relu()


class _BatchNorm1d(torch.nn.Module):
    """A conformer convolution module's normalisation: ``BatchNorm1d`` over ``[batch, channels, frames]`` (Parakeet)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4).eval()
        self.norm.running_mean.uniform_(-1, 1)
        self.norm.running_var.uniform_(0.5, 2)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.norm(input_values.tanh())


class _StackedRows(torch.nn.Module):
    """Image rows picked with a boolean mask (UltraVBERT), stacked: a ``[2, u0, 8]`` tensor, strides ``(8 * u0, 8, 1)``."""

    def forward(self, values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        rows = values[keep.bool()]
        return torch.stack([rows, rows * 2]).sum(1)


class _GridPositions(torch.nn.Module):
    """HunYuan-VL's position embeddings in small: a table resampled to each image's ``h x w`` and repeated ``t`` times,
    ``t, h, w`` read from ``grid_thw``'s data (unbacked), added to the packed patches of every image."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        resized = [torch.nn.functional.interpolate(self.table, size=(h, w), mode="bilinear").permute(0, 2, 3, 1)
                   .reshape(-1, 4).repeat(t, 1) for t, h, w in grid_thw.tolist()]
        return pixel_values + torch.cat(resized)


class _UnitMax(torch.nn.Module):
    """Hiera's mask-unit pooling: the max over dim 1 of ``[batch, units, tokens, hidden]``, the dim dropped."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return (values * 2).max(dim=1).values


class _Chunked(torch.nn.Module):
    """A Mamba-like gated projection: ``in_proj(x).chunk(2, dim=-1)`` of a batched tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 8)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(values).chunk(2, dim=-1)
        return value * torch.sigmoid(gate)


class _TanhGelu(torch.nn.Module):
    """Gemma's MLP activation, ``gelu_pytorch_tanh``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 64)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(values), approximate="tanh")


class _Bucketed(torch.nn.Module):
    """Idefics3's patch positions: ``torch.bucketize`` of fractional coordinates into fixed boundaries."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        boundaries = torch.arange(1 / 8, 1.0, 1 / 8)
        return torch.bucketize(values, boundaries, right=True) * 2 + torch.bucketize(values, boundaries)


class _Windowed(torch.nn.Module):
    """Swin's window partition: pad to even, view as ``[batch, P // 2, P // (P // 2)]`` (always 2), then pairs."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(values, (0, values.shape[1] % 2))
        windows = padded.view(padded.shape[0], padded.shape[1] // 2, -1)
        return (windows.unsqueeze(-1) * windows.unsqueeze(-2)).sum(-1)


class _Conv1DAttention(torch.nn.Module):
    """GPT-2 attention in small: fused ``c_attn`` split into heads, SDPA with a padding mask, ``Conv1D`` out."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = Conv1D(3 * _HIDDEN, _HIDDEN)
        self.c_proj = Conv1D(_HIDDEN, _HIDDEN)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        shape = (*inputs_embeds.shape[:-1], -1, _HIDDEN // _HEADS)
        q, k, v = (t.view(shape).transpose(1, 2) for t in self.c_attn(inputs_embeds).split(_HIDDEN, dim=2))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask[:, None, None, :] > 0)
        return self.c_proj(out.transpose(1, 2).contiguous().reshape(*inputs_embeds.shape[:-1], -1))


def _exported_tiny(
    module: torch.nn.Module, example: torch.Tensor, axes: dict[int, str], *, name: str = "values"
) -> hfx.Exported:
    shapes = hfx.DynamicShapes(axes={name: axes}, bounds={dim: (1, 64) for dim in axes.values()})
    return hfx.export(hfx.capture({name: example}, module, dynamic_shapes=shapes))


def _lowered_tiny(
    module: torch.nn.Module, example: torch.Tensor, axes: dict[int, str], *, name: str = "values"
) -> PteProgram:
    return lower_to_pte(_exported_tiny(module, example, axes, name=name))


def _attention_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, : sequence // 3] = 0
    return {"inputs_embeds": torch.randn(batch, sequence, _HIDDEN), "attention_mask": mask}


@pytest.fixture(scope="module")
def attention():
    """The small GPT-2 attention and its export at the usual capture shape."""
    torch.manual_seed(0)
    model = _Conv1DAttention().eval()
    return model, hfx.export(hfx.capture(_attention_inputs(**CAPTURE_SHAPE), model))


def _edge_decomposed(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` decomposed with ExecuTorch's edge table, as ``to_edge`` does first."""
    from executorch.exir.tracer import _default_decomposition_table

    return program.run_decompositions(_default_decomposition_table())


def _node(shape: tuple[object, ...], *args: object, **kwargs: object) -> torch.fx.Node:
    """An FX ``call_function`` node whose ``meta["val"]`` has ``shape`` (strings are symbolic dims)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten.relu.default, args, kwargs)
    sizes = [env.create_unbacked_symint() if isinstance(d, str) else d for d in shape]
    with torch._subclasses.FakeTensorMode(shape_env=env):
        node.meta["val"] = torch.empty(sizes)
    return node


def _without(patch) -> tuple:
    return tuple(p for p in PTE_PATCHES if p is not patch)


# --- the edge verifier -----------------------------------------------------------------------------


def test_verifier_patch_steps_aside_when_the_allowlist_has_the_sym_functions(monkeypatch):
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS
    from executorch.exir.verification import verifier

    fixed = {*vars(verifier)["_EXECUTORCH_SYM_OPS"], *_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS}
    monkeypatch.setattr(verifier, "_EXECUTORCH_SYM_OPS", fixed)
    with patch_edge_verifier_sym_functions():
        assert vars(verifier)["_EXECUTORCH_SYM_OPS"] is fixed


# --- the edge dtype validator ----------------------------------------------------------------------


def test_a_chunk_of_the_batch_dim_keeps_the_batch_dynamic():
    torch.manual_seed(0)
    module = _Chunked()
    program = _lowered_tiny(module, torch.randn(2, 5, 4), {0: "batch"})
    assert program.io.bounds["batch"] == (1, DEFAULT_MAX_SIZES["batch"])
    x = torch.randn(3, 5, 4)
    assert torch.allclose(program(values=x), module(x), atol=FP32_ONE_BLOCK)


def test_without_the_validator_patch_a_chunk_still_fixes_the_batch():
    """Canary: when this fails, the validator keeps the batch of a split dynamic and the patch can go."""
    torch.manual_seed(0)
    exported = _exported_tiny(_Chunked(), torch.randn(2, 5, 4), {0: "batch"})
    program = lower_to_pte(exported, patches=_without(patch_edge_validator_list_returns))
    with pytest.raises(hfx.LoweringError, match=r"set_inputs\(\) for method 'forward' failed with error 0x10"):
        program(values=torch.randn(3, 5, 4))


def test_the_validator_patch_sees_a_tensor_list_return_whole():
    from executorch.exir.dialects._ops import ops as exir_ops

    seen = []

    class Probe:
        node = _node((2, 3))

    def original(self, target, args, kwargs):
        seen.append(self.node.meta["val"])

    Probe.node.meta["val"] = [torch.empty(2, 3), torch.empty(2, 3)]
    wrapped = fixes._validating_list_returns_whole(original)
    wrapped(Probe(), exir_ops.edge.aten.split_with_sizes_copy.default, (), {})
    wrapped(Probe(), exir_ops.edge.aten.relu.default, (), {})
    assert isinstance(seen[0], tuple) and seen[0][0] is seen[1]  # wrapped for the call, restored after
    assert isinstance(Probe.node.meta["val"], list)


# --- the edge decompositions -----------------------------------------------------------------------


def test_bucketize_is_decomposed_at_the_edge_and_computed_as_eager():
    module = _Bucketed()
    program = _lowered_tiny(module, torch.rand(2, 5), {0: "batch"})
    x = torch.cat([torch.rand(3, 3), torch.tensor([[0.0, 0.125], [0.5, 0.875], [1.0, 0.25]])], dim=1)
    assert torch.equal(program(values=x), module(x))


def test_without_the_decomposition_patch_bucketize_still_fails():
    """Canary, and the option honoured: when this fails, ExecuTorch decomposes bucketize and the patch can go."""
    exported = _exported_tiny(_Bucketed(), torch.rand(2, 5), {0: "batch"})
    with pytest.raises(hfx.LoweringError, match=r"aten\.bucketize\.Tensor is not in Core ATen opset"):
        lower_to_pte(exported, patches=_without(patch_edge_decomposition_table))


def test_the_decomposition_patch_adds_torchs_decomposition_to_each_table():
    from executorch.exir.program import _program
    from torch._decomp import decomposition_table

    bucketize = torch.ops.aten.bucketize.Tensor
    assert bucketize not in _program._default_decomposition_table()
    with patch_edge_decomposition_table():
        table = _program._default_decomposition_table()
        assert table[bucketize] is decomposition_table[bucketize]
        assert table[torch.ops.aten.scatter_reduce.two] is dense_scatter_reduce  # no kernel: hfx's decomposition
        assert torch.ops.aten.linalg_vector_norm.default in table  # ExecuTorch's own entries are kept


def test_the_decomposition_patch_steps_aside_when_the_table_has_the_ops(monkeypatch):
    from executorch.exir.program import _program

    original = vars(_program)["_default_decomposition_table"]

    def fixed(*args, **kwargs):
        table = original(*args, **kwargs)
        from hfx.backends._decompositions import DENSE_DECOMPOSITIONS

        for op in (torch.ops.aten.bucketize.Tensor, *DENSE_DECOMPOSITIONS, torch.ops.aten.constant_pad_nd.default,
                   torch.ops.aten.convolution.default):
            table[op] = lambda *a, **k: None
        return table

    monkeypatch.setattr(_program, "_default_decomposition_table", fixed)
    with patch_edge_decomposition_table():
        assert vars(_program)["_default_decomposition_table"] is fixed


def test_a_negative_padding_crop_lowers_to_executorch_and_matches_eager():
    # RWKV's token shift, nn.ZeroPad2d((0, 0, 1, -1)): ExecuTorch's constant_pad_nd kernel refuses the -1
    class Shift(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.shift(x) * 2 + x

    model = Shift().eval()
    program = hfx.lower_to_pte(hfx.export(hfx.capture({"x": torch.randn(2, 5, 4)}, model)))
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(program(x=x), model(x))


# --- the XNNPACK partitioner -----------------------------------------------------------------------


def test_a_conv1d_with_two_dynamic_dims_lowers_and_runs_at_new_sizes():
    torch.manual_seed(0)
    module = _Conv1d()
    program = _lowered_tiny(module, torch.randn(2, 2, 20), {0: "batch", 2: "frames"}, name="input_values")
    x = torch.randn(3, 2, 33)
    assert torch.allclose(program(input_values=x), module(x), atol=FP32_ONE_BLOCK)


def test_without_the_conv1d_patch_xnnpack_still_cannot_serialise_the_reshapes():
    """Canary: when this fails, XNNPACK takes a 1-D convolution with two dynamic dims and the patch can go."""
    exported = _exported_tiny(_Conv1d(), torch.randn(2, 2, 20), {0: "batch", 2: "frames"}, name="input_values")
    with pytest.raises(hfx.LoweringError, match="XNNPACK reshape only supports 1 dynamic dimension"):
        lower_to_pte(exported, patches=_without(patch_xnnpack_conv1d_dynamic_dims))


def test_a_batch_norm_over_two_dynamic_dims_lowers_and_runs_at_new_sizes():
    torch.manual_seed(0)
    module = _BatchNorm1d().eval()
    program = _lowered_tiny(module, torch.randn(2, 4, 20), {0: "batch", 2: "frames"}, name="input_values")
    x = torch.randn(3, 4, 33)
    assert torch.allclose(program(input_values=x), module(x), atol=FP32_ONE_BLOCK)


def test_without_the_conv1d_patch_xnnpack_still_cannot_serialise_a_batch_norms_reshapes():
    """Canary: when this fails, XNNPACK decomposes a 1-D batch norm with two dynamic dims and the patch's check can go."""
    exported = _exported_tiny(_BatchNorm1d().eval(), torch.randn(2, 4, 20), {0: "batch", 2: "frames"}, name="input_values")
    with pytest.raises(hfx.LoweringError, match="XNNPACK reshape only supports 1 dynamic dimension"):
        lower_to_pte(exported, patches=_without(patch_xnnpack_conv1d_dynamic_dims))


def test_the_tanh_gelu_is_computed_as_asked():
    torch.manual_seed(0)
    module = _TanhGelu()
    program = _lowered_tiny(module, torch.randn(2, 4) * 3, {0: "batch"})
    x = torch.randn(3, 4) * 3
    hidden = module.proj(x)
    erf_gap = (torch.nn.functional.gelu(hidden) - module(x)).abs().max()
    assert erf_gap > 10 * FP32_ONE_BLOCK  # the erf GELU XNNPACK would compute is told apart at this tolerance
    assert (program(values=x) - module(x)).abs().max() < FP32_ONE_BLOCK


def test_without_the_gelu_patch_xnnpack_still_computes_the_erf_gelu():
    """Canary: when this fails, XNNPACK computes the tanh GELU (or refuses it) and the patch can go."""
    torch.manual_seed(0)
    module = _TanhGelu()
    program = lower_to_pte(_exported_tiny(module, torch.randn(2, 4) * 3, {0: "batch"}),
                           patches=_without(patch_xnnpack_tanh_gelu))
    x = torch.randn(3, 4) * 3
    torch.testing.assert_close(program(values=x), torch.nn.functional.gelu(module.proj(x)), atol=FP32_ONE_BLOCK, rtol=0)


def test_the_conv1d_check_refuses_two_dynamic_dims_only_for_1d_convolutions():
    check = fixes._conv1d_reshapes_have_one_dynamic_dim
    weight_1d, weight_2d = _node((4, 2, 3)), _node((4, 2, 3, 3))
    both = _node(("b", 2, "t"))
    assert not check(_node(("b", 4, "t"), both, weight_1d))
    assert not check(_node(("b", 4, 9), both, weight_1d))  # the input's unsqueeze has two
    assert check(_node(("b", 4, 9), _node(("b", 2, 20)), weight_1d))
    assert check(_node(("b", 4, "h", "w"), _node(("b", 2, "h", "w")), weight_2d))


def test_the_batch_norm_check_refuses_two_dynamic_dims_only_for_3d_inputs():
    check = fixes._batch_norm1d_reshapes_have_one_dynamic_dim
    assert not check(_node(("b", 4, "t"), _node(("b", 4, "t"))))
    assert check(_node(("b", 4, 9), _node(("b", 4, 9))))
    assert check(_node(("b", 4, "h", "w"), _node(("b", 4, "h", "w"))))


def test_a_max_over_another_dim_lowers_and_matches_eager():
    module = _UnitMax()
    program = _lowered_tiny(module, torch.randn(2, 4, 3, 8), {0: "batch"})
    x = torch.randn(3, 4, 3, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(program(values=x), module(x), rtol=0, atol=0)


def test_without_the_max_patch_xnnpack_still_cannot_serialise_it():
    """Canary: when this fails, XNNPACK takes (or its partitioner refuses) such a max and the patch can go."""
    exported = _exported_tiny(_UnitMax(), torch.randn(2, 4, 3, 8), {0: "batch"})
    with pytest.raises(hfx.LoweringError, match="amax.default only supports"):
        lower_to_pte(exported, patches=_without(patch_xnnpack_max_dim))


def test_the_max_check_accepts_a_kept_max_over_dim_2_or_3_only():
    check = fixes._is_spatial_max_kept
    x = _node((2, 4, 3, 8))
    assert check(_node((2, 4, 1, 8), x, 2, True)) and check(_node((2, 4, 3, 1), x, -1, True))
    assert not check(_node((2, 3, 8), x, 1)) and not check(_node((2, 4, 8), x, 2, False))


def test_the_gelu_check_accepts_the_erf_gelu_only():
    x = _node((2, 3))
    assert fixes._is_exact_gelu(_node((2, 3), x))
    assert fixes._is_exact_gelu(_node((2, 3), x, approximate="none"))
    assert not fixes._is_exact_gelu(_node((2, 3), x, approximate="tanh"))


def test_a_partitioner_refusal_stays_a_refusal():
    refuse = fixes._refusing(lambda self, node, ep: False, lambda node: True)
    accept = fixes._refusing(lambda self, node, ep: True, lambda node: True)
    assert (refuse(None, _node((2,)), None), accept(None, _node((2,)), None)) == (False, True)


# --- torch's SDPA decomposition --------------------------------------------------------------------


def _queries() -> dict[str, torch.Tensor]:
    """Queries laid out as Hugging Face attention, ``nn.MultiheadAttention`` and a contiguous tensor lay them out."""
    fused = torch.randn(2, 7, 3 * _HIDDEN)
    return {
        "hugging_face": fused[..., :_HIDDEN].reshape(2, 7, _HEADS, -1).transpose(1, 2),
        "multihead_attention": torch.randn(7, 2 * _HEADS, 8).transpose(0, 1).reshape(2, _HEADS, 7, 8),
        "contiguous": torch.randn(2, _HEADS, 7, 8),
    }


@pytest.mark.parametrize("layout", ["hugging_face", "multihead_attention", "contiguous"])
def test_the_decomposition_lays_out_its_output_as_the_kernel_does(layout):
    query = _queries()[layout]
    want = _FLASH_FOR_CPU(query, query, query)[0]
    got = flash_attention_for_cpu_like_query(query, query, query)[0]
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, atol=FP32_SAME_KERNELS, rtol=FP32_ONE_BLOCK)


def test_laid_out_like_keeps_the_values():
    tensor, like = torch.randn(2, 4, 7, 8), torch.empty(2, 7, 4, 8).transpose(1, 2)
    out = laid_out_like(tensor, like)
    assert out.stride() == like.stride()
    assert torch.equal(out, tensor)


def test_edge_decomposition_keeps_the_traced_layout(attention):
    _, exported = attention
    with patch_sdpa_decomposition_layout():
        decomposed = _edge_decomposed(exported.program)
    targets = {node.target for node in decomposed.graph.nodes}
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in targets


def test_a_conv1d_attention_lowers_and_matches_eager_on_new_shapes(attention):
    model, exported = attention
    torch.manual_seed(1)
    report = verify(model, _attention_inputs(**NEW_SHAPE), lower_to_pte(exported))
    assert report.max_abs <= FP32_ONE_BLOCK, str(report)


def test_decomposing_leaves_the_program_and_the_table_unchanged(attention):
    from torch._decomp import decomposition_table

    _, exported = attention
    graph, original = str(exported.program.graph), decomposition_table[_FLASH_FOR_CPU]
    with patch_sdpa_decomposition_layout():
        _edge_decomposed(exported.program)
    assert str(exported.program.graph) == graph
    assert decomposition_table[_FLASH_FOR_CPU] is original


def test_the_sdpa_patch_steps_aside_when_torchs_decomposition_keeps_the_layout(monkeypatch):
    from torch._decomp import decomposition_table

    def fixed(*args, **kwargs):
        return flash_attention_for_cpu_like_query(*args, **kwargs)

    assert not fixes._keeps_the_query_layout(decomposition_table[_FLASH_FOR_CPU])
    monkeypatch.setitem(decomposition_table, _FLASH_FOR_CPU, fixed)
    with patch_sdpa_decomposition_layout():
        assert decomposition_table[_FLASH_FOR_CPU] is fixed


def test_without_the_patch_the_edge_decomposition_still_cannot_view(attention):
    """Canary: when this fails, torch's decomposition keeps the kernel's layout and the patch can go."""
    _, exported = attention
    with pytest.raises(ValueError, match="Cannot view a tensor with shape"):
        _edge_decomposed(exported.program)


# --- memory planning -------------------------------------------------------------------------------


def test_memory_is_planned_at_the_exact_upper_bound_of_correlated_sizes():
    module = _Windowed()
    program = _lowered_tiny(module, torch.randn(2, 10), {0: "batch", 1: "length"})
    # batch 4 x 32 windows x 2 x 2 floats per tensor; interval arithmetic planned 2 x 64 instead of 2 (>= 2 MiB)
    assert program.planned_bytes < 64 * 1024
    for length in (7, 64):
        x = torch.randn(4, length)
        assert torch.allclose(program(values=x), module(x), atol=FP32_ONE_BLOCK)


def test_without_the_exact_bounds_patch_correlated_sizes_are_still_planned_too_large():
    """Canary: when this fails, ExecuTorch bounds ``P // (P // 2)`` tightly and the patch can go."""
    exported = _exported_tiny(_Windowed(), torch.randn(2, 10), {0: "batch", 1: "length"})
    program = lower_to_pte(exported, patches=_without(patch_exact_upper_bounds))
    assert program.planned_bytes >= 2 * 1024 * 1024


def _grid_positions_exported() -> hfx.Exported:
    inputs = {"pixel_values": torch.randn(20, 4), "grid_thw": torch.tensor([[1, 4, 4], [1, 2, 2]])}
    shapes = hfx.DynamicShapes(axes={"pixel_values": {0: "patches"}}, bounds={"patches": (1, 64)})
    return hfx.export(hfx.capture(inputs, _GridPositions(), dynamic_shapes=shapes))


def test_sizes_read_from_the_image_grids_are_planned_by_the_patches_they_sum_to():
    program = lower_to_pte(_grid_positions_exported())
    # each h x w <= 64 patches: 4 x 64 floats per resized table; each of h, w alone <= 64 would plan 4 x 64 x 64
    assert program.planned_bytes < 256 * 1024
    for grid in ([[2, 3, 3], [1, 2, 5]], [[1, 8, 7], [1, 1, 1]]):
        grid_thw = torch.tensor(grid)
        pixel_values = torch.randn(int(grid_thw.prod(-1).sum()), 4, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(program(pixel_values=pixel_values, grid_thw=grid_thw),
                                   _GridPositions()(pixel_values, grid_thw), atol=FP32_ONE_BLOCK, rtol=0)


def test_without_the_unbacked_bounds_patch_executorch_still_finds_no_bound_for_the_grid_sizes():
    """Canary: when this fails, ExecuTorch bounds unbacked sizes by the runtime asserts and the patch can go."""
    with pytest.raises(hfx.LoweringError, match="Cannot evaluate a finite upper bound"):
        lower_to_pte(_grid_positions_exported(), patches=_without(patch_unbacked_upper_bounds))


def test_unbacked_bounds_follow_the_asserts_products_and_least_values():
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    s, t, h, w = sympy.symbols("s99 u0 u1 u2", integer=True)
    zero_or_more = ValueRanges(0, int_oo)

    class Assert:
        def __init__(self, expr):
            self.expr = expr

    class ShapeEnv:
        var_to_range = {s: ValueRanges(1, 64), t: zero_or_more, h: zero_or_more, w: zero_or_more}
        deferred_runtime_asserts = {t: [Assert(sympy.Eq(s, t * h * w + 3)), Assert(sympy.Ne(w, 0))]}

    bounds = UnbackedBounds(ShapeEnv())
    assert bounds.upper(t * h * w) == 61 and bounds.upper(h) == 61  # t, w taken as >= 1
    assert bounds.upper(h * w) == 61 and bounds.upper(4 * sympy.Max(1, h) * sympy.Max(1, w)) == 4 * 61
    assert bounds.upper(sympy.Symbol("u9", integer=True)) is None  # in no assert: ExecuTorch's own error stays


def test_the_exact_upper_bound_skips_zero_divisors_and_gives_up_on_unknown_functions():
    import sympy
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.value_ranges import ValueRanges

    p = sympy.Symbol("p", integer=True, positive=True)
    assert exact_upper_bound(FloorDiv(12, FloorDiv(p, 4)), {p: ValueRanges(1, 16)}) == 12  # p < 4 divides by 0
    assert exact_upper_bound(3 * p + 1, {p: ValueRanges(1, 16)}) == 49
    assert exact_upper_bound(sympy.sin(p), {p: ValueRanges(1, 16)}) is None
    assert exact_upper_bound(p, {p: ValueRanges(1, sympy.oo)}) is None


# --- the patch contract ----------------------------------------------------------------------------

# (patch, module, class in it or None, attribute name) of each attribute a patch of PTE_PATCHES wraps.




# --- tensor specs ----------------------------------------------------------------------------------


def _stacked_rows_exported() -> hfx.Exported:
    inputs = {"values": torch.randn(4, 8), "keep": torch.tensor([1, 0, 1, 1])}
    return hfx.export(hfx.capture(inputs, _StackedRows()))


def test_a_stride_of_a_data_dependent_size_lowers_and_matches_eager():
    program = lower_to_pte(_stacked_rows_exported())
    values, keep = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 1])
    torch.testing.assert_close(program(values=values, keep=keep), _StackedRows()(values, keep), rtol=0, atol=0)


def test_without_the_dim_order_patch_executorch_still_guards_on_the_size():
    """Canary: when this fails, ExecuTorch orders strides of data-dependent sizes and the patch can go."""
    with pytest.raises(hfx.LoweringError, match="Could not guard on data-dependent expression"):
        lower_to_pte(_stacked_rows_exported(), patches=_without(patch_dim_order_of_data_dependent_strides))


class _PositionGrid(torch.nn.Module):
    """PVT's position embeddings in small: a static parameter reshaped by the image's patch grid, then resized."""

    def __init__(self) -> None:
        super().__init__()
        self.position_embeddings = torch.nn.Parameter(torch.randn(1, 16, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        height, width = pixel_values.shape[2] // 4, pixel_values.shape[3] // 4
        grid = self.position_embeddings.reshape(1, height, width, -1).permute(0, 3, 1, 2)
        return pixel_values[:, :4, ::4, ::4] + torch.nn.functional.interpolate(grid, size=(height, width),
                                                                               mode="bilinear")


def _position_grid_exported() -> hfx.Exported:
    return hfx.export(hfx.capture({"pixel_values": torch.randn(2, 4, 16, 16)}, _PositionGrid()))


def test_a_symbolic_view_of_a_static_parameter_lowers_and_matches_eager():
    program = lower_to_pte(_position_grid_exported())
    x = torch.randn(3, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(program(pixel_values=x), _PositionGrid()(x))


def test_without_the_view_copy_patch_executorch_still_refuses_the_view():
    """Canary: when this fails, ExecuTorch plans such a view itself and the patch can go."""
    with pytest.raises(hfx.LoweringError, match="_ViewSpec is incompatible with its base"):
        lower_to_pte(_position_grid_exported(), patches=_without(patch_view_copies_of_static_bases_kept))


def test_the_stable_dim_order_sorts_known_strides_and_keeps_unknown_pairs():
    u0 = torch.fx.experimental.symbolic_shapes.ShapeEnv().create_unbacked_symint()
    assert stable_dim_order((1, 12, 4)) == (1, 2, 0)
    assert stable_dim_order((8 * u0, 8, 1)) == (0, 1, 2)
    assert stable_dim_order((8, 8 * u0, 1)) == (0, 1, 2)  # unknown either way: kept as given


# --- empty tensors of a dynamic size ----------------------------------------------------------------


class _FilledBuffer(torch.nn.Module):
    """A buffer made with ``torch.empty(batch, ...)`` and filled (RF-DETR's two-stage proposals)."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty(values.shape[0], 3, dtype=values.dtype)
        buffer[:] = values[:, :3] * 2
        return buffer + 1


def test_an_empty_buffer_of_the_batch_lowers_and_runs_at_another_batch():
    program = _lowered_tiny(_FilledBuffer(), torch.randn(2, 5), {0: "batch"})
    values = torch.randn(3, 5)
    torch.testing.assert_close(program(values=values), _FilledBuffer()(values))


def test_without_the_empty_patch_executorch_still_plans_the_traced_batch():
    """Canary: when this fails, ExecuTorch's ``_empty_dim_order`` keeps a symbolic size and the patch can go."""
    program = lower_to_pte(_exported_tiny(_FilledBuffer(), torch.randn(2, 5), {0: "batch"}),
                           patches=_without(patch_symbolic_empties_as_zeros))
    with pytest.raises(hfx.LoweringError, match="set_inputs"):
        program(values=torch.randn(3, 5))


# --- PReLU -----------------------------------------------------------------------------------------


class _TokenPrelu(torch.nn.Module):
    """``nn.PReLU`` over ``[batch, tokens, channels]`` (DAB-DETR's encoder activation)."""

    def __init__(self):
        super().__init__()
        self.linear, self.activation = torch.nn.Linear(6, 6), torch.nn.PReLU()

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(values))


def test_a_prelu_over_tokens_lowers_and_matches_eager():
    torch.manual_seed(0)
    module = _TokenPrelu().eval()
    program = _lowered_tiny(module, torch.randn(2, 7, 6), {0: "batch", 1: "sequence"})
    values = torch.randn(3, 11, 6)
    torch.testing.assert_close(program(values=values), module(values))


def test_without_the_prelu_patch_xnnpack_still_takes_a_prelu_it_cannot_lay_out():
    """Canary: when this fails, XNNPACK's partitioner checks PReLU's rank and the patch can go."""
    exported = _exported_tiny(_TokenPrelu().eval(), torch.randn(2, 7, 6), {0: "batch", 1: "sequence"})
    with pytest.raises(hfx.LoweringError, match="non-NHWC compatible"):
        lower_to_pte(exported, patches=_without(patch_xnnpack_prelu_4d))


# --- empty_cats_as_zeros ------------------------------------------------------------------------------


def test_an_empty_cat_lowers_and_keeps_growing():
    # Mistral Large 4's latent-attention values, [batch, 1, past, 0], appended to along the past
    program = lower_to_pte(empty_values_export())
    step = empty_values_step(3, 13)
    got = program(**step)
    assert got["values"].shape == (3, 1, 14, 0) and torch.equal(got["keys"], EmptyValues()(**step)["keys"])


def test_without_empty_cats_as_zeros_executorch_still_cannot_emit_an_empty_cat(monkeypatch):
    """Canary: when this fails, ExecuTorch's PruneEmptyTensorsPass writes its sizes as nodes and the fix's use in
    lower_to_pte can go."""
    from hfx.backends import _executorch

    monkeypatch.setattr(_executorch, "empty_cats_as_zeros", lambda graph: 0)
    with pytest.raises(hfx.LoweringError, match="Unsupported type encountered in int list"):
        lower_to_pte(empty_values_export())
# --- partitions that feed each other ---------------------------------------------------------------


class _SharedProjection(torch.nn.Module):
    """PegasusX in small: one projection over two streams, a layer norm (XNNPACK refuses it) between two uses."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.proj(values * 2), self.proj(torch.nn.functional.layer_norm(self.proj(values), (4,)))


def test_a_projection_shared_across_a_refused_op_lowers_and_matches_eager():
    torch.manual_seed(0)
    module = _SharedProjection().eval()
    program = _lowered_tiny(module, torch.randn(2, 4), {0: "batch"})
    values = torch.randn(3, 4)
    torch.testing.assert_close(program(values=values), module(values))


def test_without_the_acyclic_patch_xnnpack_still_proposes_partitions_that_feed_each_other():
    """Canary: when this fails, XNNPACK's partitioner keeps its partitions acyclic and the patch can go."""
    exported = _exported_tiny(_SharedProjection().eval(), torch.randn(2, 4), {0: "batch"})
    with pytest.raises(hfx.LoweringError, match="found dependency cycles"):
        lower_to_pte(exported, patches=_without(patch_xnnpack_acyclic_partitions))


def _two_streams() -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    """``a -> c`` and ``b -> neg -> d``, with ``d`` also adding the constant ``w``."""
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    a, b = (graph.call_function(torch.relu, (x,), name=name) for name in "ab")
    c = graph.call_function(torch.relu, (a,), name="c")
    d = graph.call_function(torch.add, (graph.call_function(torch.neg, (b,)), w), name="d")
    graph.output((c, d))
    return graph, {"w": w, "a": a, "b": b, "c": c, "d": d}


def _names(partitions) -> list[list[str]]:
    return sorted(sorted(node.name for node in partition.nodes) for partition in partitions)


def test_a_partition_fed_back_is_split_and_its_constant_goes_with_its_user():
    from torch.fx.passes.infra.partitioner import Partition

    graph, n = _two_streams()
    feeding = [Partition(0, [n["w"], n["a"], n["d"]]), Partition(1, [n["b"], n["c"]])]
    split = acyclic_partitions(feeding, graph, shared=lambda node: node is n["w"])
    assert _names(split) == [["a"], ["b", "c"], ["d", "w"]]


def test_acyclic_partitions_come_back_as_they_were():
    from torch.fx.passes.infra.partitioner import Partition

    graph, n = _two_streams()
    partitions = [Partition(0, [n["a"], n["b"]]), Partition(1, [n["c"], n["d"], n["w"]])]
    assert acyclic_partitions(partitions, graph) == partitions


# --- patch_xnnpack_reshape_one_valued_sizes -------------------------------------------------------------------


def _keys_and_grid() -> tuple[torch.Tensor, torch.Tensor]:
    """Fake ``[batch, tokens, 32]`` tensors over images of 19-34 px: CvT's key tokens ``((h - 3) // 32) + 2`` (2 for
    every such height) and a grid ``((h - 3) // 8) + 1`` (3 or 4)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    images = mode.from_tensor(torch.empty(2, 3, 32), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.DYNAMIC]))
    batch, _, height = images.shape
    torch._check(height >= 19)
    torch._check(height <= 34)
    with mode:
        return torch.empty(batch, (height - 3) // 32 + 2, 32), torch.empty(batch, (height - 3) // 8 + 1, 32)


def test_a_size_its_bounds_leave_one_value_is_that_number_and_others_stay_symbolic():
    keys, grid = _keys_and_grid()
    assert isinstance(keys.shape[1], torch.SymInt)  # what XNNPACK's serialiser counts as a second dynamic dim
    narrowed = fixes.with_one_valued_sizes(keys)
    assert narrowed.shape[1:] == (2, 32) and isinstance(narrowed.shape[0], torch.SymInt)
    assert narrowed.dtype == keys.dtype and narrowed.fake_mode is keys.fake_mode
    assert fixes.with_one_valued_sizes(grid) is grid  # no size to narrow: the value itself
