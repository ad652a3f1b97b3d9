"""patch_upsampled_to_input_length, patch_unconditional_swin_pads: pads a model takes at some sizes, taken at all."""

from __future__ import annotations

import torch
from torch import nn

import hfx
from hfx import zoo
from hfx.patches import (
    merge_padded,
    padded_to_patches,
    patch_unconditional_swin_pads,
    patch_upsampled_to_input_length,
    window_padded,
)
from tests.helpers import assert_leaves_forwards


class _Upsample(nn.Module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, frames, width = hidden_states.shape
        return hidden_states[:, :, None, :].expand(batch, frames, 2, width).reshape(batch, 2 * frames, width)


class _Squeezing(nn.Module):
    """SEW's encoder in small: pool time by 2, upsample back, pad the odd frame the pool dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool1d(2, 2)
        self.upsample = _Upsample()

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        hidden_states = inputs_embeds
        n_input_timesteps = hidden_states.shape[1]
        pooled = self.pool(hidden_states.transpose(1, 2)).transpose(1, 2)
        hidden_states = self.upsample(pooled.tanh())
        if hidden_states.shape[1] < n_input_timesteps:
            hidden_states = nn.functional.pad(hidden_states, (0, 0, 0, n_input_timesteps - hidden_states.shape[1]))
        return hidden_states


class _Merging(nn.Module):
    """Swin's patch merging in small: pad each odd side by one, then take every other row and column."""

    def maybe_pad(self, input_feature, height, width):
        if (height % 2 == 1) or (width % 2 == 1):
            input_feature = nn.functional.pad(input_feature, (0, 0, 0, width % 2, 0, height % 2))
        return input_feature

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        _, _, height, width = pixel_values.shape
        padded = self.maybe_pad(pixel_values.permute(0, 2, 3, 1), height, width)
        return padded[:, 0::2, 0::2] + padded[:, 1::2, 1::2]


class _Embedding(nn.Module):
    """Swin's patch embedding's pad to a multiple of the patch size, then the patches' sums."""

    patch_size = (4, 4)

    def maybe_pad(self, pixel_values, height, width):
        if width % self.patch_size[1] != 0:
            pad_values = (0, self.patch_size[1] - width % self.patch_size[1])
            pixel_values = nn.functional.pad(pixel_values, pad_values)
        if height % self.patch_size[0] != 0:
            pad_values = (0, 0, 0, self.patch_size[0] - height % self.patch_size[0])
            pixel_values = nn.functional.pad(pixel_values, pad_values)
        return pixel_values

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        _, _, height, width = pixel_values.shape
        return nn.functional.avg_pool2d(self.maybe_pad(pixel_values, height, width), 4)


class _Layer(nn.Module):
    """Swin's layer pad to a multiple of the window."""

    window_size = 3

    def maybe_pad(self, hidden_states, height, width):
        pad_right = (self.window_size - width % self.window_size) % self.window_size
        pad_bottom = (self.window_size - height % self.window_size) % self.window_size
        pad_values = (0, 0, 0, pad_right, 0, pad_bottom)
        hidden_states = nn.functional.pad(hidden_states, pad_values)
        return hidden_states, pad_values


def test_the_unconditional_pads_give_the_models_own_values():
    merging, embedding, layer = _Merging(), _Embedding(), _Layer()
    for rows, columns in ((5, 6), (6, 6), (7, 9)):
        feature = torch.randn(1, rows, columns, 3)
        torch.testing.assert_close(merge_padded(merging, feature, rows, columns),
                                   merging.maybe_pad(feature, rows, columns), rtol=0, atol=0)
        pixels = torch.randn(1, 3, rows, columns)
        torch.testing.assert_close(padded_to_patches(embedding, pixels, rows, columns),
                                   embedding.maybe_pad(pixels, rows, columns), rtol=0, atol=0)
        (ours, our_values), (theirs, their_values) = (window_padded(layer, feature, rows, columns),
                                                      layer.maybe_pad(feature, rows, columns))
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        assert our_values == their_values


def _served_at_every_size(model: nn.Module, inputs: dict[str, torch.Tensor], axis: int, sizes: range) -> None:
    exported = hfx.export(hfx.capture(inputs, model))
    assert all(high is None for _, high in exported.io.bounds.values()), exported.io.bounds
    for size in sizes:
        (name, value), = inputs.items()
        shape = list(value.shape)
        shape[axis] = size
        x = torch.randn(shape)
        torch.testing.assert_close(exported(**{name: x}), model(x), rtol=0, atol=1e-6)


def test_a_squeezing_encoder_keeps_its_frames_dynamic_at_both_parities():
    model = _Squeezing()
    own = _Squeezing.forward
    with patch_upsampled_to_input_length(model):
        assert _Squeezing.forward is not own
    assert _Squeezing.forward is own
    _served_at_every_size(model, {"inputs_embeds": torch.randn(2, 10, 4)}, 1, range(2, 24))


def test_odd_sided_merges_and_patches_keep_the_image_dynamic():
    _served_at_every_size(_Merging(), {"pixel_values": torch.randn(2, 3, 8, 8)}, 2, range(2, 19))
    _served_at_every_size(_Embedding(), {"pixel_values": torch.randn(2, 3, 16, 16)}, 3, range(4, 23))


def test_the_swin_classes_are_found_by_their_pads_and_restored():
    own = {name: vars(cls)["maybe_pad"] for name, cls in (("merging", _Merging), ("embedding", _Embedding),
                                                          ("layer", _Layer))}
    model = nn.ModuleList([_Merging(), _Embedding(), _Layer()])
    with patch_unconditional_swin_pads(model):
        assert (_Merging.maybe_pad, _Embedding.maybe_pad, _Layer.maybe_pad) == (merge_padded, padded_to_patches,
                                                                                window_padded)
    assert {"merging": _Merging.maybe_pad, "embedding": _Embedding.maybe_pad, "layer": _Layer.maybe_pad} == own


def test_models_without_the_patterns_are_left_alone():
    assert_leaves_forwards(patch_upsampled_to_input_length, zoo.build("bert"))
    assert_leaves_forwards(patch_unconditional_swin_pads, zoo.build("bert"))


def test_sew_is_served_at_lengths_of_either_frame_parity():
    name = "ctc:sew"
    model = zoo.build(name)
    capture = zoo.forward_inputs(name, batch=2, sequence=7)
    exported = hfx.export(hfx.capture(capture, model))
    assert exported.io.bounds["audio_length"][1] is None
    frames = set()
    for samples in (3600, 3601, 3680, 4000, 4080):
        x = torch.randn(1, samples, generator=torch.Generator().manual_seed(samples))
        report = hfx.verify(model, {"input_values": x}, exported)
        assert report.passed, (samples, report)
        frames.add(int(model.sew._get_feat_extract_output_lengths(samples)) % 2)
    assert frames == {0, 1}
