"""Patches for vision towers that take every image's patches packed in one sequence (Qwen2-VL pattern)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr, swap_attr_on_each


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, *, cu_seq_lens_q: torch.Tensor, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over packed images in one call: each position attends to the positions of its own image.

    ``cu_seq_lens_q`` holds the images' boundaries (``[0, n0, n0 + n1, …]``);
    the mask it gives is block-diagonal. Fewer key/value heads than query heads
    (grouped-query attention) each serve their group, as transformers' ``repeat_kv``
    does. Returns ``[batch, sequence, heads, dim]``, as the attention functions of transformers do.

    Example:
        >>> q = torch.randn(1, 2, 5, 4)
        >>> out, _ = packed_attention(None, q, q, q, cu_seq_lens_q=torch.tensor([0, 3, 5]))
        >>> first, _ = packed_attention(None, q[:, :, :3], q[:, :, :3], q[:, :, :3], cu_seq_lens_q=torch.tensor([0, 3]))
        >>> torch.allclose(out[:, :3], first, atol=1e-6)
        True
    """
    del module, attention_mask, kwargs
    if key.shape[1] != query.shape[1]:  # grouped-query heads (EXAONE 4.5's tower): each key head serves a group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
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
# Pixtral-based ones (Mistral 3, Mistral Large 4, LightOnOCR, MiniMax-M3-VL) split the projected features with sizes
# from ``image_sizes``: ``torch.split(image_features(.squeeze(0)), split_sizes)``.
# HyperCLOVAX-Vision-V2 splits its projector's output of the packed tower: ``torch.split(image_embeds, split_sizes)``.
_PER_IMAGE_SPLITS = ("= list(image_features)", ".split(num_real_images_per_batch.tolist())",
                     "torch.split(image_features, split_sizes)", "torch.split(image_features.squeeze(0), split_sizes)",
                     "torch.split(image_embeds, split_sizes)")
# Feature methods that split their packed-image tower's output per image (Qwen2-VL, Qwen2.5-VL:
# ``torch.split(vision_outputs.pooler_output, split_sizes)``; Qwen3-VL: ``torch.split(image_embeds, split_sizes)``
# of the tower's ``pooler_output``, and each of its ``deepstack_features`` alike), the sizes from
# ``grid_thw.prod(-1).tolist()``.
_TOWER_OUTPUT_SPLITS = ("torch.split(vision_outputs.pooler_output", "torch.split(image_embeds, split_sizes",
                        "torch.split(video_embeds, split_sizes")
_FEATURE_METHODS = ("get_image_features", "get_video_features")


def _per_image_splitters(model: torch.nn.Module) -> dict[tuple[type, str], tuple[str, bool]]:
    """``{(class, feature method): (child to stop at, whether it is a projector)}`` for methods that split per image.

    A projector: the method splits the projected features; a tower: the method
    splits what its packed-image tower returns.
    """
    from hfx._capture.multimodal import projectors

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
                elif len(called) == 1 and not named and any(split in source for split in _TOWER_OUTPUT_SPLITS):
                    # the tower is the only child the method calls: its output is what gets split
                    found[(cls, method)] = (called[0], False)
    return found


class _TowerTap:
    """Stands in for a tower: its attributes are the tower's (``self.visual.dtype``), a call stops the method."""

    def __init__(self, tower: torch.nn.Module) -> None:
        self._tower = tower

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tower, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from hfx._capture.multimodal import ProjectorCall

        raise ProjectorCall(args, kwargs)


def _tower_tapped_view(owner: torch.nn.Module, tower: str) -> torch.nn.Module:
    """A shallow view of ``owner`` (shared children) whose ``tower`` is a ``_TowerTap``."""
    view = copy.copy(owner)
    view._modules = dict(owner._modules)  # noqa: SLF001
    del view._modules[tower]  # noqa: SLF001
    vars(view)[tower] = _TowerTap(getattr(owner, tower))
    return view


def _recording_towers(view: torch.nn.Module, outputs: list[Any]) -> torch.nn.Module:
    """``view`` whose child modules that return a ``ModelOutput`` (a vision tower) append it to ``outputs``.

    The children stay in the view's module table (its ``parameters()`` and ``dtype`` are the model's); the
    instance attribute that shadows each is what the method calls.
    """
    for name, module in view._modules.items():  # noqa: SLF001
        vars(view)[name] = _Recording(module, outputs)
    return view


class _Recording:
    """Stands in for a child module: its attributes are the module's, a call's ``ModelOutput`` is kept."""

    def __init__(self, module: torch.nn.Module, outputs: list[Any]) -> None:
        self._module, self._outputs = module, outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from transformers.utils import ModelOutput

        output = self._module(*args, **kwargs)
        if isinstance(output, ModelOutput):
            self._outputs.append(output)
        return output


def _joined_features(method: Any, child: str, *, projects: bool) -> Any:
    """Wrap a feature method: stop at ``child``, call it, return every image's tokens as one tensor.

    ``projects``: ``child`` is the projector. The method's tower output (what
    LLaVA, Idefics 2/3, SmolVLM and PaliGemma return, and transformers 5.24's
    forward returns as ``image_outputs``) is returned with its
    ``pooler_output`` the one-item list; a method whose children return no
    ``ModelOutput`` gets one with the projector's input as ``last_hidden_state``.
    Otherwise ``child`` is the tower, whose output is returned with its
    ``pooler_output`` in a one-item list.
    """
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from hfx._capture.multimodal import ProjectorCall, is_tapped_view, tapped_view

    def get_features(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # A FeatureEncoder's view already stops at the projector: its tap, not this one, ends the method (a
        # Qwen2.5-VL-style tower with a projector after it, HyperCLOVA X Vision v2, would otherwise return the
        # tower's output past the projector the encoder splits off).
        if child not in self._modules or is_tapped_view(self):  # noqa: SLF001
            return method(self, *args, **kwargs)
        towers: list[Any] = []
        try:
            method(_recording_towers(tapped_view(self, child), towers) if projects else _tower_tapped_view(self, child),
                   *args, **kwargs)
        except ProjectorCall as stop:
            output = getattr(self, child)(*stop.args, **stop.kwargs)
            if not projects:
                output.pooler_output = [output.pooler_output]
                if isinstance(getattr(output, "deepstack_features", None), (list, tuple)):  # Qwen3-VL
                    output.deepstack_features = [[feature] for feature in output.deepstack_features]
                return output
            joined = output.reshape(-1, output.shape[-1])
            if towers:  # as the method does: the tower's output, its pooler_output the projected features
                towers[0].pooler_output = [joined]
                return towers[0]
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


def inverse_permutation(index: torch.Tensor) -> torch.Tensor:
    """``torch.argsort(index)`` for a 1-D permutation of ``0..n-1``, as one scatter (no sort).

    Example:
        >>> inverse_permutation(torch.tensor([2, 0, 3, 1])).tolist()
        [1, 3, 0, 2]
    """
    positions = torch.arange(index.shape[0], device=index.device, dtype=index.dtype)
    return torch.zeros_like(index).scatter(0, index, positions)


class _TorchSortingPermutations:
    """``torch`` as a modeling module sees it, with ``argsort`` of a 1-D tensor taken as a permutation's inverse."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def argsort(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:  # noqa: A002 - torch's name
        if args or kwargs or input.ndim != 1:
            return torch.argsort(input, *args, **kwargs)
        return inverse_permutation(input)


# The call whose argument is always a permutation: Qwen2.5-VL-style towers undo their window order with it.
_WINDOW_ARGSORT = "torch.argsort(window_index)"
# The method that puts Qwen2.5-VL-style towers' patches (and rotary tables) in window order.
_WINDOW_PERMUTE = "permute_input_for_window_attn"


def in_window_order(self: torch.nn.Module, input_tensor: torch.Tensor, window_index: torch.Tensor,
                    seq_len: int) -> torch.Tensor:
    """``input_tensor``'s rows in window order: the ``spatial_merge_unit`` rows of each merged patch, moved by ``window_index``.

    The same values as Qwen2.5-VL's ``permute_input_for_window_attn``, as one
    row gather whose size follows ``window_index`` (``unit * windows`` rows),
    not ``seq_len // unit``.

    Example:
        >>> class Tower:
        ...     spatial_merge_unit = 2
        >>> in_window_order(Tower(), torch.arange(6)[:, None], torch.tensor([2, 0, 1]), 6).flatten().tolist()
        [4, 5, 0, 1, 2, 3]
    """
    del seq_len
    unit = self.spatial_merge_unit
    rows = (window_index[:, None] * unit + torch.arange(unit, device=window_index.device)).reshape(-1)
    return input_tensor[rows].reshape(rows.shape[0], math.prod(input_tensor.shape[1:]))


def _window_permuting_towers(model: torch.nn.Module) -> tuple[list[type], list[Any]]:
    """``(tower classes with the window-order method, their modeling modules whose only argsort undoes it)``."""
    classes, namespaces = [], []
    for cls in {type(module) for module in model.modules()}:
        forward = vars(cls).get("forward")
        if forward is None or _WINDOW_PERMUTE not in vars(cls):
            continue
        classes.append(cls)
        namespace = sys.modules[cls.__module__]
        with contextlib.suppress(OSError, TypeError):
            if (_WINDOW_ARGSORT in inspect.getsource(forward) and inspect.getsource(namespace).count("argsort(") == 1
                    and namespace not in namespaces):
                namespaces.append(namespace)
    return classes, namespaces


@contextlib.contextmanager
def patch_window_permutation(model: torch.nn.Module) -> Iterator[None]:
    """Put a windowed vision tower's patches in window order and back in a graph ExecuTorch can plan and run.

    Qwen2.5-VL's tower (transformers 5.x, ``modeling_qwen2_5_vl.py``) reorders
    its patches into attention windows with ``permute_input_for_window_attn``
    (``reshape(seq_len // unit, unit, -1)[window_index].reshape(seq_len, -1)``)
    and restores the order with ``torch.argsort(window_index)``. Traced, the
    first gives sizes like ``windows * (patches // (patches // 4))``, which
    ExecuTorch's memory planning cannot bound: it plans the trace size and the
    runtime fails on more patches ("Attempted to resize a bounded tensor",
    0x12). ExecuTorch 1.5.1 has no sort kernel (``OperatorMissing``, 0x14 at
    load). Within the block the method is ``in_window_order`` (sizes from
    ``window_index``'s length), and the modeling modules whose only
    ``argsort`` is that call see a ``torch`` whose 1-D ``argsort`` is
    ``inverse_permutation`` (``window_index`` is a permutation, see
    ``get_vision_window_index``): the same values on every runtime. Delete when
    ExecuTorch ships a sort kernel and transformers sizes the reshape by ``-1``.
    """
    classes, namespaces = _window_permuting_towers(model)
    with swap_attr_on_each(classes, _WINDOW_PERMUTE, in_window_order), \
            swap_attr_on_each(namespaces, "torch", _TorchSortingPermutations()):
        yield
