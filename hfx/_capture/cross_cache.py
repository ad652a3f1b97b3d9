"""An encoder-decoder's encoder that also computes the cross-attention cache, so that one decode graph takes every step.

An encoder-decoder's first decoder step differs from the others in one way: its
cross-attention layers project the encoder's states into keys and values, which
the later steps read from the cache. ``decompose`` keeps that first step as a
``prefill`` graph, a second copy of the decoder's weights. With
``decompose(multi_token_decode=True)`` the encoder component is
``EncoderWithCrossCache`` instead: the encoder, then the decoder's
cross-attention projections of its states (the rest of the decoder call it
makes is dead code, which ``export`` drops with its weights). The ``decode``
graph then takes the first step as well, from an empty self-attention cache.
"""

from __future__ import annotations

from typing import Any

import torch

# The key under which ``hfx.as_model``'s encoder hands transformers' generate the cross-attention cache: a tensor in
# the encoder's output, so that generate expands it with the rest for beams.
CROSS_KEY = "hfx_cross_attention_cache"


class EncoderWithCrossCache(torch.nn.Module):
    """``forward(**encoder inputs) -> (encoder outputs, cross-attention cache)``: the encoder's own output and the
    decoder's cross-attention cache of its states (a ``DynamicCache``, one layer per decoder layer).

    It holds the user's model and never changes it. ``start_token`` is any decoder
    token: the cross-attention keys and values do not depend on it.
    """

    def __init__(self, model: torch.nn.Module, start_token: int) -> None:
        super().__init__()
        self.model = model
        self.start_token = int(start_token)

    def forward(self, **inputs: Any) -> Any:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        states = self.model.get_encoder()(**inputs)
        hidden = states[0] if isinstance(states, tuple) else states.last_hidden_state
        tokens = torch.full((hidden.shape[0], 1), self.start_token, dtype=torch.long, device=hidden.device)
        config = self.model.config.get_text_config(decoder=True)  # the caches generate() makes, layers made up front
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        # The encoder's own output, as generate() hands it over (NLLB-MoE's decoder reads its router logits too).
        given = states if not isinstance(states, tuple) else BaseModelOutput(last_hidden_state=hidden)
        self.model(encoder_outputs=given, attention_mask=inputs.get("attention_mask"), decoder_input_ids=tokens,
                   past_key_values=cache, use_cache=True)
        return states, cache.cross_attention_cache


def reproduces_cross_cache(encoder: EncoderWithCrossCache, encoder_inputs: dict[str, Any], cache: Any) -> bool:
    """Whether ``encoder`` computes from ``encoder_inputs`` the cross-attention cache ``cache`` holds.

    ``cache`` is the ``EncoderDecoderCache`` a recorded decode step of the real
    ``generate()`` read. A model whose first decoder step does more than project
    the encoder's states into it (or that keeps no cross-attention cache) does
    not reproduce it: it keeps its ``prefill`` graph. The same projections of the
    same states run in the same order, so the values agree to float32 rounding.
    """
    from hfx._pytree import is_cache

    cross = getattr(cache, "cross_attention_cache", None)
    if not getattr(cross, "layers", None):
        return False
    with torch.no_grad():
        _, ours = encoder(**encoder_inputs)
    if not is_cache(ours) or len(ours.layers) != len(cross.layers):
        return False
    pairs = [(mine, theirs) for a, b in zip(ours.layers, cross.layers) for mine, theirs in ((a.keys, b.keys), (a.values, b.values))]
    return all(isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) and mine.shape == theirs.shape
               and torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6) for mine, theirs in pairs)


def split_encoder_output(outputs: Any) -> tuple[Any, Any]:
    """``(encoder_outputs, cross-attention cache or None)`` of an ``encoder`` component's output: the cache is there
    when the encoder is ``EncoderWithCrossCache``."""
    from hfx._pytree import is_cache

    if isinstance(outputs, tuple) and len(outputs) == 2 and is_cache(outputs[1]):
        return outputs
    return outputs, None


def with_cross_cache(cache: Any, cross: Any) -> Any:
    """``cache`` (an ``EncoderDecoderCache``, its self-attention part empty) with ``cross`` as its cross-attention cache."""
    return type(cache)(cache.self_attention_cache, cross)


def stacked_cross_cache(cross: Any) -> torch.Tensor:
    """The cross-attention cache as one tensor ``[batch, layers, 2, heads, length, dim]`` (batch first, as generate
    expands the encoder's tensors for beams)."""
    layers = [torch.stack([layer.keys, layer.values], dim=1) for layer in cross.layers]
    if len({tuple(layer.shape) for layer in layers}) != 1:
        msg = ("as_model: the encoder's cross-attention layers have different shapes "
               f"({sorted({tuple(layer.shape) for layer in layers})}); drive these programs with hfx.generate")
        raise ValueError(msg)
    return torch.stack(layers, dim=1)


def filled_cross_cache(cache: Any, stacked: torch.Tensor) -> Any:
    """``cache`` (an ``EncoderDecoderCache`` whose cross-attention layers are empty, made for a graph's spec) with the
    keys and values of a ``stacked_cross_cache`` tensor in those layers."""
    cross = cache.cross_attention_cache
    for index, layer in enumerate(cross.layers):
        layer.keys, layer.values = stacked[:, index, 0], stacked[:, index, 1]
    return with_cross_cache(cache, cross)
