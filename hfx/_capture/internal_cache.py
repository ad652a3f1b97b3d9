"""A decoder LM whose KV cache lives in its own buffers: ``forward(tokens, input_pos) -> logits``.

This is the program ExecuTorch's LLM runner (``TextLLMRunner``, the C++
``llama_main``, the Android and iOS apps) runs: one method for the prompt and
every step (1..N new tokens at ``input_pos[0]``), the cache written in place,
only the logits returned. ``decompose(internal_cache_length=N)`` builds it
around the user's model, which it holds but never changes: the buffers belong
to the wrapper, and each call builds a transformers ``Cache`` over them.

With ``custom_ops`` the cache writes are ExecuTorch's in-place
``llama::update_cache`` and the attention is its ``llama::custom_sdpa``
(causal from the start position, no mask tensor): the attention function is
swapped in transformers' attention interface for the length of the call only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

# Keyword arguments of an attention call that custom_sdpa cannot honour; such a layer keeps the model's attention.
_UNSUPPORTED_ATTENTION = ("sliding_window", "softcap", "s_aux", "sinks")


@functools.cache
def _positioned_layer(base: type) -> type:
    """A ``StaticLayer`` subclass over given buffers that writes the call's tokens at ``input_pos``, not at a counter."""

    class PositionedLayer(base):
        """One layer's keys and values: ``[1, heads, length, dim]``, or ``[1, length, heads, dim]`` for ExecuTorch's ops."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: Any, positions: torch.Tensor, *,
                     custom_ops: bool) -> None:
            # start: the first position as an int (a SymInt at export), which ExecuTorch's ops take.
            super().__init__(max_cache_len=int(keys.shape[1 if custom_ops else 2]))
            self.buffers, self.start, self.positions, self.custom_ops = (keys, values), start, positions, custom_ops
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            # The mask's query offset: transformers reads it from here (a tensor, as a StaticLayer has it).
            self.cumulative_length = positions[0]
            self.returned: tuple[torch.Tensor, torch.Tensor] | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # noqa: ARG002
            keys, values = self.buffers
            if self.custom_ops:
                torch.ops.llama.update_cache(key_states.transpose(1, 2), keys, self.start)
                torch.ops.llama.update_cache(value_states.transpose(1, 2), values, self.start)
                self.returned = (keys.transpose(1, 2), values.transpose(1, 2))
            else:
                keys.index_copy_(2, self.positions, key_states)
                values.index_copy_(2, self.positions, value_states)
                self.returned = (keys, values)
            return self.returned

    return PositionedLayer


def _custom_attention(cache: Any, fallback: Any, module: Any, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``llama::custom_sdpa`` over a layer's cache buffers; the model's own attention for anything else.

    Only keys that are exactly what the layer's ``update`` returned are the
    cache (a model that changes them after the update, or cross-attention, gets
    ``fallback``), and only a plain causal layer can drop its mask.
    """
    index = getattr(module, "layer_idx", None)
    layer = cache.layers[index] if isinstance(index, int) and index < len(cache.layers) else None
    plain = not any(kwargs.get(name) is not None for name in _UNSUPPORTED_ATTENTION) and dropout == 0.0
    plain = plain and getattr(module, "is_causal", True) and getattr(module, "sliding_window", None) is None
    if layer is None or layer.returned is None or key is not layer.returned[0] or value is not layer.returned[1] or not plain:
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    keys, values = layer.buffers
    output = torch.ops.llama.custom_sdpa(query.transpose(1, 2), keys, values, layer.start, None, 0.0, True, scaling)
    return output, None


@contextlib.contextmanager
def patch_custom_attention(cache: Any, implementation: str) -> Iterator[None]:
    """Route transformers' ``implementation`` attention through ``llama::custom_sdpa`` for one call over ``cache``.

    The swap is in the interface's local mapping (transformers' own per-instance
    override, read before the class-wide one), put back on exit; nothing is
    registered. Not an upstream workaround: ExecuTorch's fused kernel for the
    runner's program.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hfx.patches import swap_item

    fallback = ALL_ATTENTION_FUNCTIONS.get(implementation, sdpa_attention_forward)
    with swap_item(ALL_ATTENTION_FUNCTIONS._local_mapping, implementation,  # noqa: SLF001 - the interface's own override slot
                   functools.partial(_custom_attention, cache, fallback)):
        yield


class InternalCacheLM(torch.nn.Module):
    """``model`` with a static KV cache in buffers: ``forward(tokens [1, n], input_pos [1]) -> logits [1, 1, vocab]``.

    ``input_pos[0]`` is where the ``n`` tokens go (0 for the prompt); the
    logits are the last token's. The cache is not reset between calls: every
    call writes its positions and attends to positions ``<= its own``, so a
    new prompt at 0 overwrites what it reads.
    """

    def __init__(self, model: torch.nn.Module, layers: list[tuple[int, int, torch.dtype]], length: int, *,
                 custom_ops: bool) -> None:
        super().__init__()
        self.model, self.length, self.custom_ops, self.layer_count = model, length, custom_ops, len(layers)
        for index, (heads, dim, dtype) in enumerate(layers):
            shape = (1, length, heads, dim) if custom_ops else (1, heads, length, dim)
            self.register_buffer(f"keys_{index}", torch.zeros(shape, dtype=dtype), persistent=False)
            self.register_buffer(f"values_{index}", torch.zeros(shape, dtype=dtype), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """The logits of the last of ``tokens``, written into the cache at ``input_pos[0]`` onwards."""
        from transformers.cache_utils import Cache, StaticLayer

        count = tokens.shape[1]
        positions = torch.arange(count, device=tokens.device) + input_pos[0]
        start: Any = None
        if self.custom_ops:
            start = input_pos[0].item()
            torch._check(start >= 0)
            torch._check(start + count <= self.length)
        layer = _positioned_layer(StaticLayer)
        cache = Cache(layers=[
            layer(getattr(self, f"keys_{i}"), getattr(self, f"values_{i}"), start, positions, custom_ops=self.custom_ops)
            for i in range(self.layer_count)
        ])
        implementation = getattr(self.model.config, "_attn_implementation", None) or "sdpa"
        with patch_custom_attention(cache, implementation) if self.custom_ops else contextlib.nullcontext():
            outputs = self.model(input_ids=tokens, position_ids=positions[None], past_key_values=cache, use_cache=True,
                                 logits_to_keep=1)
        return outputs.logits


def cache_layers(model: torch.nn.Module, tokens: torch.Tensor) -> list[tuple[int, int, torch.dtype]]:
    """Each layer's ``(kv heads, head dim, dtype)``, read from one eager step; ``ValueError`` for other cache layers.

    Only full-attention layers fit one static buffer the runner writes at any
    position: a sliding window, a linear-attention or SSM state does not.
    """
    from transformers.cache_utils import DynamicLayer

    with torch.no_grad():
        cache = model(input_ids=tokens[:1, :1], use_cache=True).past_key_values
    layers = getattr(cache, "layers", None)
    kinds = sorted({type(layer).__name__ for layer in layers or () if type(layer) is not DynamicLayer})
    if not layers or kinds:
        what = f"cache layers {kinds}" if kinds else f"a {type(cache).__name__}"
        msg = (f"decompose(internal_cache_length=...): {type(model).__name__} keeps {what}; a cache in buffers holds "
               "full-attention layers only (no sliding window, linear attention or SSM state)")
        raise ValueError(msg)
    return [(int(layer.keys.shape[1]), int(layer.keys.shape[3]), layer.keys.dtype) for layer in layers]


def load_custom_ops() -> None:
    """Load ExecuTorch's LLM kernels (``llama::custom_sdpa``, ``llama::update_cache``) into torch; ``ImportError`` without executorch."""
    import importlib.util

    if importlib.util.find_spec("executorch") is None:
        msg = ("decompose(custom_ops=True) uses ExecuTorch's LLM kernels, and executorch is not installed. "
               "Install it with: pip install 'hfx[executorch]', or pass custom_ops=False")
        raise ImportError(msg)
    # Importing it registers the ops' kernels and shape functions with torch (executorch's own library).
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
