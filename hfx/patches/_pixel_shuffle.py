"""InternVL-style pixel shuffle of the vision features with integer sizes.

InternVL and Qianfan-OCR (``pixel_shuffle(self, vision_features, scale_factor=0.5)``, transformers
5.22-5.24) size their views with ``int(height * scale_factor)`` and check ``height % scale_factor``:
float arithmetic on a symbolic size, which torch.export cannot range ("Invalid ranges
[0.500000000000000:-0.500000000000000]").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr


def _integer_pixel_shuffle(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``original`` (a ``pixel_shuffle`` method) with ``1 / scale_factor`` as an integer ratio, where it is one."""

    @functools.wraps(original)
    def pixel_shuffle(self: Any, vision_features: torch.Tensor, scale_factor: float = 0.5) -> torch.Tensor:
        ratio = round(1 / scale_factor)
        if ratio < 1 or ratio * scale_factor != 1:
            return original(self, vision_features, scale_factor)
        batch_size, width, height, channels = vision_features.size()
        # the same views: int(height * scale_factor) is height // ratio, int(channels / scale_factor) channels * ratio
        features = vision_features.view(batch_size, width, height // ratio, channels * ratio)
        features = features.permute(0, 2, 1, 3).contiguous()
        features = features.view(batch_size, height // ratio, width // ratio, channels * ratio * ratio)
        return features.permute(0, 2, 1, 3).contiguous()

    return pixel_shuffle


@contextlib.contextmanager
def patch_integer_pixel_shuffle(model: torch.nn.Module) -> Iterator[None]:
    """Run InternVL-style ``pixel_shuffle`` methods with integer view sizes for the length of the block.

    Model pattern: ``pixel_shuffle`` sizing ``view`` with ``int(height * scale_factor)`` (InternVL,
    Qianfan-OCR, transformers 5.22-5.24). Where ``1 / scale_factor`` is an integer the same views take
    ``height // ratio`` and ``channels * ratio``, which torch.export keeps symbolic; a size the ratio does
    not divide fails in the view, as transformers' own check fails it. Other factors run transformers'
    method. A no-op for other models. Delete when transformers sizes the views with integers.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = {type(m) for m in model.modules()
              if source_contains(getattr(type(m), "pixel_shuffle", None), "int(height * scale_factor)")}
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(swap_attr(owner, "pixel_shuffle", _integer_pixel_shuffle(owner.pixel_shuffle)))
        yield
