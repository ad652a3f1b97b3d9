"""Patches for vision towers that take every image's patches packed in one sequence (Qwen2-VL pattern)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, *, cu_seq_lens_q: torch.Tensor, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over packed images in one call: each position attends to the positions of its own image.

    ``cu_seq_lens_q`` holds the images' boundaries (``[0, n0, n0 + n1, …]``);
    the mask it gives is block-diagonal. Returns ``[batch, sequence, heads, dim]``,
    as the attention functions of transformers do.

    Example:
        >>> q = torch.randn(1, 2, 5, 4)
        >>> out, _ = packed_attention(None, q, q, q, cu_seq_lens_q=torch.tensor([0, 3, 5]))
        >>> first, _ = packed_attention(None, q[:, :, :3], q[:, :, :3], q[:, :, :3], cu_seq_lens_q=torch.tensor([0, 3]))
        >>> torch.allclose(out[:, :3], first, atol=1e-6)
        True
    """
    del module, attention_mask, kwargs
    position = torch.arange(query.shape[2], device=query.device)
    # Compared with every boundary, 0 included: the boundary count is >= 2, so broadcasting never asks whether it is 1.
    image = (position[:, None] >= cu_seq_lens_q[None, :]).sum(-1)
    same_image = image[:, None] == image[None, :]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=same_image[None, None], scale=scaling)
    return out.transpose(1, 2).contiguous(), None


class _PackedWhereBounded:
    """Stands in for ``ALL_ATTENTION_FUNCTIONS``: packed attention for calls that pass image boundaries."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def get_interface(self, implementation: str, default: Any) -> Any:
        """The registry's function, with calls that pass ``cu_seq_lens_q`` sent to ``packed_attention``."""
        inner = self.registry.get_interface(implementation, default)

        def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if kwargs.get("cu_seq_lens_q") is not None:
                return packed_attention(module, query, key, value, attention_mask, **kwargs)
            return inner(module, query, key, value, attention_mask, **kwargs)

        return attention

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)


def _packed_towers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Submodules whose forward derives packed-image boundaries with ``get_vision_attention_seqlens``."""
    found, seen = [], set()
    for module in model.modules():
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        namespace = vars(sys.modules[cls.__module__])
        if "get_vision_attention_seqlens" not in namespace or "forward" not in vars(cls):
            continue
        with contextlib.suppress(OSError, TypeError):
            if "get_vision_attention_seqlens(" in inspect.getsource(cls.forward):
                found.extend(m for m in model.modules() if type(m) is cls)
    return found


@contextlib.contextmanager
def patch_packed_vision_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run the attention of packed-image vision towers as one masked call instead of a Python loop over images.

    Qwen2-VL-style towers (``get_vision_attention_seqlens``; Qwen2-VL,
    Qwen2.5-VL …) split the packed sequence per image with
    ``torch.split(…, lengths.tolist())`` unless flash attention is requested,
    which fixes the number and sizes of images in a graph. Within the block,
    their modeling module sees flash attention requested for the towers'
    configs only, and the flash call (which carries ``cu_seq_lens_q``) runs
    ``packed_attention``: sdpa with a block-diagonal mask, the same result for
    any images. Other attention calls are unchanged.
    """
    towers = _packed_towers(model)
    configs = {id(tower.config) for tower in towers if hasattr(tower, "config")}
    namespaces = {sys.modules[type(tower).__module__] for tower in towers}
    with contextlib.ExitStack() as stack:
        for namespace in namespaces:
            requested = vars(namespace).get("is_flash_attention_requested")
            registry = vars(namespace).get("ALL_ATTENTION_FUNCTIONS")
            if requested is None or registry is None:
                continue

            def flash_for_towers(config: Any = None, *args: Any, _original: Any = requested, **kwargs: Any) -> bool:
                return id(config) in configs or _original(config, *args, **kwargs)

            stack.enter_context(swap_attr(namespace, "is_flash_attention_requested", flash_for_towers))
            stack.enter_context(swap_attr(namespace, "ALL_ATTENTION_FUNCTIONS", _PackedWhereBounded(registry)))
        yield


def _patchwise(forward: Any) -> Any:
    """Wrap ``Conv3d.forward``: a kernel that covers the whole input, stride = kernel, is one matmul per patch."""

    def conv3d_forward(self: torch.nn.Conv3d, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        covers = tuple(input.shape[-3:]) == tuple(self.kernel_size) == tuple(self.stride)
        plain = self.groups == 1 and set(self.dilation) == {1} and self.padding in ((0, 0, 0), "valid")
        if not (covers and plain):
            return forward(self, input)
        flat = input.reshape(input.shape[0], -1)
        out = torch.nn.functional.linear(flat, self.weight.reshape(self.out_channels, -1), self.bias)
        return out.reshape(input.shape[0], self.out_channels, 1, 1, 1)

    conv3d_forward.__wrapped__ = forward  # type: ignore[attr-defined]
    return conv3d_forward


@contextlib.contextmanager
def patch_conv3d_patch_embedding() -> Iterator[None]:
    """Run a ``Conv3d`` whose kernel covers its whole input (a video-patch embedding) as a linear layer.

    Qwen2-VL-style towers embed each ``(t, p, p)`` patch with a ``Conv3d``
    whose kernel and stride equal the patch. ExecuTorch 1.5.1's portable
    convolution takes 3-D or 4-D inputs only (``op_convolution.cpp``: "Expect
    input tensor to be 3-D or 4-D, but got, 5"), and XNNPACK has no 3-D
    convolution; as one matmul per patch the graph runs everywhere, with the
    same values. Other convolutions are unchanged.
    """
    with swap_attr(torch.nn.Conv3d, "forward", _patchwise(torch.nn.Conv3d.forward)):
        yield



# Feature methods that split the projected features per image in Python, sized by the batch
# (LLaVA's ``list(image_features)``, Idefics 2/3 and SmolVLM's ``split(num_real_images_per_batch.tolist())``).
_PER_IMAGE_SPLITS = ("= list(image_features)", ".split(num_real_images_per_batch.tolist())")
# Feature methods that split their packed-image tower's output per image (Qwen2-VL, Qwen2.5-VL:
# ``torch.split(vision_outputs.pooler_output, split_sizes)``, the sizes from ``grid_thw.prod(-1).tolist()``).
_TOWER_OUTPUT_SPLITS = ("torch.split(vision_outputs.pooler_output",)
_FEATURE_METHODS = ("get_image_features", "get_video_features")


def _per_image_splitters(model: torch.nn.Module) -> dict[tuple[type, str], tuple[str, bool]]:
    """``{(class, feature method): (child to stop at, whether it is a projector)}`` for methods that split per image.

    A projector: the method splits the projected features; a tower: the method
    splits what its packed-image tower returns.
    """
    from hfx._multimodal import projectors

    found = {}
    for module in model.modules():
        cls = type(module)
        for method in _FEATURE_METHODS:
            function = vars(cls).get(method)
            if (cls, method) in found or function is None:
                continue
            with contextlib.suppress(OSError, TypeError):
                source = inspect.getsource(function)
                named = [name for name in projectors(module) if f"self.{name}(" in source]
                called = [name for name in module._modules if f"self.{name}(" in source]  # noqa: SLF001
                if method == "get_image_features" and named and any(split in source for split in _PER_IMAGE_SPLITS):
                    found[(cls, method)] = (named[0], True)
                elif called and any(split in source for split in _TOWER_OUTPUT_SPLITS):
                    found[(cls, method)] = (called[0], False)
    return found


class _TowerTap:
    """Stands in for a tower: its attributes are the tower's (``self.visual.dtype``), a call stops the method."""

    def __init__(self, tower: torch.nn.Module) -> None:
        self._tower = tower

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tower, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from hfx._multimodal import ProjectorCall

        raise ProjectorCall(args, kwargs)


def _tower_tapped_view(owner: torch.nn.Module, tower: str) -> torch.nn.Module:
    """A shallow view of ``owner`` (shared children) whose ``tower`` is a ``_TowerTap``."""
    view = copy.copy(owner)
    view._modules = dict(owner._modules)  # noqa: SLF001
    del view._modules[tower]  # noqa: SLF001
    vars(view)[tower] = _TowerTap(getattr(owner, tower))
    return view


def _joined_features(method: Any, child: str, *, projects: bool) -> Any:
    """Wrap a feature method: stop at ``child``, call it, return every image's tokens as one tensor.

    ``projects``: ``child`` is the projector (the output's ``last_hidden_state``
    is its input); otherwise it is the tower, whose output is returned with
    its ``pooler_output`` in a one-item list.
    """
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from hfx._multimodal import ProjectorCall, tapped_view

    def get_features(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if child not in self._modules:  # noqa: SLF001 - a FeatureEncoder's view, already stopping at the projector
            return method(self, *args, **kwargs)
        try:
            method(tapped_view(self, child) if projects else _tower_tapped_view(self, child), *args, **kwargs)
        except ProjectorCall as stop:
            output = getattr(self, child)(*stop.args, **stop.kwargs)
            if not projects:
                output.pooler_output = [output.pooler_output]
                return output
            joined = output.reshape(-1, output.shape[-1])
            return BaseModelOutputWithPooling(last_hidden_state=stop.features, pooler_output=[joined])
        msg = f"{type(self).__name__}.{method.__name__} returned without calling {child!r}"
        raise RuntimeError(msg)

    get_features.__wrapped__ = method  # type: ignore[attr-defined]
    return get_features


@contextlib.contextmanager
def patch_per_image_feature_split(model: torch.nn.Module) -> Iterator[None]:
    """Keep a per-image split of the image features from fixing the batch in a whole-model graph.

    ``get_image_features`` of LLaVA (``image_features = list(image_features)``)
    and of Idefics 2/3 and SmolVLM (``image_features.split(
    num_real_images_per_batch.tolist())``, transformers 5.x) returns one tensor
    per image (per prompt), a Python list sized by the batch: traced as part
    of the whole forward, the batch and image count become static. Qwen2-VL
    and Qwen2.5-VL's ``get_image_features`` / ``get_video_features`` split
    their tower's packed output with ``torch.split(…, split_sizes)``, sizes
    from ``grid_thw.prod(-1).tolist()``: data-dependent, no graph holds it.
    Their only reader, the model's ``forward``, joins the list with
    ``torch.cat(…, dim=0)``. Within the block, such a method runs up to its
    projector (or tower) through a tapped view, as ``FeatureEncoder`` does,
    calls it, and returns a one-item list holding every image's tokens joined
    (``pooler_output``; for a projector, ``last_hidden_state`` is its input):
    the same tensor the forward merges, for any batch, image count and size.
    Delete when transformers keeps the features as one tensor.
    """
    with contextlib.ExitStack() as stack:
        for (cls, method), (child, projects) in _per_image_splitters(model).items():
            wrapped = _joined_features(vars(cls)[method], child, projects=projects)
            stack.enter_context(swap_attr(cls, method, wrapped))
        yield
