"""Patches for single architectures of the zoo, each naming the model pattern it works around.

Each patch is a context-manager factory bound to the model (``functools.partial(patch, model)``) and a
no-op for a model without the pattern. All are process-global while active: do not run exports
concurrently in threads.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from hfx.patches._core import Patch, swap_attr_on_each


def always_interpolated_positions(self: torch.nn.Module, embeddings: torch.Tensor, height: int,
                                  width: int) -> torch.Tensor:
    """Position embeddings (class token first) resampled bicubically to the ``height x width`` patch grid.

    The same computation as DINOv2's ``interpolate_pos_encoding`` without its early return; at the
    trained size the bicubic resampling (``align_corners=False``, scale 1) is exactly the identity.
    """
    del embeddings
    positions = self.position_embeddings
    grid = positions[:, 1:]
    side = int(grid.shape[1] ** 0.5)
    patch_height, patch_width = self.patch_embeddings.patch_size
    grid = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    # Resample in float32 like transformers: bicubic in half precision shifts the embeddings.
    grid = F.interpolate(grid.to(torch.float32), size=(height // patch_height, width // patch_width),
                         mode="bicubic", align_corners=False).to(positions.dtype)
    return torch.cat((positions[:, :1], grid.permute(0, 2, 3, 1).flatten(1, 2)), dim=1)


def _interpolating_embedding_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The DINOv2-style embedding classes in ``model``: an ``interpolate_pos_encoding`` with a shortcut."""
    from transformers.models.dinov2 import modeling_dinov2

    known = (modeling_dinov2.Dinov2Embeddings,)
    return tuple({type(m) for m in model.modules() if isinstance(m, known)})


def is_interpolating_vision_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` has DINOv2-style embeddings that skip the interpolation at the trained size."""
    return bool(_interpolating_embedding_classes(model))


@contextlib.contextmanager
def patch_position_interpolation(model: torch.nn.Module) -> Iterator[None]:
    """Make DINOv2's position-embedding interpolation take any image size in one exported graph.

    ``Dinov2Embeddings.interpolate_pos_encoding`` (transformers 5.x, ``modeling_dinov2.py``,
    ``if not torch.jit.is_tracing() and num_patches == num_positions and height == width: return
    self.position_embeddings``) returns early at the trained image size. ``torch.export`` is not
    ``torch.jit`` tracing, so it records ``height == width == image_size`` as guards and the
    image axes become static: a 48 px image then fails on a program captured at 32 px. The patch
    always interpolates (exactly the identity at the trained size). A no-op for a model without
    such embeddings. Delete when transformers skips that shortcut under ``torch.export``
    (``is_torchdynamo_compiling()``) too.

    Args:
        model: the model to export; only the embedding classes it uses are patched.
    """
    with swap_attr_on_each(_interpolating_embedding_classes(model), "interpolate_pos_encoding",
                           always_interpolated_positions):
        yield


def arch_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the architecture patches for ``model``, bound to it (each a no-op where its pattern is absent).

    Args:
        model: the model to export.

    Returns:
        ``patch_position_interpolation`` bound to ``model``.

    Example:
        >>> [p.func.__name__ for p in arch_patches(torch.nn.Linear(1, 1))]
        ['patch_position_interpolation']
    """
    return (functools.partial(patch_position_interpolation, model),)
