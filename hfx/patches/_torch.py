"""Patches of torch functions, active only while a model is exported."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr


def _zero_fully_masked_rows(sdpa: Any) -> Any:
    """Wrap ``sdpa`` so a query row whose bool mask hides every key gives zeros."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if attn_mask is None or attn_mask.dtype != torch.bool:
            return sdpa(query, key, value, attn_mask, *args, **kwargs)
        attends = attn_mask.any(dim=-1, keepdim=True)
        out = sdpa(query, key, value, attn_mask | ~attends, *args, **kwargs)
        return out * attends.to(out.dtype)

    scaled_dot_product_attention.__wrapped__ = sdpa
    return scaled_dot_product_attention


@contextlib.contextmanager
def patch_sdpa_fully_masked_rows() -> Iterator[None]:
    """Make padded (fully masked) query rows of a bool-mask SDPA come out as zeros on every runtime.

    Eager torch returns 0 for a query row whose boolean mask hides every key
    (left padding). ONNX returns the mean of the values there, because
    onnxscript fills masked positions with the lowest finite float
    (microsoft/onnxscript#2654, for #2561), and OpenVINO returns NaN
    (openvinotoolkit/openvino#31630). Unmasking those rows and zeroing their
    output reproduces eager exactly. Delete once onnxscript and OpenVINO
    return zeros for fully masked rows.
    """
    import torch.nn.functional as F

    with swap_attr(F, "scaled_dot_product_attention", _zero_fully_masked_rows(F.scaled_dot_product_attention)):
        yield


def _even_chunks(chunk: Any) -> Any:
    """Wrap ``chunk`` so that a symbolic size known to be a multiple of ``chunks`` is split in equal named sizes."""

    def chunked(self: torch.Tensor, chunks: int, dim: int = 0) -> tuple[torch.Tensor, ...]:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        size = self.shape[dim]
        if isinstance(size, torch.SymInt) and isinstance(chunks, int) and chunks > 0 and statically_known_true(
                size % chunks == 0):
            return tuple(self.split([size // chunks] * chunks, dim))
        return chunk(self, chunks, dim)

    chunked.__wrapped__ = chunk
    return chunked


@contextlib.contextmanager
def patch_even_chunks() -> Iterator[None]:
    """Chunk a dynamic dim that is a known multiple of the chunk count into equal sizes torch need not prove.

    Model pattern: ProphetNet's n-gram streams, ``hidden_states.chunk(1 + ngram, dim=1)``
    on a ``(1 + ngram) * sequence`` axis. ``chunk`` computes the piece size
    ``ceil(4*s / 4) = s`` and then splits by it, which guards the count of pieces:
    ``((4*s - 1) // s) == 3``. That holds for every ``s >= 1``, but torch cannot
    prove it and specialises ``sequence`` to the traced length. When the size is
    a symbolic multiple of ``chunks`` (``statically_known_true``), the patch
    splits into ``chunks`` pieces of ``size // chunks`` instead, the same tensors
    (their sum is the size, which torch sees at once); any other call is
    ``chunk`` itself. Delete when torch proves the piece count of ``chunk``.
    """
    with swap_attr(torch.Tensor, "chunk", _even_chunks(torch.Tensor.chunk)), \
            swap_attr(torch, "chunk", _even_chunks(torch.chunk)):
        yield


def _to_unless_unchanged(to: Any) -> Any:
    """Wrap ``Module.to`` so that a call that would change no parameter or buffer returns the module itself."""

    def module_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)  # noqa: SLF001 - Module.to's own parser
        tensors = [*self.parameters(), *self.buffers()]
        unchanged = memory_format is None and all(
            (device is None or t.device == device) and (dtype is None or not t.is_floating_point() or t.dtype == dtype)
            for t in tensors)
        return self if unchanged else to(self, *args, **kwargs)

    module_to.__wrapped__ = to
    return module_to


@contextlib.contextmanager
def patch_module_to_in_forward() -> Iterator[None]:
    """Let a forward cast a submodule to the dtype it already has.

    Model pattern: Switch Transformers' and NLLB-MoE's routers run
    ``self.classifier = self.classifier.to(self.dtype)`` in their forward
    (transformers 5.22-5.24). Under ``torch.export`` the parameters are
    functional tensors, and ``Module._apply`` cannot swap them ("_apply():
    Couldn't swap Linear.weight"), although the cast changes nothing. Within
    the block, a ``to`` that would change no parameter or buffer (same device,
    same floating dtype, no memory format) returns the module as it is, which
    is what eager's ``to`` gives back too; any other ``to`` is ``Module.to``.
    Delete when ``Module.to`` is a no-op under export for an unchanged dtype.
    """
    with swap_attr(torch.nn.Module, "to", _to_unless_unchanged(torch.nn.Module.to)):
        yield
