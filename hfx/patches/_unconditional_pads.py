"""Pads a model takes only at some sizes, taken at every size (by zero where the model skips them).

A model that pads a tensor only when a size calls for it (``if height % 2 == 1: pad``) branches on
the input's size: torch.export keeps the branch of the traced size, and the program is right only at
the sizes that take the same branch, a lattice of them (every odd, or every even, length). hfx then
narrows the dim to the run of sizes around the traced one (``hfx._export.branches``), which refuses
most lengths a user sends. Padding by the amount the model computes, zero where it skips the pad,
gives the same numbers at every size without the branch, and the dim stays dynamic.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr

_SHORT_UPSAMPLE = "if hidden_states.shape[1] < n_input_timesteps:"
_ODD_MERGE = "if (height % 2 == 1) or (width % 2 == 1):"
_PATCH_REMAINDER = "if width % self.patch_size[1] != 0:"
_WINDOW_REMAINDER = "pad_right = (self.window_size - width % self.window_size) % self.window_size"


def padding_to_multiple(size: Any, multiple: Any) -> Any:
    """How much ``size`` needs to become a multiple of ``multiple``, as ``ceil(size / multiple) * multiple - size``.

    The ceiling form keeps symbolic sizes simple: after the pad the size is ``(size + multiple - 1) // multiple
    * multiple``, where Swin's own ``(multiple - size % multiple) % multiple`` nests a remainder in each
    stage's sizes, and sympy then spends minutes simplifying them.

    >>> [padding_to_multiple(size, 4) for size in (4, 5, 7, 8)]
    [0, 3, 1, 0]
    """
    return (size + multiple - 1) // multiple * multiple - size


def padded_to_length(hidden_states: torch.Tensor, length: Any) -> torch.Tensor:
    """``hidden_states`` (batch, time, width) padded with zeros at the end of time up to ``length`` frames.

    >>> padded_to_length(torch.ones(1, 2, 1), 3).flatten().tolist()
    [1.0, 1.0, 0.0]
    >>> padded_to_length(torch.ones(1, 3, 1), 3).shape
    torch.Size([1, 3, 1])
    """
    return torch.nn.functional.pad(hidden_states, (0, 0, 0, length - hidden_states.shape[1]))


def _upsampled_to_input_length(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` of a SEW-style encoder whose ``upsample`` output is padded up to the input's frame count."""

    first = list(inspect.signature(forward).parameters)[1]  # the encoder's input, after ``self``

    @functools.wraps(forward)
    def wrapper(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        frames = (args[0] if args else kwargs[first]).shape[1]
        upsample = self.upsample
        with swap_attr(upsample, "forward", lambda states: padded_to_length(type(upsample).forward(upsample, states),
                                                                           frames)):
            return forward(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def patch_upsampled_to_input_length(model: torch.nn.Module) -> Iterator[None]:
    """Pad a squeezing encoder's upsampled output to its input's length at every length, in the block.

    Model pattern: an encoder that pools time by ``squeeze_factor``, upsamples back and pads
    ``if hidden_states.shape[1] < n_input_timesteps`` (SEW, SEW-D in transformers 5.22-5.24): the pad
    is taken at frame counts the factor does not divide. Within the block the upsampled output is
    padded to the input's frame count by ``frames - upsampled``, zero where it divides, so the
    model's own test is false at every size and the frame count stays dynamic. A no-op for other
    models. Delete when transformers pads without the test.

    Args:
        model: the model to export; only its encoder classes with the pattern are patched.
    """
    encoders = {type(m) for m in model.modules()
                if hasattr(m, "upsample") and source_contains(type(m).forward, _SHORT_UPSAMPLE)}
    with contextlib.ExitStack() as stack:
        for owner in encoders:
            stack.enter_context(swap_attr(owner, "forward", _upsampled_to_input_length(owner.forward)))
        yield


def merge_padded(self: Any, input_feature: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
    """Swin's patch-merging pad of a (batch, height, width, channels) map to even sides, taken at every size.

    >>> merge_padded(None, torch.ones(1, 3, 2, 1), 3, 2).shape
    torch.Size([1, 4, 2, 1])
    """
    return torch.nn.functional.pad(input_feature, (0, 0, 0, padding_to_multiple(width, 2), 0,
                                                   padding_to_multiple(height, 2)))


def padded_to_patches(self: Any, pixel_values: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
    """Swin's patch-embedding pad of ``pixel_values`` to a multiple of the patch size, taken at every size.

    >>> class Embed: patch_size = (4, 4)
    >>> padded_to_patches(Embed(), torch.ones(1, 3, 6, 8), 6, 8).shape
    torch.Size([1, 3, 8, 8])
    """
    rows, columns = self.patch_size
    return torch.nn.functional.pad(pixel_values, (0, padding_to_multiple(width, columns), 0,
                                                  padding_to_multiple(height, rows)))


def window_padded(self: Any, hidden_states: torch.Tensor, height: Any, width: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """Swin's window pad of a (batch, height, width, channels) map to a multiple of the window, and its pad values.

    The same values as Swin's ``maybe_pad`` in the ceiling form (``padding_to_multiple``). The
    layer still crops its windows back only where ``pad_values[3] > 0 or pad_values[5] > 0``: a
    branch on the size that hfx narrows the dims by (a crop taken at every size would need a copy
    torch decides from the traced sizes alone).

    >>> class Layer: window_size = 4
    >>> states, values = window_padded(Layer(), torch.ones(1, 6, 8, 1), 6, 8)
    >>> states.shape, values
    (torch.Size([1, 8, 8, 1]), (0, 0, 0, 0, 0, 2))
    """
    right, bottom = padding_to_multiple(width, self.window_size), padding_to_multiple(height, self.window_size)
    values = (0, 0, 0, right, 0, bottom)
    return torch.nn.functional.pad(hidden_states, values), values


@contextlib.contextmanager
def patch_unconditional_swin_pads(model: torch.nn.Module) -> Iterator[None]:
    """Take Swin's patch-embedding and patch-merging pads at every image size, and pad its windows in a form
    sympy keeps small, in the block.

    Model pattern: ``maybe_pad`` of Swin's patch embedding (``if width % self.patch_size[1] != 0``)
    and patch merging (``if (height % 2 == 1) or (width % 2 == 1)``), each padding by an amount it
    computes anyway (zero when the size divides): within the block they pad by it at every size,
    so these two are no longer branches on the image size. And the layer's window pad
    (``pad_right = (self.window_size - width % self.window_size) % self.window_size``), which nests a
    remainder in every later stage's sizes: torch.export of a generated Swin spent over 390 s in
    sympy on them; in the ceiling form (``padding_to_multiple``), 45 s. Swin, Swin v2, Donut-Swin,
    MaskFormer-Swin, Swin2SR, CLAP's audio Swin and their users in transformers 5.22-5.24. A no-op
    for other models. Delete when transformers pads without the tests and in the ceiling form.

    Args:
        model: the model to export; only the classes with the pattern are patched.
    """
    classes = {type(m) for m in model.modules()}
    replacements = {_ODD_MERGE: merge_padded, _PATCH_REMAINDER: padded_to_patches, _WINDOW_REMAINDER: window_padded}
    with contextlib.ExitStack() as stack:
        for pattern, replacement in replacements.items():
            for owner in classes:
                if source_contains(getattr(owner, "maybe_pad", None), pattern):
                    stack.enter_context(swap_attr(owner, "maybe_pad", replacement))
        yield
