"""export: torch.export with named shapes, parity on new shapes, purity, errors."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.helpers import PARITY_MODELS, PatchGrid, assert_same_state, new_inputs, state_of
from tests.tolerances import FP32_PARITY


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_exported_matches_eager_on_new_shapes(exported, models, name):
    report = hfx.verify(models(name), new_inputs(name), exported(name))
    assert report.passed and report.max_abs <= FP32_PARITY, str(report)


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_exported_returns_the_models_output_type(exported, models, name):
    with torch.no_grad():
        eager = models(name)(**new_inputs(name), **exported(name).io.constants)
    assert type(exported(name)(**new_inputs(name))) is type(eager)


def test_io_spec_names_dims_and_outputs(exported):
    io = exported("llama").io
    assert io.input_names == ("input_ids", "attention_mask")
    assert [s.shape for s in io.inputs] == [("batch", "sequence"), ("batch", "sequence")]
    assert io.output_names == ("logits",)
    assert io.outputs[0].shape == ("batch", "sequence", 256)
    assert io.bounds["sequence"] == (1, 256)


def test_a_fixed_image_size_becomes_static(exported):
    assert exported("vit").io.inputs[0].shape == ("batch", 3, 32, 32)
    assert "height" not in exported("vit").dynamic_shapes.bounds


def test_export_pipes_and_is_one_symbol_per_axis(models):
    ex = pipe(models("bert"), hfx.capture(zoo.inputs("bert")), hfx.export)
    assert len(ex.program.range_constraints) == 2


def test_batch_one_capture_stays_dynamic(models):
    ex = hfx.export(hfx.capture(zoo.inputs("llama", batch=1, sequence=1), models("llama")))
    assert ex.io.inputs[0].shape == ("batch", "sequence")
    assert hfx.verify(models("llama"), new_inputs("llama"), ex).passed


def test_export_leaves_model_and_inputs_unchanged(models):
    model = models("llama")
    inputs = zoo.inputs("llama")
    before_inputs = {k: v.clone() for k, v in inputs.items()}
    before_state = state_of(model)
    before_attrs = {id(m): dict(vars(m)) for m in model.modules()}
    model.train()
    with torch.no_grad():
        eager_before = model.eval()(**new_inputs("llama")).logits
    model.train()
    hfx.export(hfx.capture(inputs, model))
    assert model.training  # the training flag is given back
    model.eval()
    assert_same_state(model, before_state)
    assert all(torch.equal(inputs[k], before_inputs[k]) for k in inputs)
    assert {id(m): vars(m).keys() for m in model.modules()} == {k: v.keys() for k, v in before_attrs.items()}
    with torch.no_grad():
        assert torch.equal(model(**new_inputs("llama")).logits, eager_before)


def test_failed_export_leaves_the_model_unchanged():
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

        def forward(self, x):
            self.touched = True
            if x.sum() > 0:  # data-dependent control flow: not traceable
                return self.linear(x)
            return x

    model = Broken()
    before = state_of(model)
    with pytest.raises(hfx.CaptureError, match=r"\[export\] component 'model' of Broken"):
        hfx.export(hfx.capture({"x": torch.ones(2, 2)}, model))
    assert "touched" not in vars(model)
    assert_same_state(model, before)


def test_flash_attention_is_switched_to_sdpa_for_the_export_only():
    model = zoo.build("llama")
    model.config._attn_implementation_internal = "flash_attention_2"
    ex = hfx.export(hfx.capture(zoo.inputs("llama"), model))
    assert model.config._attn_implementation == "flash_attention_2"
    model.config._attn_implementation_internal = "sdpa"
    assert hfx.verify(model, new_inputs("llama"), ex).passed


def test_export_accepts_explicit_patches(models):
    entered = []

    import contextlib

    @contextlib.contextmanager
    def marker():
        entered.append(True)
        yield

    hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 1)), patches=(marker,))
    assert entered == [True]


def test_exported_rejects_an_unknown_input(exported):
    with pytest.raises(hfx.InputError, match="input_idz"):
        exported("llama")(input_idz=torch.ones(1, 1, dtype=torch.long))


def test_exported_rejects_a_changed_constant(exported):
    with pytest.raises(hfx.InputError, match="use_cache"):
        exported("llama")(**new_inputs("llama"), use_cache=True)


def test_exported_rejects_sizes_beyond_bounds(exported):
    too_long = zoo.inputs("llama", batch=1, sequence=300)
    with pytest.raises(hfx.InputError, match=r"sequence.*300.*\[1, 256\]"):
        exported("llama")(**too_long)


class _Windows(torch.nn.Module):
    """Sums each full window of 4 tokens, only when there is one (DeepSeek-V4's KV compressor does so)."""

    def forward(self, inputs_embeds):
        usable = inputs_embeds.shape[1] // 4 * 4
        chunk = inputs_embeds[:, :usable]
        if chunk.shape[1] > 0:
            return chunk.reshape(inputs_embeds.shape[0], -1, 4, inputs_embeds.shape[2]).sum(2)
        return inputs_embeds[:, :0]


def test_a_minimum_the_models_code_sets_is_kept_and_a_refusal_names_the_declared_bounds():
    model = _Windows()
    exported = hfx.export(hfx.capture({"inputs_embeds": torch.randn(2, 7, 3)}, model))
    # The branch holds from 4 tokens on; below, the graph is not the model's (a minimum of 2 from tracing
    # alone is given back to the declared 1, as the other tests check).
    assert exported.io.bounds["sequence"][0] == 4
    assert dict(exported.io.declared_bounds) == {"sequence": (1, None)}
    inside = torch.randn(3, 5, 3)
    torch.testing.assert_close(exported(inputs_embeds=inside), model(inputs_embeds=inside), rtol=0, atol=0)
    low, high = exported.io.bounds["sequence"]
    for size in (3, high + 4):
        with pytest.raises(hfx.InputError, match=rf"is {size}, outside .*\[{low}, {high}\]\. It was exported with "
                                                 rf"\[1, None\]; torch.export narrowed .* Capture inputs of size {size}"):
            exported(inputs_embeds=torch.randn(2, size, 3))
    assert hfx.IoSpec.from_json(exported.io.to_json()) == exported.io


class _PadsToBlocks(torch.nn.Module):
    """Pads the sequence to blocks of 4 only when it is not a multiple (LongT5's ``_split_into_blocks``)."""

    def forward(self, input_ids):
        x = input_ids.float()
        if x.shape[1] % 4 != 0:
            x = torch.nn.functional.pad(x, (0, -x.shape[1] % 4))
        return x.reshape(x.shape[0], -1, 4).sum(-1)


def test_a_dim_its_guards_pin_to_a_range_named_dims_cannot_state_keeps_that_range():
    # Traced at 7, torch 2.13 guards "7 % 4 != 0" and "two blocks", true for 5 to 7 only. Named dims cannot say
    # so (torch 2.13 even fails to word its fix), automatic dims can: the program keeps [5, 7] and refuses 8.
    # torch 2.14 proves the padding right for every size and keeps the whole range.
    model = _PadsToBlocks()
    exported = hfx.export(hfx.capture({"input_ids": torch.ones(2, 7, dtype=torch.long)}, model))
    low, high = exported.io.bounds["sequence"]
    assert low <= 5 and (high is None or high >= 7)
    for size in (5, 6, 7, 8, 12):
        ids = torch.randint(0, 9, (3, size))
        if high is not None and size > high:
            with pytest.raises(hfx.InputError, match=rf"is {size}, outside the program's bounds \[{low}, {high}\]"):
                exported(input_ids=ids)
        else:
            torch.testing.assert_close(exported(input_ids=ids), model(input_ids=ids), rtol=0, atol=0)


def test_a_dim_its_guards_allow_at_one_size_of_its_bounds_becomes_static():
    # Over [32, 39] px, RADIO's patch grid ``height // 8`` is 4 and its reshape runs at 32 alone: torch 2.13 fails
    # to word that fix ("Cannot create Dim with inconsistent min=4, max=4"), hfx applies it (the dim static).
    model = PatchGrid()
    pixels = {"pixel_values": torch.randn(2, 3, 32, 32)}
    exported = hfx.export(hfx.capture(pixels, model), bounds={"height": (32, 39), "width": (32, 39)})
    assert exported.dynamic_shapes.names == ("batch",)
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(exported(pixel_values=x), model(x), rtol=0, atol=0)


def test_without_the_fix_torch_cannot_word_a_dim_pinned_within_its_bounds():
    """Canary: when torch words the fix itself (a static dim), ``_pinned_by_guards`` in hfx/_export/export.py
    can go."""
    height, width = torch.export.Dim("height", min=32, max=39), torch.export.Dim("width", min=32, max=39)
    with pytest.raises(AssertionError, match="Cannot create Dim with inconsistent min=4, max=4"):
        torch.export.export(PatchGrid(), (torch.randn(2, 3, 32, 32),), dynamic_shapes=({2: height, 3: width},),
                            strict=False)


def test_longt5_keeps_its_sequence_dynamic_within_one_block():
    # LongT5's local attention pads to blocks of 128 unless the length is a multiple: made static at the
    # capture's 7 tokens before, while the peer's automatic dims passed (issue 19).
    name = "seq2seq-lm:longt5"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert exported.io.bounds["sequence"] == (1, 127)
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed


class _OneBlock(torch.nn.Module):
    """Tokens padded to blocks of 8 that branch on there being one block: torch's guard holds for 1 to 8 tokens,
    which named dims cannot state, so the dim is ranged by its guards (as LongT5's and LED's blocks are)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(input_ids, (0, (-input_ids.shape[1]) % 8))
        blocks = padded.view(input_ids.shape[0], -1, 8)
        if blocks.shape[1] == 1:
            return blocks.sum(-1)
        return blocks.amax(-1)


def test_a_dim_ranged_by_its_guards_has_its_bound_where_the_tensors_read_it():
    exported = hfx.export(hfx.capture({"input_ids": torch.ones(2, 7, dtype=torch.long)}, _OneBlock()))
    assert exported.io.bounds["sequence"] == (1, 8)
    sequence = next(n for n in exported.program.graph.nodes if n.op == "placeholder").meta["val"].shape[1]
    # Not only in range_constraints: ExecuTorch plans memory at the bounds the shape environment holds, and
    # planned LED's inputs at the capture's size ("Attempted to resize a bounded tensor" at 3 x 11).
    assert sequence.node.shape_env.bound_sympy(sequence.node.expr).upper == 8


def test_export_maps_over_components(models):
    parts = hfx.Components(items={"a": hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 1))})
    out = hfx.export(parts)
    assert isinstance(out, hfx.Components) and isinstance(out["a"], hfx.Exported)


def test_export_failure_in_a_component_names_it():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return x.item()

    with pytest.raises(hfx.CaptureError, match=r"^\[export\] component 'model' of Bad") as info:
        hfx.export(hfx.Components(items={"enc": hfx.capture({"x": torch.ones(2)}, Bad())}))
    assert info.value.__notes__[-1] == "in component 'enc' of export"


def test_a_component_holds_only_the_weights_its_graph_reads(generative):
    _, parts = generative("t5")
    encoder_weights = {k for k in parts["encoder"].program.state_dict}
    decode_weights = set(parts["decode"].program.state_dict)
    assert not any(".encoder." in k for k in decode_weights)  # the decode step reads the encoder's outputs only
    assert encoder_weights and decode_weights


class _MaskBiased(torch.nn.Module):
    """Scores over the past keys and one new key plus a bias from the whole mask (Falcon's ALiBi pattern)."""

    def forward(self, keys, attention_mask):
        scores = torch.cat([keys.sum(-1), keys.new_zeros(keys.shape[0], 1)], dim=-1)
        return scores + attention_mask.cumsum(-1)


def test_a_dim_torch_relates_to_another_becomes_derived():
    shapes = hfx.DynamicShapes(
        axes={"keys": {0: "batch", 1: "past_sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"}},
        bounds={"batch": (1, None), "past_sequence": (1, 64), "total_sequence": (1, 64)},
    )
    inputs = {"keys": torch.randn(2, 5, 3), "attention_mask": torch.ones(2, 6)}
    ex = hfx.export(hfx.capture(inputs, _MaskBiased(), dynamic_shapes=shapes))
    assert ex.io.inputs[1].shape == ("batch", "past_sequence + 1")
    assert ex.io.bounds["past_sequence"] == (1, 63)  # the mask's 64 bounds the past
    keys, mask = torch.randn(3, 9, 3), torch.ones(3, 10)
    assert torch.equal(ex(keys=keys, attention_mask=mask), _MaskBiased()(keys, mask))


def test_a_multi_token_decode_graph_is_traced_once(models, monkeypatch):
    calls = []
    real = torch.export.export

    def counted(*args, **kwargs):
        calls.append(kwargs.get("dynamic_shapes"))
        return real(*args, **kwargs)

    parts = hfx.decompose(hfx.capture(zoo.inputs("llama"), models("llama")))
    monkeypatch.setattr(torch.export, "export", counted)
    decode = hfx.export(parts["decode"])
    assert len(calls) == 1
    # The ranges torch.export derives from total = past + sequence, with the declared lower bounds kept.
    assert decode.io.bounds["total_sequence"] == (1, 256)
    assert decode.io.bounds["sequence"] == (1, 254)
    assert decode.io.bounds["past_sequence"] == (0, 254)


def test_span_bounds_need_the_relation_in_the_captured_sizes():
    from hfx._export.export import with_span_bounds

    shapes = hfx.DynamicShapes(axes={}, bounds={"sequence": (1, 256), "past_sequence": (0, 255),
                                                "total_sequence": (1, 256)})
    assert with_span_bounds(shapes, {"sequence": 3, "past_sequence": 4, "total_sequence": 9}) == shapes
    assert with_span_bounds(shapes, {"sequence": 3, "past_sequence": 4, "total_sequence": 7}).bounds == {
        "sequence": (1, 254), "past_sequence": (0, 254), "total_sequence": (4, 256)}


class _Branches(torch.nn.Module):
    """Two branches on remainders of the sequence that torch can neither prove nor state as a range."""

    def forward(self, inputs_embeds):
        x = inputs_embeds
        if (x.shape[1] // 4) % 2 == 1:  # Swin pads an odd feature map so
            x = x * 3
        if (x.shape[1] // 3) % 2 == 0:
            x = x * 2
        return x + 1


@pytest.mark.parametrize(("size", "bounds"), [(8, None), (6, (6, 7))], ids=["pinned", "narrowed"])
def test_a_dim_whose_kept_asserts_fail_near_the_traced_size_is_narrowed_or_static(size, bounds):
    # A "past_sequence" dim is exported with guards kept as asserts from the start (a growing cache's).
    shapes = hfx.DynamicShapes(axes={"inputs_embeds": {1: "past_sequence"}}, bounds={"past_sequence": (1, 512)})
    model = _Branches()
    exported = hfx.export(hfx.capture({"inputs_embeds": torch.randn(2, size, 3)}, model, dynamic_shapes=shapes))
    assert exported.io.bounds.get("past_sequence") == bounds  # was (1, 512): eager's branches differ at 5, 9 ...
    for n in range(bounds[0], bounds[1] + 1) if bounds else (size,):
        report = hfx.verify(model, {"inputs_embeds": torch.randn(2, n, 3)}, exported)
        assert report.passed and report.max_abs == 0, str(report)
    with pytest.raises(hfx.InputError):
        exported(inputs_embeds=torch.randn(2, size + 2, 3))


def test_asserted_ranges_pin_a_dim_the_models_branches_fix_on_both_sides_of_the_traced_size():
    from hfx._export.branches import recording_branches
    from hfx._export.export import asserted_ranges

    dim = torch.export.Dim("sequence", min=1, max=512)
    with recording_branches() as branches:
        program = torch.export.export(_Branches(), (), {"inputs_embeds": torch.randn(2, 8, 3)}, strict=False,
                                      dynamic_shapes={"inputs_embeds": {1: dim}},
                                      prefer_deferred_runtime_asserts_over_guards=True)
    assert {str(b) for b in branches} == {"Ne(Mod((s29//4), 2), 1)", "Eq(Mod((s29//3), 2), 0)"}
    shapes = hfx.DynamicShapes(axes={"inputs_embeds": {1: "sequence"}}, bounds={"sequence": (1, 512)})
    assert asserted_ranges(program, {"inputs_embeds": torch.randn(2, 8, 3)}, shapes, branches) == {"sequence": None}


class _Windowed(torch.nn.Module):
    """Swin's pattern on a sequence: windows of 4; a count of at most 2 is clamped, an odd one padded."""

    def forward(self, inputs_embeds):
        x = inputs_embeds
        windows = x.shape[1] // 4
        if windows <= 2:
            x = x * 3
        if windows % 2 == 1:
            x = x * 2
        return x + 1


@pytest.mark.parametrize(("size", "bounds"), [(8, (8, 11)), (13, (12, 15))])
def test_a_dim_is_narrowed_to_the_sizes_the_models_branches_took_and_serves_each_exactly(size, bounds):
    shapes = hfx.DynamicShapes(axes={"inputs_embeds": {1: "past_sequence"}}, bounds={"past_sequence": (1, 512)})
    model = _Windowed()
    exported = hfx.export(hfx.capture({"inputs_embeds": torch.randn(2, size, 3)}, model, dynamic_shapes=shapes))
    assert exported.io.bounds["past_sequence"] == bounds  # never wider than torch's own range (8 to 11 at 8)
    for n in range(2, 40):
        if bounds[0] <= n <= bounds[1]:
            report = hfx.verify(model, {"inputs_embeds": torch.randn(2, n, 3)}, exported)
            assert report.passed and report.max_abs == 0, str(report)
        else:  # the branches differ here: refused, not wrong
            with pytest.raises(hfx.InputError):
                exported(inputs_embeds=torch.randn(2, n, 3))


class _Clamped2d(torch.nn.Module):
    """Swin's window clamp on an image: the last stage differs where the smaller side exceeds the window."""

    def forward(self, pixel_values):
        rows, columns = pixel_values.shape[-2:]
        if min(rows // 4, columns // 4) <= 2:  # the window clamped to the map
            return pixel_values.mean((-2, -1))
        return pixel_values.amax((-2, -1))


def test_a_branch_on_two_dims_narrows_both_to_a_box_where_it_holds():
    shapes = hfx.DynamicShapes(axes={"pixel_values": {2: "past_sequence", 3: "width"}},
                               bounds={"past_sequence": (1, 64), "width": (1, 64)})
    model = _Clamped2d()
    exported = hfx.export(hfx.capture({"pixel_values": torch.randn(2, 3, 8, 8)}, model, dynamic_shapes=shapes))
    # Each side alone may grow (the other keeps the smaller side at 2 windows); both together may not.
    assert exported.io.bounds["past_sequence"][1] == exported.io.bounds["width"][1] == 11
    for rows, columns in ((8, 8), (5, 11), (11, 11), (11, 4)):
        report = hfx.verify(model, {"pixel_values": torch.randn(2, 3, rows, columns)}, exported)
        assert report.passed and report.max_abs == 0, str(report)
    with pytest.raises(hfx.InputError):  # the eager model takes amax here, the program would have taken the mean
        exported(pixel_values=torch.randn(2, 3, 16, 16))


class _PositionTable(torch.nn.Module):
    """TimeSformer's position table, resized to the patch grid unless the patch count (and class token) is its
    length: traced at 32 px (4 x 4 patches of 8), the graph adds the table as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(1, 17, 3, generator=torch.Generator().manual_seed(0)))

    def forward(self, pixel_values):
        tokens = torch.nn.functional.avg_pool2d(pixel_values, 8)
        rows, columns = tokens.shape[-2:]
        tokens = torch.cat([tokens.new_zeros(tokens.shape[0], 1, 3), tokens.flatten(2).transpose(1, 2)], 1)
        if tokens.size(1) != self.table.size(1):
            grid = self.table[:, 1:].transpose(1, 2).reshape(1, 3, 4, 4)
            grid = torch.nn.functional.interpolate(grid, size=(rows, columns), mode="nearest")
            return tokens + torch.cat([self.table[:, :1], grid.flatten(2).transpose(1, 2)], 1)
        return tokens + self.table


def test_a_branch_equating_several_dims_with_a_number_narrows_them_where_it_holds():
    model = _PositionTable()
    exported = hfx.export(hfx.capture({"pixel_values": torch.randn(2, 3, 32, 32)}, model))
    # (h // 8) * (w // 8) == 16 with each side at its traced 4 patches: 32 to 39 px
    assert exported.io.bounds["height"] == exported.io.bounds["width"] == (32, 39)
    for height, width in ((32, 32), (39, 35)):
        report = hfx.verify(model, {"pixel_values": torch.randn(3, 3, height, width)}, exported)
        assert report.passed and report.max_abs == 0, str(report)
    with pytest.raises(hfx.InputError):  # eager interpolates the table here; the graph would add it as it is
        exported(pixel_values=torch.randn(2, 3, 64, 64))
