"""EnCodec-style padded convolutions whose padding sizes are Python ints, not 0-d tensor buffers.

EnCodec, Mimi and Pocket TTS's audio tokenizer (transformers 5.22-5.24) keep each padded
convolution's ``stride``, ``kernel_size`` and ``padding_total`` as 0-d int64 buffers (Mimi and Pocket
TTS also ``padding_left`` / ``padding_right`` tensors) and compute the right padding with tensor
arithmetic and ``torch.ceil``. A pad size is then a tensor's value: torch.export fails with "Could not
guard on data-dependent expression Eq(u0, 1)" at ``nn.functional.pad``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr

_PATTERN = "n_frames = (length - self.kernel_size + self.padding_total) / self.stride + 1"
_SIZES = ("stride", "kernel_size", "padding_total", "padding_left", "padding_right")


def extra_padding(self: Any, hidden_states: torch.Tensor) -> int | torch.SymInt:
    """The right padding that makes the last window of ``self``'s convolution whole, in integer arithmetic.

    EnCodec's ``ceil((length - kernel + padding) / stride + 1) - 1`` windows, with ``ceil(a / b)`` as
    ``(a + b - 1) // b``, of the same sizes as ints: a non-negative numerator wherever the input is
    at least a window long, since ONNX Runtime and OpenVINO divide integers toward zero.

    >>> class Conv: stride, kernel_size, padding_total = 2, 4, 2
    >>> [extra_padding(Conv(), torch.zeros(1, 1, n)) for n in (4, 5, 6)]
    [0, 1, 0]
    """
    length = hidden_states.shape[-1]
    frames = (length - self.kernel_size + self.padding_total + self.stride - 1) // self.stride
    return frames * self.stride + self.kernel_size - self.padding_total - length


def _sizes_as_ints(module: torch.nn.Module) -> dict[str, int]:
    """``module``'s padding sizes that are 0-d integer tensors (buffers or attributes), as ints."""
    values = {name: getattr(module, name, None) for name in _SIZES}
    return {name: int(value) for name, value in values.items()
            if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point()}


@contextlib.contextmanager
def _ints_in_place_of_tensors(module: torch.nn.Module, sizes: dict[str, int]) -> Iterator[None]:
    """Inside the block ``module.<name>`` is the int of ``sizes`` (a buffer is taken out and put back)."""
    buffers = {name: module._buffers.pop(name) for name in sizes if name in module._buffers}
    attributes = {name: module.__dict__[name] for name in sizes if name in module.__dict__}
    module.__dict__.update(sizes)
    try:
        yield
    finally:
        for name in sizes:
            module.__dict__.pop(name, None)
        module.__dict__.update(attributes)
        module._buffers.update(buffers)


@contextlib.contextmanager
def patch_integer_conv_padding(model: torch.nn.Module) -> Iterator[None]:
    """Give EnCodec-style padded convolutions int padding sizes and ``extra_padding`` in the block.

    Model pattern: a convolution module whose ``_get_extra_padding_for_conv1d`` computes
    ``(length - self.kernel_size + self.padding_total) / self.stride`` on 0-d tensor buffers
    (EnCodec, Mimi, Pocket TTS's audio tokenizer, Qwen3-Omni-MoE's code2wav; transformers 5.22-5.24).
    The sizes are the buffers' own values, so the padding is eager's; the buffers are back after
    the block. A no-op for other models. Delete when transformers keeps these sizes as ints.

    Args:
        model: the model to export; its convolution modules (instances) and their classes are patched.
    """
    convs = [m for m in model.modules()
             if source_contains(vars(type(m)).get("_get_extra_padding_for_conv1d"), _PATTERN)]
    with contextlib.ExitStack() as stack:
        for owner in dict.fromkeys(type(m) for m in convs):
            stack.enter_context(swap_attr(owner, "_get_extra_padding_for_conv1d", extra_padding))
        for conv in convs:
            stack.enter_context(_ints_in_place_of_tensors(conv, _sizes_as_ints(conv)))
        yield
