"""Patches of transformers' cache layers that keep a Python counter a traced graph would bake in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hfx.patches._core import swap_attr

# The methods of ``DynamicSlidingWindowLayer`` that read or write its Python token counter.
_SLIDING_METHODS = ("update", "get_mask_sizes", "get_seq_length")


@contextlib.contextmanager
def patch_sliding_window_cache() -> Iterator[None]:
    """Make sliding-window cache layers keep every token, like a full ``DynamicLayer``; the mask applies the window.

    ``DynamicSlidingWindowLayer`` (transformers 5.x ``cache_utils``; Mistral,
    Gemma 2/3, chunked attention) counts the tokens it has seen in a Python int,
    ``cumulative_length``, and cuts its keys to the last ``sliding_window - 1``.
    Under ``torch.export`` the counter becomes the prompt's length symbol, which
    a cache's pytree context cannot hold ("cannot save a cache attribute of type
    SymInt"), and a decode graph would bake in the cut. With the layer's
    ``update``, ``get_mask_sizes`` and ``get_seq_length`` taken from
    ``DynamicLayer``, the cache holds the full history at absolute positions and
    the counter never changes, so prefill and decode export with a dynamic past;
    the sliding-window mask (built from absolute positions) hides the same keys
    as the cut did, so the tokens are eager's. The cost is a cache that grows
    like a full-attention layer's. ``decompose`` records ``generate()`` under
    the same patch, so the decode step it captures takes such a cache. The same
    workaround as transformers' own exporter (``_patch_sliding_window_layer`` in
    ``exporters/exporter_dynamo.py``); delete when huggingface/transformers#49542
    keeps sliding-window decode on one graph.
    """
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    with contextlib.ExitStack() as stack:
        for name in _SLIDING_METHODS:
            stack.enter_context(swap_attr(DynamicSlidingWindowLayer, name, vars(DynamicLayer)[name]))
        yield
