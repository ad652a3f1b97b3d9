"""``OV_GRAPH_FIXES``: what each FX graph rewrite does, and the canaries that fail once OpenVINO converts the pattern.

Each tiny module below has the pattern one fix handles. The canaries lower it
without that fix (``lower_to_ov(graph_fixes=...)``) and expect OpenVINO's own failure.
"""

from __future__ import annotations

import math
import operator

import pytest
import torch

import hfx

pytest.importorskip("openvino")

from hfx.backends import OV_GRAPH_FIXES  # noqa: E402
from hfx.backends._openvino import lower_to_ov  # noqa: E402
from hfx.backends._openvino_fixes import (  # noqa: E402
    drop_empty_cat_operands,
    empty_cats_as_zeros,
    index_add_with_alpha,
    linspaces_of_float_sizes_as_ranges,
    masked_row_fills_as_where,
    min_max_by_floordiv,
    whole_ceilings_as_products,
    mod_by_floordiv,
    power_by_products,
    negate_by_multiplying,
    separate_outputs,
    splits_of_a_cat_as_its_operands,
    static_view_sizes,
)
from tests.helpers import EmptyValues, empty_values_export, empty_values_step  # noqa: E402


def _without(fix) -> tuple:
    return tuple(f for f in OV_GRAPH_FIXES if f is not fix)


def _exported(module: torch.nn.Module, **inputs: torch.Tensor) -> hfx.Exported:
    return hfx.export(hfx.capture(inputs, module))


# --- repeated and passed-through outputs -----------------------------------------------------------


class _Repeats(torch.nn.Module):
    def forward(self, x, mask):
        doubled = x * 2
        return {"doubled": doubled, "again": doubled, "x": x, "mask": mask}


def test_repeated_and_passed_through_outputs_get_their_own_ports():
    inputs = {"x": torch.randn(2, 3), "mask": torch.tensor([[True, False, True]] * 2)}
    program = lower_to_ov(hfx.capture(inputs, _Repeats()))
    assert [p.get_names() for p in program.model.inputs] == [{"x"}, {"mask"}]
    assert [p.get_names() for p in program.model.outputs] == [{n} for n in program.io.output_names]
    new = {"x": torch.randn(4, 3), "mask": torch.tensor([[False, True, True]] * 4)}
    got = program(**new)
    assert torch.equal(got["doubled"], new["x"] * 2) and torch.equal(got["again"], new["x"] * 2)
    assert torch.equal(got["x"], new["x"]) and torch.equal(got["mask"], new["mask"])


def test_without_separate_outputs_a_repeated_output_still_fails():
    """Canary, and the option honoured: when this fails, OpenVINO names repeated outputs and the fix can go."""
    exported = _exported(_Repeats(), x=torch.randn(2, 3), mask=torch.tensor([[True, False, True]] * 2))
    with pytest.raises(hfx.LoweringError, match="Tensor name is not a number"):
        lower_to_ov(exported, graph_fixes=_without(separate_outputs))


# --- % on sizes --------------------------------------------------------------------------------------


class _PadToWindow(torch.nn.Module):
    """Pads the last axis to a multiple of 4, as Swin pads to its window: ``operator.mod`` on a dynamic size."""

    def forward(self, x):
        return torch.nn.functional.pad(x, (0, (4 - x.shape[-1] % 4) % 4)) * 2


@pytest.fixture(scope="module")
def padded():
    shapes = hfx.DynamicShapes(axes={"x": {1: "width"}}, bounds={"width": (2, 64)})
    return hfx.export(hfx.capture({"x": torch.randn(2, 5)}, _PadToWindow(), dynamic_shapes=shapes))


def test_size_arithmetic_with_mod_converts(padded):
    assert any(node.target is operator.mod for node in padded.program.graph.nodes)
    program = lower_to_ov(padded)
    for width in (5, 8, 11):
        x = torch.randn(2, width)
        assert torch.equal(program(x=x), _PadToWindow()(x))


def test_without_mod_by_floordiv_size_arithmetic_still_fails(padded):
    """Canary, and the option honoured: when this fails, OpenVINO converts ``operator.mod`` and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="No conversion rule found for operations: <built-in function mod>"):
        lower_to_ov(padded, graph_fixes=_without(mod_by_floordiv))


class _Clamped(torch.nn.Module):
    """The first 6 columns and the last 6, as HunYuan-V4 clamps a size to its window: ``torch.sym_min`` and
    ``torch.sym_max`` on a dynamic size."""

    def forward(self, x):
        return x[:, :torch.sym_min(x.shape[1], 6)] * 2, x[:, torch.sym_max(x.shape[1] - 6, 0):] + 1


@pytest.fixture(scope="module")
def clamped():
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "width"}}, bounds={"batch": (1, 8), "width": (2, 64)})
    return hfx.export(hfx.capture({"x": torch.randn(2, 5)}, _Clamped(), dynamic_shapes=shapes))


def test_a_size_clamped_with_sym_min_and_sym_max_converts(clamped):
    kinds = {torch.sym_min, torch.sym_max}
    assert kinds <= {node.target for node in clamped.program.graph.nodes}
    program = lower_to_ov(clamped)
    for width in (3, 6, 7, 11, 64):  # below, at and above the clamp
        x = torch.randn(3, width)
        for got, want in zip(program(x=x), _Clamped()(x)):
            assert torch.equal(got, want)


def test_without_min_max_by_floordiv_a_clamped_size_still_fails(clamped):
    """Canary, and the option honoured: when this fails, OpenVINO converts ``sym_min``/``sym_max`` and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="No conversion rule found for operations: <function sym_m"):
        lower_to_ov(clamped, graph_fixes=_without(min_max_by_floordiv))


class _Capacity(torch.nn.Module):
    """NLLB-MoE's expert capacity: ``math.ceil(fraction * tokens)`` on sizes, then a comparison with it."""

    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = fraction

    def forward(self, x):
        capacity = math.ceil(self.fraction * (x.shape[0] * x.shape[1]))
        return torch.lt(x.cumsum(1), capacity).to(x.dtype)


def _capacity(fraction: float) -> hfx.Exported:
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "width"}}, bounds={"batch": (1, 8), "width": (2, 64)})
    return hfx.export(hfx.capture({"x": torch.ones(2, 5)}, _Capacity(fraction), dynamic_shapes=shapes))


def test_the_ceiling_of_a_whole_multiple_of_a_size_converts():
    exported = _capacity(2.0)
    assert {math.ceil, torch.sym_float} <= {node.target for node in exported.program.graph.nodes}
    program = lower_to_ov(exported)
    for batch, width in ((1, 3), (3, 7), (4, 11)):
        x = torch.ones(batch, width) * 3
        assert torch.equal(program(x=x), _Capacity(2.0)(x))


def test_without_whole_ceilings_as_products_the_ceiling_still_fails():
    """Canary: when this fails, OpenVINO converts ``ceil`` and ``sym_float`` on sizes and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="No conversion rule found for operations: <built-in function ceil>"):
        lower_to_ov(_capacity(2.0), graph_fixes=_without(whole_ceilings_as_products))


def test_a_fractional_ceiling_is_left_as_it_is():
    graph = _capacity(0.25).program.graph
    whole_ceilings_as_products(graph)
    assert math.ceil in {node.target for node in graph.nodes}


class _ScatterBack(torch.nn.Module):
    """Rows added back to their places, as JetMoE's experts return their outputs: ``index_add`` without ``alpha``."""

    def forward(self, x, index):
        return torch.zeros(4, x.shape[1]).index_add(0, index, x * 2)


@pytest.fixture(scope="module")
def scattered():
    shapes = hfx.DynamicShapes(axes={"x": {0: "rows"}, "index": {0: "rows"}}, bounds={"rows": (1, 16)})
    inputs = {"x": torch.randn(5, 3), "index": torch.tensor([0, 3, 3, 1, 0])}
    return hfx.export(hfx.capture(inputs, _ScatterBack(), dynamic_shapes=shapes))


def test_index_add_without_alpha_converts(scattered):
    program = lower_to_ov(scattered)
    for rows in (2, 9):
        x, index = torch.randn(rows, 3), torch.randint(0, 4, (rows,))
        torch.testing.assert_close(program(x=x, index=index), _ScatterBack()(x, index), rtol=1e-6, atol=1e-6)


def test_without_index_add_with_alpha_index_add_still_fails(scattered):
    """Canary, and the option honoured: when this converts, OpenVINO reads index_add's default alpha."""
    with pytest.raises(hfx.LoweringError, match="Conversion is failed for: aten.index_add.default"):
        lower_to_ov(scattered, graph_fixes=_without(index_add_with_alpha))


class _SquareView(torch.nn.Module):
    """Funnel's relative shift: a ``[batch, s, s]`` tensor flattened to ``[batch, s * s]`` and viewed by that size,
    which torch's decomposition writes as ``s ** 2``."""

    def forward(self, x):
        flat = (x[:, :, None] * x[:, None, :]).reshape(x.shape[0], -1)
        return flat.reshape(x.shape[0], 1, flat.shape[1]) + 1


@pytest.fixture(scope="module")
def squared():
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "width"}}, bounds={"batch": (1, 8), "width": (2, 64)})
    return hfx.export(hfx.capture({"x": torch.randn(2, 5)}, _SquareView(), dynamic_shapes=shapes))


def test_a_size_squared_converts(squared):
    program = lower_to_ov(squared)
    for batch, width in ((1, 3), (3, 11)):
        x = torch.randn(batch, width)
        assert torch.equal(program(x=x), _SquareView()(x))


def test_without_power_by_products_a_size_squared_still_fails(squared):
    """Canary, and the option honoured: when this fails, OpenVINO converts ``operator.pow`` and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="No conversion rule found for operations: <built-in function pow>"):
        lower_to_ov(squared, graph_fixes=_without(power_by_products))


def test_only_small_integer_powers_are_written_out():
    graph = torch.fx.Graph()
    size = graph.placeholder("size")
    powers = [graph.call_function(operator.pow, (size, k)) for k in (1, 3, 9, 0.5)]
    graph.output(tuple(powers))
    power_by_products(graph)
    left = [n for n in graph.nodes if n.target is operator.pow]
    assert [n.args[1] for n in left] == [9, 0.5]
    assert sum(n.target is operator.mul for n in graph.nodes) == 2  # size ** 3 as size * size * size
    assert torch.fx.GraphModule(torch.nn.Module(), graph)(5)[:2] == (5, 125)


# --- static view sizes -----------------------------------------------------------------------------


class _AlibiReshape(torch.nn.Module):
    """Falcon's decode pattern: a [batch * heads, 1, keys] bias viewed back as (batch, -1, 1, keys)."""

    heads = 4

    def forward(self, x, mask):
        bias = (x.repeat_interleave(self.heads, 0)[:, None, :] * mask[:, None, :].repeat_interleave(self.heads, 0))
        return bias.reshape(x.shape[0], -1, 1, x.shape[-1]) + mask[:, None, None, :]


def test_a_view_whose_inferred_size_is_static_keeps_it():
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "keys"}, "mask": {0: "batch", 1: "keys"}},
                               bounds={"batch": (1, 8), "keys": (2, 64)})
    exported = hfx.export(hfx.capture({"x": torch.randn(2, 5), "mask": torch.ones(2, 5)}, _AlibiReshape(),
                                      dynamic_shapes=shapes))
    module = exported.program.module()
    static_view_sizes(module.graph)
    targets = [n.args[1] for n in module.graph.nodes if n.target in (torch.ops.aten.view.default,
                                                                     torch.ops.aten.reshape.default)]
    assert targets and all(-1 not in list(t) for t in targets)
    program = lower_to_ov(exported)
    for batch, keys in ((3, 6), (1, 2)):
        x, mask = torch.randn(batch, keys), torch.rand(batch, keys)
        torch.testing.assert_close(program(x=x, mask=mask), _AlibiReshape()(x, mask))


# --- empty cat operands ----------------------------------------------------------------------------


class _EmptyCat(torch.nn.Module):
    """A ``DynamicLayer``'s first update: its empty ``f32[0]`` keys concatenated with the new ones."""

    def forward(self, x):
        return torch.cat([torch.tensor([]), x], dim=-2) * 2


@pytest.fixture(scope="module")
def empty_cat():
    return _exported(_EmptyCat(), x=torch.randn(2, 3, 4))


def test_an_empty_cat_operand_is_dropped_and_the_cat_converts(empty_cat):
    module = empty_cat.program.module()
    drop_empty_cat_operands(module.graph)
    cats = [n for n in module.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert [len(n.args[0]) for n in cats] == [1]
    x = torch.randn(3, 3, 4)
    assert torch.equal(lower_to_ov(empty_cat)(x=x), _EmptyCat()(x))


def test_without_the_fix_an_empty_cat_operand_still_fails(empty_cat):
    """Canary, and the option honoured: when this fails, OpenVINO converts such a cat and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="Conversion is failed for: SequenceMark, aten.cat.default"):
        lower_to_ov(empty_cat, graph_fixes=_without(drop_empty_cat_operands))


# --- neg -------------------------------------------------------------------------------------------


class _RotateHalf(torch.nn.Module):
    """Llama's ``rotate_half``: the RoPE pattern whose ``neg`` OpenVINO marks as a dequantization."""

    def forward(self, x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_neg_becomes_a_product_with_the_same_values():
    exported = _exported(_RotateHalf(), x=torch.randn(2, 3, 4))
    module = exported.program.module()
    negate_by_multiplying(module.graph)
    module.recompile()
    targets = [n.target for n in module.graph.nodes]
    assert torch.ops.aten.neg.default not in targets and torch.ops.aten.mul.Tensor in targets
    x = torch.randn(2, 3, 4)
    assert torch.equal(module(x=x), _RotateHalf()(x))
    assert torch.equal(lower_to_ov(exported)(x=x), _RotateHalf()(x))



# --- a value written at a boolean mask's rows ------------------------------------------------------------


class _MarkedRows(torch.nn.Module):
    """T5Gemma 2's end-of-image embedding: one ``[hidden]`` vector written at the rows whose token matches."""

    def __init__(self) -> None:
        super().__init__()
        self.marker = torch.nn.Parameter(torch.arange(4.0))

    def forward(self, embeddings, input_ids):
        embeddings = embeddings * 2
        embeddings[input_ids == 3] = self.marker
        return embeddings


def _marked_rows() -> hfx.Exported:
    return _exported(_MarkedRows(), embeddings=torch.randn(2, 5, 4), input_ids=torch.tensor([[1, 3, 2, 3, 0], [3, 1, 1, 2, 2]]))


def test_a_vector_written_at_a_masks_rows_converts_and_matches_eager_at_another_batch():
    program = lower_to_ov(_marked_rows())
    embeddings, ids = torch.randn(3, 5, 4), torch.tensor([[3, 3, 1, 0, 3], [1, 1, 1, 1, 1], [3, 0, 0, 0, 3]])
    torch.testing.assert_close(program(embeddings=embeddings, input_ids=ids), _MarkedRows()(embeddings, ids), rtol=0, atol=0)


def test_without_masked_row_fills_as_where_the_write_still_fails():
    """Canary: when this fails, OpenVINO broadcasts the written value itself and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="Rank of updates must be rank of inputs"):
        lower_to_ov(_marked_rows(), graph_fixes=_without(masked_row_fills_as_where))


def test_a_write_of_rows_of_their_own_or_an_accumulation_is_left_as_it_is():
    class _Rows(torch.nn.Module):
        def forward(self, embeddings, input_ids):
            embeddings = embeddings * 2
            picked = input_ids == 3
            embeddings[picked] = embeddings[picked] + 1  # a row each: the frontend's own case
            return embeddings.index_put((input_ids == 1,), torch.ones(4), accumulate=True)

    graph = _exported(_Rows(), embeddings=torch.randn(2, 5, 4), input_ids=torch.tensor([[1, 3, 2, 3, 0], [3, 1, 1, 2, 2]])
                      ).program.graph
    before = [n.target for n in graph.nodes]
    masked_row_fills_as_where(graph)
    assert [n.target for n in graph.nodes] == before



# --- reference points on float sizes ----------------------------------------------------------------------


class _ReferencePoints(torch.nn.Module):
    """Deformable DETR's reference points: ``linspace(0.5, size - 0.5, steps)`` on a dynamic size."""

    def forward(self, x):
        points = torch.linspace(0.5, x.shape[1] - 0.5, 4, dtype=torch.float32) / x.shape[1]
        return x[:, :1] * points


def _reference_points() -> hfx.Exported:
    shapes = hfx.DynamicShapes(axes={"x": {0: "batch", 1: "width"}}, bounds={"batch": (1, 8), "width": (2, 64)})
    return hfx.export(hfx.capture({"x": torch.ones(2, 5)}, _ReferencePoints(), dynamic_shapes=shapes))


def test_a_linspace_to_a_float_size_converts_and_matches_eager():
    exported = _reference_points()
    assert torch.sym_float in {node.target for node in exported.program.graph.nodes}
    program = lower_to_ov(exported)
    for width in (2, 5, 13):
        x = torch.randn(3, width)
        torch.testing.assert_close(program(x=x), _ReferencePoints()(x), rtol=1e-6, atol=1e-7)


def test_without_linspaces_of_float_sizes_as_ranges_the_linspace_still_fails():
    """Canary: when this fails, OpenVINO converts ``sym_float`` and the fix can go."""
    with pytest.raises(hfx.LoweringError, match="No conversion rule found for operations: <function sym_float"):
        lower_to_ov(_reference_points(), graph_fixes=_without(linspaces_of_float_sizes_as_ranges))


# --- a split that undoes a cat -----------------------------------------------------------------------------


class _PackedThenSplit(torch.nn.Module):
    """GLM-5-Next's indexer: keys, gate scores and a valid mask packed with ``cat``, unpacked with ``split``;
    and a split at other boundaries, which stays."""

    def forward(self, keys, scores, valid):
        packed = torch.cat([keys, scores, valid[..., None].to(keys.dtype)], dim=-1)
        k, g, v = torch.split(packed, [4, 4, 1], dim=-1)
        first, rest = torch.split(packed, [2, 7], dim=-1)
        return {"out": k * g + v, "first": first * 2, "rest": rest.sum(-1)}


def test_a_split_that_undoes_a_cat_reads_the_operands_and_keeps_the_values():
    inputs = {"keys": torch.randn(2, 5, 4), "scores": torch.randn(2, 5, 4), "valid": torch.ones(2, 5, dtype=torch.bool)}
    exported = _exported(_PackedThenSplit(), **inputs)
    module = exported.program.module()
    splits = [n for n in module.graph.nodes if n.target is torch.ops.aten.split_with_sizes.default]
    assert len(splits) == 2
    splits_of_a_cat_as_its_operands(module.graph)
    module.recompile()
    kept = [n.args[1] for n in module.graph.nodes if n.target is torch.ops.aten.split_with_sizes.default]
    assert kept == [[2, 7]]  # the split at the cat's own boundaries is gone, the other stays
    other = {"keys": torch.randn(2, 5, 4), "scores": torch.randn(2, 5, 4), "valid": torch.rand(2, 5) > 0.5}
    want = _PackedThenSplit()(**other)
    got = module(**other)
    assert all(torch.equal(got[name], want[name]) for name in want)
    lowered = lower_to_ov(exported)(**other)
    assert all(torch.allclose(lowered[name], want[name]) for name in want)


# --- empty_cats_as_zeros -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def empty_values():
    return empty_values_export()


def test_an_empty_cat_becomes_zeros_of_its_shape_and_keeps_growing(empty_values):
    module = empty_values.program.module()
    empty_cats_as_zeros(module.graph)
    module.recompile()
    assert sum(n.target is torch.ops.aten.cat.default for n in module.graph.nodes) == 1  # the keys' cat stays
    step = empty_values_step(3, 13)
    got = lower_to_ov(empty_values)(**step)
    assert got["values"].shape == (3, 1, 14, 0) and torch.equal(got["keys"], EmptyValues()(**step)["keys"])


def test_without_empty_cats_as_zeros_the_empty_values_lose_the_step(empty_values):
    """Canary: when this fails, OpenVINO keeps an operand empty only off the concat axis and the fix can go."""
    got = lower_to_ov(empty_values, graph_fixes=_without(empty_cats_as_zeros))(**empty_values_step(3, 13))
    assert got["values"].shape == (3, 1, 13, 0)
