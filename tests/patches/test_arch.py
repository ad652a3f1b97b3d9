"""Architecture patches: eager numbers, no-ops elsewhere, a fixed export (their contract: test_contract.py)."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from transformers.models.deepseek_v2 import modeling_deepseek_v2
from transformers.models.dinov2 import modeling_dinov2

import hfx
from hfx import zoo
from hfx.patches import (
    arch_patches,
    patch_axial_positions,
    patch_complex_rotary,
    patch_covering_average_pool,
    patch_deepstack_gather,
    patch_dense_global_attention,
    patch_eos_pooling_gather,
    patch_functional_token_shift,
    patch_funnel_positions,
    patch_integer_conv_padding,
    patch_integer_pixel_shuffle,
    patch_latent_attention_keys,
    patch_one_chunk_loops,
    patch_padded_image_batch,
    patch_padding_mask_from_a_python_range,
    patch_padding_mask_kept,
    patch_position_interpolation,
    patch_real_fourier_mixing,
    patch_symbolic_step_positions,
    patch_tensor_len,
    patch_unconditional_swin_pads,
    patch_upsampled_to_input_length,
)
from hfx.patches._arch import (
    arange_padding_mask,
    batched_axial_positions,
    concatenated_expand_kv,
    gathered_relative_shift,
    kept_padding_mask,
    is_interpolating_vision_model,
    real_dft2,
    symbolic_len,
)
from tests.helpers import CAPTURE_SHAPE, NEW_SHAPE
from tests.tolerances import FP32_ONE_BLOCK, FP32_SAME_KERNELS

EMBEDDINGS = modeling_dinov2.Dinov2Embeddings
ORIGINAL = vars(EMBEDDINGS)["interpolate_pos_encoding"]
ORIGINAL_ROTARY = vars(modeling_deepseek_v2)["apply_rotary_emb"]


@pytest.fixture(scope="module")
def dinov2():
    return zoo.build("dinov2")


def test_position_interpolation_leaves_other_models_alone():
    model = zoo.build("vit")
    assert not is_interpolating_vision_model(model)
    with patch_position_interpolation(model):
        assert vars(EMBEDDINGS)["interpolate_pos_encoding"] is ORIGINAL


def test_position_interpolation_gives_eager_numbers_at_both_sizes(dinov2):
    for shape in (CAPTURE_SHAPE, NEW_SHAPE):  # the trained 32 px (identity resampling) and 48 px
        pixels = zoo.inputs("dinov2", **shape)
        with torch.no_grad():
            want = dinov2(**pixels).logits
            with patch_position_interpolation(dinov2):
                got = dinov2(**pixels).logits
        assert torch.allclose(got, want, atol=FP32_SAME_KERNELS)


def test_dinov2_exports_with_dynamic_image_size_and_matches_eager_at_a_new_size(dinov2):
    # Without the patch the trained-size shortcut pins height and width to 32 and a 48 px image is rejected.
    exported = hfx.export(hfx.capture(zoo.inputs("dinov2", **CAPTURE_SHAPE), dinov2))
    assert exported.io.inputs[0].shape == ("batch", 3, "height", "width")
    report = hfx.verify(dinov2, zoo.inputs("dinov2", **NEW_SHAPE), exported)
    assert report.passed, str(report)


def test_arch_patches_are_bound_to_the_model(dinov2):
    patches = arch_patches(dinov2)
    assert [p.func for p in patches] == [patch_position_interpolation, patch_latent_attention_keys, patch_complex_rotary,
                                         patch_real_fourier_mixing, patch_funnel_positions, patch_axial_positions,
                                         patch_padding_mask_from_a_python_range, patch_tensor_len, patch_padding_mask_kept,
                                         patch_dense_global_attention, patch_padded_image_batch,
                                         patch_integer_pixel_shuffle, patch_deepstack_gather,
                                         patch_functional_token_shift, patch_eos_pooling_gather,
                                         patch_covering_average_pool, patch_symbolic_step_positions,
                                         patch_one_chunk_loops, patch_integer_conv_padding,
                                         patch_upsampled_to_input_length, patch_unconditional_swin_pads]
    assert all(p.args == (dinov2,) for p in patches)


# patch_latent_attention_keys

DEEPSEEK_V2 = "causal-lm:deepseek_v2"  # the generated zoo's tiny DeepSeek-V2: multi-head latent attention


def _latent_attention(models) -> torch.nn.Module:
    model = models(DEEPSEEK_V2)
    return next(m for m in model.modules() if "expand_kv" in vars(type(m)))


def test_concatenated_keys_are_the_references_bitwise(models):
    attention = _latent_attention(models)
    generator = torch.Generator().manual_seed(0)
    kv_nope = torch.randn(2, 1, 5, attention.kv_b_proj.in_features, generator=generator)
    k_rot = torch.randn(2, 1, 5, attention.qk_rope_head_dim, generator=generator)
    with torch.no_grad():
        reference = type(attention).expand_kv(attention, kv_nope, k_rot)
        concatenated = concatenated_expand_kv(attention, kv_nope, k_rot)
    assert all(torch.equal(a, b) for a, b in zip(concatenated, reference, strict=True))


def test_latent_attention_keys_patch_only_the_models_own_classes(models, dinov2):
    attention = type(_latent_attention(models))
    original = vars(attention)["expand_kv"]
    with patch_latent_attention_keys(models(DEEPSEEK_V2)):
        assert vars(attention)["expand_kv"] is concatenated_expand_kv
    with patch_latent_attention_keys(dinov2):
        assert vars(attention)["expand_kv"] is original


class _EmptyThenCopy(torch.nn.Module):
    """The reference's pattern: keys written into halves of a ``new_empty`` tensor."""

    def forward(self, nope, rope):
        keys = nope.new_empty(*nope.shape[:-1], nope.shape[-1] + rope.shape[-1])
        keys[..., : nope.shape[-1]].copy_(nope)
        keys[..., nope.shape[-1]:].copy_(rope)
        return keys


def test_executorch_still_specialises_an_empty_the_keys_are_written_into():
    """The canary: when ExecuTorch keeps this program's sequence dynamic, the patch can go."""
    pytest.importorskip("executorch")
    from executorch.exir import to_edge

    sequence = torch.export.Dim("sequence", max=64)
    program = torch.export.export(_EmptyThenCopy(), (torch.randn(2, 5, 3), torch.randn(2, 5, 2)),
                                  dynamic_shapes=({1: sequence}, {1: sequence}))
    assert isinstance(program.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].shape[1], torch.SymInt)
    edge = to_edge(program).exported_program()
    assert edge.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].shape[1] == 5


# patch_complex_rotary


def test_deepseek_v2_with_real_rotary_arithmetic_gives_eager_logits(models):
    model = models(DEEPSEEK_V2)
    inputs = zoo.forward_inputs(DEEPSEEK_V2, batch=2, sequence=7)
    with torch.no_grad():
        want = model(**inputs).logits
        with patch_complex_rotary(model):
            got = model(**inputs).logits
            assert modeling_deepseek_v2.apply_rotary_emb is not ORIGINAL_ROTARY
    assert modeling_deepseek_v2.apply_rotary_emb is ORIGINAL_ROTARY
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_complex_rotary_patches_only_the_models_own_modules(dinov2):
    from transformers.models.llama4 import modeling_llama4

    original = vars(modeling_llama4)["apply_rotary_emb"]
    with patch_complex_rotary(dinov2):
        assert modeling_deepseek_v2.apply_rotary_emb is ORIGINAL_ROTARY
        assert vars(modeling_llama4)["apply_rotary_emb"] is original


class _ComplexRotation(torch.nn.Module):
    """DeepSeek-V2's rotation: complex frequencies broadcast over heads (``unsqueeze(1)``)."""

    def forward(self, x, angle):
        frequencies = torch.polar(torch.ones_like(angle), angle).unsqueeze(1)
        rotated = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * frequencies
        return torch.view_as_real(rotated).flatten(3)


def test_torch_onnx_still_has_no_function_for_complex_rotation():
    """The canary: when torch.onnx exports complex multiplication, the patch can go (for ONNX at least)."""
    pytest.importorskip("onnxscript")
    with pytest.raises(Exception, match="No ONNX function found|Unsupported|complex"):
        torch.onnx.export(_ComplexRotation(), (torch.randn(1, 2, 3, 4), torch.rand(1, 3, 2)), dynamo=True, verbose=False)


# patch_real_fourier_mixing

FNET = "masked-lm:fnet"


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 7, 12), (3, 64, 40)])
def test_real_dft2_is_the_real_part_of_the_fft(shape):
    x = torch.randn(*shape)
    # A DFT as products sums n terms per axis where the FFT sums log n: float32 rounding grows with the
    # length and the magnitude (about sqrt(n) of the input's), so the bound is relative to that magnitude.
    want = torch.fft.fftn(x, dim=(1, 2)).real
    torch.testing.assert_close(real_dft2(x), want, rtol=0, atol=FP32_ONE_BLOCK * (1 + want.abs().max().item()))


def test_fnet_with_real_fourier_mixing_gives_eager_logits_and_is_restored(models):
    from transformers.models.fnet import modeling_fnet

    model = models(FNET)
    original = vars(modeling_fnet.FNetBasicFourierTransform)["forward"]
    inputs = zoo.forward_inputs(FNET, batch=2, sequence=7)
    with torch.no_grad():
        want = model(**inputs).logits
        with patch_real_fourier_mixing(model):
            assert vars(modeling_fnet.FNetBasicFourierTransform)["forward"] is not original
            got = model(**inputs).logits
    assert vars(modeling_fnet.FNetBasicFourierTransform)["forward"] is original
    torch.testing.assert_close(got, want, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def _dft_matrix(n: int) -> torch.Tensor:
    """``scipy.linalg.dft(n)`` in complex64: ``exp(-2 pi i jk / n)``."""
    k = torch.arange(n, dtype=torch.float64)
    return torch.polar(torch.ones(n, n, dtype=torch.float64), -2 * torch.pi * torch.outer(k, k) / n).to(torch.complex64)


def test_real_fourier_mixing_leaves_the_tpu_dft_matrices_alone(models):
    # The TPU variant cuts its DFT matrices to the sequence length: not the DFT of that length, so not replaced.
    import functools

    from transformers.models.fnet import modeling_fnet

    model = models(FNET)
    mixing = next(m for m in model.modules() if isinstance(m, modeling_fnet.FNetBasicFourierTransform))
    tpu = modeling_fnet.FNetBasicFourierTransform.__new__(modeling_fnet.FNetBasicFourierTransform)
    torch.nn.Module.__init__(tpu)
    tpu.fourier_transform = functools.partial(modeling_fnet.two_dim_matmul, matrix_dim_one=_dft_matrix(8),
                                              matrix_dim_two=_dft_matrix(6))
    x = torch.randn(1, 4, 6)
    want = tpu(x)[0]
    with patch_real_fourier_mixing(model):
        assert torch.equal(tpu(x)[0], want)
        assert torch.equal(mixing(x)[0], real_dft2(x))


def test_fnet_exports_with_a_dynamic_sequence_and_no_complex_tensors(models):
    model = models(FNET)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(FNET, batch=2, sequence=7), model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    assert not [n for n in exported.program.graph.nodes if "fft" in str(n.target)]
    report = hfx.verify(model, zoo.forward_inputs(FNET, batch=3, sequence=11), exported)
    assert report.passed, str(report)


class _RealFourier(torch.nn.Module):
    """FNet's mixing: the real part of a 2-D FFT over the sequence and hidden axes."""

    def forward(self, x):
        return torch.fft.fftn(x, dim=(1, 2)).real


def test_openvino_still_has_no_conversion_for_the_fft():
    """The canary: when OpenVINO converts a complex FFT, the patch can go (for OpenVINO at least)."""
    ov = pytest.importorskip("openvino")
    program = torch.export.export(_RealFourier(), (torch.randn(1, 4, 6),))
    with pytest.raises(Exception, match="fft|conversion rule"):
        ov.convert_model(program)


# patch_funnel_positions

FUNNEL = "masked-lm:funnel"


def test_funnel_with_symbolic_positions_gives_eager_logits_bitwise_and_is_restored(models):
    from transformers.models.funnel import modeling_funnel

    model = models(FUNNEL)
    original = vars(modeling_funnel.FunnelAttentionStructure)["get_position_embeds"]
    for sequence in (5, 11):
        inputs = zoo.forward_inputs(FUNNEL, batch=2, sequence=sequence)
        with torch.no_grad():
            want = model(**inputs).logits
            with patch_funnel_positions(model):
                assert modeling_funnel._relative_shift_gather is gathered_relative_shift
                got = model(**inputs).logits
        assert torch.equal(got, want)  # the same positions and the same gathered elements
    assert vars(modeling_funnel.FunnelAttentionStructure)["get_position_embeds"] is original


def test_funnel_exports_with_a_dynamic_sequence():
    # Two blocks (one pooling, of positions and of the relative shift) with one layer each and one decoder layer:
    # the same patched code in less export time. With the zoo's three blocks a capture at 7 tokens pools the
    # sequence to one token in the third, and torch's contiguity check then pins it (Eq((s - 1) // 4, 1)),
    # which no patch of the model's positions changes: capture such a model at 16 tokens or more.
    from transformers import AutoModelForMaskedLM

    config = zoo.entry(FUNNEL).config()
    config.block_sizes, config.num_decoder_layers = [1, 1], 1
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config).eval()
    exported = hfx.export(hfx.capture(zoo.forward_inputs(FUNNEL, batch=2, sequence=7), model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    for sequence in (3, 11, 24):
        report = hfx.verify(model, zoo.forward_inputs(FUNNEL, batch=3, sequence=sequence), exported)
        assert report.passed, str(report)


# patch_axial_positions

REFORMER = "masked-lm:reformer"


def _bitwise_and_restored(model: torch.nn.Module, name: str, patch, owner: type, attribute: str) -> None:
    """``patch(model)`` gives the eager logits bitwise at two shapes and puts ``owner.attribute`` back after."""
    original = vars(owner)[attribute]
    for batch, sequence in ((2, 5), (3, 11)):
        inputs = zoo.forward_inputs(name, batch=batch, sequence=sequence)
        with torch.no_grad():
            want = model(**inputs).logits
            with patch(model):
                assert vars(owner)[attribute] is not original
                got = model(**inputs).logits
        assert torch.equal(got, want)
    assert vars(owner)[attribute] is original


def test_reformer_with_batched_axial_positions_gives_eager_logits_bitwise_and_is_restored(models):
    from transformers.models.reformer import modeling_reformer

    # The same rows of the same grid.
    _bitwise_and_restored(models(REFORMER), REFORMER, patch_axial_positions, modeling_reformer.AxialPositionEmbeddings,
                          "forward")


def test_batched_axial_positions_read_each_rows_ids_and_refuse_a_sequence_past_the_grid(models):
    embeddings = next(m for m in models(REFORMER).modules() if type(m).__name__ == "AxialPositionEmbeddings")
    ids = torch.tensor([[0, 5, 3], [7, 1, 1]])
    with torch.no_grad():
        got = batched_axial_positions(embeddings, ids)
        assert torch.equal(got, type(embeddings).forward(embeddings, ids))
        assert torch.equal(got[1, 1], got[1, 2]) and got.shape == (2, 3, got.shape[-1])
        too_long = torch.arange(math.prod(embeddings.axial_pos_shape) + 1)[None]
        with pytest.raises(ValueError, match="axial_pos_shape"):
            batched_axial_positions(embeddings, too_long)


def test_reformer_exports_with_a_dynamic_batch_and_matches_eager(models):
    model = models(REFORMER)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(REFORMER, batch=2, sequence=7), model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    report = hfx.verify(model, zoo.forward_inputs(REFORMER, batch=3, sequence=11), exported)
    assert report.passed, str(report)


def test_without_the_axial_patch_reformer_still_exports_a_static_batch(models):
    """Canary: when this fails, transformers selects the positions in one op and the patch can go."""
    model = models(REFORMER)
    others = tuple(p for p in hfx.patches.default_patches(model) if getattr(p, "func", None) is not patch_axial_positions)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(REFORMER, batch=2, sequence=7), model), patches=others)
    assert exported.io.inputs[0].shape[0] == 2


# patch_padding_mask_from_a_python_range

CPMANT = "causal-lm:cpmant"


def test_cpmant_with_the_arange_padding_mask_gives_eager_logits_bitwise_and_is_restored(models):
    from transformers.models.cpmant import modeling_cpmant

    _bitwise_and_restored(models(CPMANT), CPMANT, patch_padding_mask_from_a_python_range, modeling_cpmant.CpmAntModel,
                          "_prepare_attention_mask")
    with torch.no_grad(), patch_padding_mask_from_a_python_range(models(CPMANT)):
        assert vars(modeling_cpmant.CpmAntModel)["_prepare_attention_mask"] is arange_padding_mask


def test_cpmant_exports_with_a_dynamic_sequence_and_matches_eager(models):
    model = models(CPMANT)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(CPMANT, batch=2, sequence=7), model))
    assert exported.io.inputs[0].shape == ("batch", "sequence")
    for batch, sequence in ((3, 11), (1, 4)):
        report = hfx.verify(model, zoo.forward_inputs(CPMANT, batch=batch, sequence=sequence), exported)
        assert report.passed, str(report)


def test_without_the_padding_mask_patch_cpmant_exports_a_static_sequence(models):
    """Canary: when this fails, transformers builds the mask without a Python range and the patch can go."""
    model = models(CPMANT)
    others = tuple(p for p in hfx.patches.default_patches(model)
                   if getattr(p, "func", None) is not patch_padding_mask_from_a_python_range)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(CPMANT, batch=2, sequence=7), model), patches=others)
    assert exported.io.inputs[0].shape[1] == 7


# patch_tensor_len


class _LenBatch(torch.nn.Module):
    """The RT-DETR pattern: the batch read with ``len`` of a tensor, then used as a size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = len(x)
        return x.new_zeros(batch, 3) + x.sum(-1, keepdim=True)


def _batch_dynamic(module: torch.nn.Module) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1)
    return torch.export.export(module, (torch.ones(2, 4),), dynamic_shapes=({0: batch},), strict=False)


def test_len_of_a_tensor_specialises_the_batch_without_the_patch():
    # Canary: when torch.export keeps len(tensor) symbolic, this fails and the patch can go.
    with pytest.raises(Exception, match="specialized it to be a constant"):
        _batch_dynamic(_LenBatch())


def test_len_of_a_tensor_keeps_the_batch_dynamic_with_the_patch():
    module = _LenBatch()
    space = vars(sys.modules[__name__])
    with patch_tensor_len(module):
        assert space["len"] is symbolic_len
        program = _batch_dynamic(module)
    assert "len" not in space
    x = torch.randn(5, 4)
    torch.testing.assert_close(program.module()(x), module(x), rtol=0, atol=0)
    assert symbolic_len([1, 2]) == 2 and symbolic_len(torch.ones(3, 1)) == 3  # eager: the builtin


def test_rt_detr_exports_with_a_dynamic_batch():
    name = "object-detection:rt_detr"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert exported.dynamic_shapes.axes["pixel_values"][0] == "batch"
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed


# patch_padding_mask_kept


def test_fsmt_exports_with_its_decoder_padding_mask_kept_and_gives_eagers_numbers():
    # make_padding_mask returned None for a batch without padding: a branch on the inputs' values.
    name = "seq2seq-lm:fsmt"
    model = zoo.build(name)
    module = sys.modules[type(model).__module__]
    ids = torch.tensor([[5, 1, 6], [7, 8, 9]])
    assert module.make_padding_mask(ids[1:], 1) is None  # the branch the patch removes
    assert torch.equal(kept_padding_mask(ids, 1), module.make_padding_mask(ids, 1))
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7), model))
    assert hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported).passed


# patch_integer_pixel_shuffle


def test_integer_pixel_shuffle_equals_internvls_and_exports_with_dynamic_batch():
    name = "image-text-to-text:internvl"
    model = zoo.build(name)
    features = torch.randn(2, 4, 6, 8)
    with torch.no_grad():
        want = model.model.pixel_shuffle(features, 0.5)
        with patch_integer_pixel_shuffle(model):
            assert torch.equal(model.model.pixel_shuffle(features, 0.5), want)
    exported = hfx.export(hfx.capture(zoo.forward_inputs(name, batch=2, sequence=7))(model))
    report = hfx.verify(model, zoo.forward_inputs(name, batch=3, sequence=11), exported)
    assert report.passed, report
