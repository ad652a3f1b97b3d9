"""SSM patches: transformers' numbers, in the model's own modules only (their contract: test_contract.py)."""

from __future__ import annotations


import pytest
import torch
from transformers import cache_utils
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2

import hfx
from hfx import zoo
from hfx.patches import (
    patch_linear_attention_conv_state,
    patch_mamba2_chunk_scan,
    patch_mamba_selective_scan,
    ssm_patches,
    with_patches,
)
from hfx.patches._ssm import (
    DEFAULT_PREFIX_SCAN_LENGTH,
    patch_rglru_scan,
    prefix_rnn_scan,
    prefix_selective_scan,
    scanned_selective_scan,
)
from tests.tolerances import FP32_ONE_BLOCK, FP32_PARITY, FP32_SAME_KERNELS

KERNEL = 4


@pytest.fixture(scope="module")
def mamba():
    return zoo.build("mamba")


@pytest.fixture(scope="module")
def mamba2():
    return zoo.build("mamba2")


def _conv_update(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """What one prefill's ``update_conv_state`` returns and caches, for a ``length``-token input."""
    layer = cache_utils.LinearAttentionLayer()
    states = torch.randn(2, 3, length, generator=torch.Generator().manual_seed(seed))
    returned = layer.update_conv_state(states, conv_kernel_size=KERNEL)
    return returned, layer.conv_states[0].clone()


def _causal_conv(states: torch.Tensor, length: int) -> torch.Tensor:
    """The last ``length`` outputs of the causal conv every caller runs over the returned states."""
    weight = torch.randn(3, KERNEL, generator=torch.Generator().manual_seed(1))
    return modeling_mamba.causal_conv1d_fn(states, weight, None, activation="silu")[:, :, -length:]


# patch_linear_attention_conv_state


@pytest.mark.parametrize("length", [1, 3, 4, 7])
def test_conv_state_same_state_and_conv_output(length):
    eager_returned, eager_cached = _conv_update(length)
    with patch_linear_attention_conv_state():
        returned, cached = _conv_update(length)
    assert returned.shape[-1] == length + KERNEL  # the new states behind ``kernel`` zeros, for every length
    assert torch.equal(returned[..., :KERNEL], torch.zeros_like(returned[..., :KERNEL]))
    assert torch.equal(cached, eager_cached)
    assert torch.equal(_causal_conv(returned, length), _causal_conv(eager_returned, length))


def test_conv_state_leaves_a_decode_step_alone():
    layer = cache_utils.LinearAttentionLayer()
    with patch_linear_attention_conv_state():
        layer.update_conv_state(torch.ones(1, 3, 5), conv_kernel_size=KERNEL)
        returned = layer.update_conv_state(torch.full((1, 3, 1), 2.0), conv_kernel_size=KERNEL)
    assert returned.shape[-1] == KERNEL + 1  # the cached state, then the new token: as upstream


def test_conv_state_adds_nothing_to_the_subclasses():
    subclasses = [cache_utils.LinearAttentionAndFullAttentionLayer, cache_utils.LinearAttentionAndStaticFullAttentionLayer]
    with patch_linear_attention_conv_state():
        assert all("update_conv_state" not in vars(cls) for cls in subclasses)
    assert all("update_conv_state" not in vars(cls) for cls in subclasses)


# patch_mamba_selective_scan


def _selective_scan_inputs(length: int) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    gen = torch.Generator().manual_seed(length)
    batch, channels, state = 2, 6, 3
    args = (torch.randn(batch, channels, length, generator=gen), torch.randn(batch, channels, length, generator=gen),
            -torch.rand(channels, state, generator=gen), torch.randn(batch, state, length, generator=gen),
            torch.randn(batch, state, length, generator=gen))
    kwargs = {"D": torch.randn(channels, generator=gen), "z": torch.randn(batch, channels, length, generator=gen),
              "delta_bias": torch.randn(channels, generator=gen), "delta_softplus": True, "return_last_state": True}
    return args, kwargs


@pytest.mark.parametrize("length", [1, 5, 9])
def test_scanned_selective_scan_is_bitwise_the_reference(length):
    args, kwargs = _selective_scan_inputs(length)
    reference, reference_state = modeling_mamba.mamba_selective_scan(*args, **kwargs)
    scanned, scanned_state = scanned_selective_scan(*args, **kwargs)
    assert torch.equal(scanned, reference)
    assert torch.equal(scanned_state, reference_state)


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40, 300])  # within one chunk of 16, at its edge, across several
def test_prefix_selective_scan_is_the_reference_to_rounding(length):
    args, kwargs = _selective_scan_inputs(length)
    reference, reference_state = modeling_mamba.mamba_selective_scan(*args, **kwargs)
    output, state = prefix_selective_scan(*args, **kwargs)
    torch.testing.assert_close(output, reference, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    torch.testing.assert_close(state, reference_state, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_prefix_selective_scan_exports_without_loops_and_bounds_the_length():
    class Scan(torch.nn.Module):
        def forward(self, hidden_states, dt, A, B, C):  # noqa: N803
            return prefix_selective_scan(hidden_states, dt, A, B, C)

    args, _ = _selective_scan_inputs(7)
    length = torch.export.Dim("length", max=DEFAULT_PREFIX_SCAN_LENGTH)
    program = torch.export.export(Scan(), args, dynamic_shapes=({2: length}, {2: length}, None, {2: length}, {2: length}))
    assert not [n for n in program.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    new_args, _ = _selective_scan_inputs(40)  # another length, across three chunks
    torch.testing.assert_close(program.module()(*new_args), modeling_mamba.mamba_selective_scan(*new_args), rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    unbounded = torch.export.Dim("unbounded")  # the doubling steps cover DEFAULT_PREFIX_SCAN_LENGTH; export says so
    with pytest.raises(torch._dynamo.exc.UserError, match=f"max={DEFAULT_PREFIX_SCAN_LENGTH}"):
        torch.export.export(Scan(), args, dynamic_shapes=({2: unbounded}, {2: unbounded}, None, {2: unbounded}, {2: unbounded}))


def test_selective_scan_swaps_in_the_chosen_scan(mamba):
    with patch_mamba_selective_scan(mamba):
        assert modeling_mamba.mamba_selective_scan is prefix_selective_scan
    with patch_mamba_selective_scan(mamba, selective_scan=scanned_selective_scan):
        assert modeling_mamba.mamba_selective_scan is scanned_selective_scan


def test_selective_scan_touches_only_the_models_own_modules(mamba2):
    original = vars(modeling_mamba)["mamba_selective_scan"]
    with patch_mamba_selective_scan(mamba2), patch_mamba_selective_scan(torch.nn.Linear(1, 1)):
        assert vars(modeling_mamba)["mamba_selective_scan"] is original
        assert "mamba_selective_scan" not in vars(modeling_mamba2)


# patch_mamba2_chunk_scan


def _chunk_scan_inputs(length: int) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    gen = torch.Generator().manual_seed(length)
    batch, heads, head_dim, state = 2, 4, 16, 8
    args = (torch.randn(batch, length, heads, head_dim, generator=gen), torch.randn(batch, length, heads, generator=gen),
            -torch.rand(heads, generator=gen), torch.randn(batch, length, 1, state, generator=gen),
            torch.randn(batch, length, 1, state, generator=gen))
    kwargs = {"chunk_size": 8, "D": torch.randn(heads, generator=gen), "dt_bias": torch.randn(heads, generator=gen),
              "initial_states": torch.randn(batch, heads, head_dim, state, generator=gen), "dt_softplus": True,
              "dt_limit": (0.01, 0.5), "return_final_states": True}
    return args, kwargs


@pytest.mark.parametrize("length", [1, 7, 8, 9, 17])
def test_chunk_scan_same_output_and_state(mamba2, length):
    args, kwargs = _chunk_scan_inputs(length)
    reference, reference_state = modeling_mamba2.mamba2_chunk_scan(*args, **kwargs)
    with patch_mamba2_chunk_scan(mamba2):
        output, state = modeling_mamba2.mamba2_chunk_scan(*args, **kwargs)
    assert torch.equal(output, reference)
    # The extra all-zero chunk adds exact zeros to the inter-chunk sum, whose order may change by one ulp.
    torch.testing.assert_close(state, reference_state, rtol=FP32_SAME_KERNELS, atol=FP32_SAME_KERNELS)


def test_chunk_scan_touches_only_the_models_own_modules(mamba):
    original = vars(modeling_mamba2)["mamba2_chunk_scan"]
    with patch_mamba2_chunk_scan(mamba):
        assert vars(modeling_mamba2)["mamba2_chunk_scan"] is original


# patch_rglru_scan

RECURRENT_GEMMA = "causal-lm:recurrent_gemma"  # the generated zoo's tiny RecurrentGemma (RG-LRU and attention)


def _rnn_scan_inputs(length: int, *, state: bool, reset_at: int | None = None) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(length)
    reset = torch.zeros(2, length, 1, dtype=torch.bool)
    if reset_at is not None:
        reset[:, reset_at] = True  # a document boundary inside the prompt
    return {"hidden_states": torch.randn(2, length, 6, generator=gen), "recurrent_gate": torch.rand(2, length, 6, generator=gen),
            "reset": reset, "recurrent_states": torch.randn(2, 6, generator=gen) if state else None}


@pytest.mark.parametrize(("length", "reset_at"), [(1, None), (5, None), (17, 3), (40, 0)])
@pytest.mark.parametrize("state", [False, True])
def test_prefix_rnn_scan_is_the_reference_to_rounding(length, reset_at, state):
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    inputs = _rnn_scan_inputs(length, state=state, reset_at=reset_at)
    reference, reference_state = RecurrentGemmaRglru._rnn_scan(None, **inputs)  # noqa: SLF001 - the method patched
    output, last = prefix_rnn_scan(None, **inputs)
    torch.testing.assert_close(output, reference, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)
    torch.testing.assert_close(last, reference_state, rtol=FP32_ONE_BLOCK, atol=FP32_ONE_BLOCK)


def test_rglru_scan_swaps_the_models_own_class_only(models, mamba):
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    original = vars(RecurrentGemmaRglru)["_rnn_scan"]
    with patch_rglru_scan(models(RECURRENT_GEMMA)):
        assert vars(RecurrentGemmaRglru)["_rnn_scan"] is prefix_rnn_scan
    with patch_rglru_scan(mamba):
        assert vars(RecurrentGemmaRglru)["_rnn_scan"] is original


def test_a_recurrent_gemma_exports_with_a_dynamic_prompt_and_matches_eager(models):
    """Also the canary: the reference's loop still makes the prompt static without the patch."""
    model = models(RECURRENT_GEMMA)
    inputs = zoo.forward_inputs(RECURRENT_GEMMA, batch=2, sequence=7)
    without = tuple(p for p in hfx.patches.default_patches(model) if getattr(p, "func", p) is not patch_rglru_scan)
    assert "sequence" not in hfx.export(hfx.capture(inputs, model), patches=without).dynamic_shapes.names
    exported = hfx.export(hfx.capture(inputs, model))
    assert "sequence" in exported.dynamic_shapes.names
    assert hfx.verify(model, zoo.forward_inputs(RECURRENT_GEMMA, batch=3, sequence=11), exported, atol=FP32_PARITY).passed


def test_ssm_patches_are_a_plain_tuple_of_zero_argument_patches(mamba):
    patches = ssm_patches(mamba)
    assert isinstance(patches, tuple) and len(patches) == 7
    with with_patches(*patches):
        assert modeling_mamba.mamba_selective_scan is prefix_selective_scan
    assert vars(modeling_mamba)["mamba_selective_scan"] is not prefix_selective_scan
