"""Probes of OpenVINO's CPU plugin: whether a miscomputation hfx works around is present on this CPU.

Each probe compiles a graph of a few nodes once per process (cached) and compares
it with NumPy; the workaround it guards applies only where the probe fails, so it
goes away by itself on a CPU or an OpenVINO release without the fault.
"""

from __future__ import annotations

import functools

import numpy as np

# The head size of the probe's attention: the fault shows from 128 (64 computes right).
_HEAD = 128


@functools.cache
def snippets_miscompute_zeroed_attention() -> bool:
    """Whether the CPU plugin's snippets compute an attention whose padded rows are zeroed wrong.

    hfx exports a bool-mask SDPA as ``sdpa(q, k, v, mask | ~attends) * attends``
    (``hfx.patches.patch_sdpa_fully_masked_rows``: eager torch gives zeros for a
    fully masked row). On an Intel Xeon with AVX-512 and AMX, OpenVINO 2026.4.1's
    CPU plugin fuses that into a snippet (``Subgraph``) that, from a head size of
    128, returns values off by up to 1e34 (a Llama with 128-wide heads: logits 2.2
    off eager's; ``SNIPPETS_MODE: DISABLE`` gives eager's). The probe is that graph
    with 4 heads of 128 over 7 tokens, queries, keys and values laid out
    ``[batch, tokens, heads, size]`` as a model's projections give them.
    """
    import openvino as ov
    from openvino import opset13 as ops

    q, k, v = (ops.parameter([-1, -1, 4, _HEAD], ov.Type.f32, name=name) for name in "qkv")
    keep = ops.parameter([-1, 1, -1, -1], ov.Type.boolean, name="keep")
    heads_first = ops.constant(np.array([0, 2, 1, 3], np.int64))
    attends = ops.reduce_logical_or(keep, ops.constant(np.array([-1], np.int64)), True)
    out = ops.scaled_dot_product_attention(*(ops.transpose(t, heads_first) for t in (q, k, v)),
                                           ops.logical_or(keep, ops.logical_not(attends)), causal=False)
    out = ops.transpose(ops.multiply(out, ops.convert(attends, ov.Type.f32)), heads_first)
    compiled = ov.Core().compile_model(ov.Model([out], [q, k, v, keep]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((2, 7, 4, _HEAD)).astype(np.float32) for name in "qkv"}
    causal = np.broadcast_to(np.tril(np.ones((7, 7), bool)), (2, 1, 7, 7)).copy()
    got = compiled({**inputs, "keep": causal})[0]
    query, key, value = (inputs[name].transpose(0, 2, 1, 3) for name in "qkv")
    scores = np.where(causal, query @ key.transpose(0, 1, 3, 2) / np.sqrt(_HEAD), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = ((weights / weights.sum(-1, keepdims=True)) @ value).transpose(0, 2, 1, 3)
    return not np.allclose(got, want, rtol=1e-4, atol=1e-4)
