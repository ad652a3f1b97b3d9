"""ONNX Runtime's fused operators in hfx's ONNX graphs: the fusions ``lower_to_onnx`` runs (``ORT_FUSIONS``).

A fusion (``OnnxFusion``) rewrites an ``onnx_ir.Model`` in place and returns how
many places it rewrote; ``lower_to_onnx(fusions=...)`` runs them in order after the
fixes and records the counts of those that fired in ``OnnxProgram.fusions``. A graph
without the pattern (an encoder, a vision tower) is left as it is, so the defaults
apply wherever they match: decoder LLMs get ``SimplifiedLayerNormalization``,
``SkipSimplifiedLayerNormalization``, ``RotaryEmbedding`` and ``GroupQueryAttention``
(which masks causally: only in a graph that reads a cache, with a mask built from the padding
mask and positions alone), other attentions (encoders, cross-attention, a prompt graph without
a cache, a prefix that attends both ways) ``MultiHeadAttention`` (all in ONNX Runtime's
``com.microsoft`` domain, so the fused graph runs on ONNX Runtime only; ``fusions=()`` keeps
standard ONNX).

The normalization, rotary and attention patterns are onnxscript's ORT fusion rules
(``onnxscript.rewriter.ort_fusions``). Two steps are hfx's own, because hfx's graphs
keep the calling contract of the eager model (``attention_mask`` and ``position_ids``
in, a left-padded batch allowed) where onnxscript's GQA rule assumes ONNX Runtime
GenAI's right-padded one (``seqlens_k`` from the largest position id, the mask dropped):

* ``rotary_embedding``: the rotary's cos/sin are computed per token from ``position_ids``
  in the graph, as eager does; they become the (B * S, D / 2) tables of ONNX Runtime's
  ``RotaryEmbedding``, read at the positions 0 .. B * S - 1, which is exact for any
  rope variant (scaled, dynamic) and needs no largest position.
* ``attention``: ``GroupQueryAttention`` reads the graph's own additive
  mask as ``attention_bias`` (padding, causality, sliding windows as eager built
  them) and sees every row as full (``seqlens_k = T - 1``, ``T`` the mask's last
  axis), so the cache layout stays hfx's (B, Hkv, T, D), left padding included. The
  rotary stays a separate ``RotaryEmbedding`` on the (B, S, H * D) projections
  (``do_rotary=0``): GQA's own rotary reads one position per row for a prompt,
  which a left-padded row does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A fusion: rewrites the model in place, returns the number of places it rewrote.
OnnxFusion = Callable[[Any], int]

_MS = "com.microsoft"
_FUSION = "ai.onnxruntime._fusion"  # onnxscript's intermediate functions, inlined when unused


def _shape_inference(model: Any) -> None:
    import onnx_ir.passes.common as common_passes

    common_passes.ShapeInferencePass()(model)


def rms_normalization(model: Any, /) -> int:
    """``SimplifiedLayerNormalization`` for RMSNorm (onnxscript's rule), after shape inference."""
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization

    _shape_inference(model)
    optimize(model)
    return fuse_rms_normalization(model)


def skip_rms_normalization(model: Any, /) -> int:
    """``SkipSimplifiedLayerNormalization`` for a residual add followed by an RMSNorm (onnxscript's rule)."""
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

    return fuse_skip_rms_normalization(model)


def rotary_embedding(model: Any, /) -> int:
    """ONNX Runtime's ``RotaryEmbedding`` for ``x * cos + rotate_half(x) * sin``, with per-token tables."""
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_partial_rotary_embedding, fuse_rotary_embedding

    if not fuse_rotary_embedding(model):
        return 0
    import onnx_ir.passes.common as common_passes

    count = _rotary_tables().apply_to_model(model)
    common_passes.CommonSubexpressionEliminationPass()(model)  # one set of tables for every layer
    fuse_partial_rotary_embedding(model)
    return count


def attention(model: Any, /) -> int:
    """``GroupQueryAttention`` for rotary, the cache concatenation, the head repeat and SDPA (see the module);
    ``MultiHeadAttention`` for the other scaled dot-product attentions (onnxscript's rules); standard ops again
    for an attention neither fits (``_standard_attention``)."""
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa
    from onnxscript.rewriter.ort_fusions.sdpa_via_mha import replace_sdpa_by_mha

    if not fuse_sdpa(model):
        return 0
    _shape_inference(model)
    presents: list[tuple[Any, Any]] = []
    count = _gqa(presents).apply_to_model(model)
    _presents_from_gqa(presents)
    count += replace_sdpa_by_mha(model)
    _standard_attention().apply_to_model(model)
    return count


def _standard_attention() -> Any:
    """The rule from onnxscript's intermediate ``SDPA`` back to standard ops, for an attention no fused operator
    takes (heads or sizes that shape inference left unknown): ``softmax(q k^T * scale + mask) v``, fully
    masked rows zero, as torch's SDPA gives them."""
    from onnxscript.rewriter import pattern

    class StandardAttention(pattern.RewriteRuleClassBase):
        def pattern(self, op: Any, query: Any, key: Any, value: Any) -> Any:
            return op.SDPA(query, key, value, _allow_other_inputs=True, _domain=_FUSION, _outputs=["sdpa"])

        def rewrite(self, op: Any, query: Any, key: Any, value: Any, sdpa: Any) -> Any:
            node = sdpa.producer()
            key_format = node.attributes["key_format"].value
            keys = op.Transpose(key, perm=[0, 1, 3, 2] if key_format == "BHSd" else [0, 2, 3, 1])
            scale = node.attributes.get("scale")
            if scale is None or scale.value is None:  # 1 / sqrt(head size)
                scale = op.Reciprocal(op.Sqrt(op.CastLike(op.Shape(query, start=-1), query)))
            else:
                scale = op.CastLike(op.Constant(value_float=scale.value), query)
            scores = op.MatMul(op.Mul(query, scale), keys)
            if len(node.inputs) > 3 and node.inputs[3] is not None:
                scores = op.Add(scores, node.inputs[3])
            weights = op.Softmax(scores, axis=-1)
            weights = op.Where(op.IsNaN(weights), op.CastLike(op.Constant(value_float=0.0), weights), weights)
            return op.MatMul(weights, value)

    return pattern.RewriteRuleSet([StandardAttention.rule()])


def _rotary_tables() -> Any:
    """The rule that turns onnxscript's ``RotaryEmbedding(x, cos4d, sin4d)`` into ONNX Runtime's, with tables."""
    from onnxscript.rewriter import pattern

    class RotaryTables(pattern.RewriteRuleClassBase):
        def __init__(self) -> None:
            super().__init__("RotaryTables", remove_nodes=False)  # the cos/sin are shared by every layer

        def pattern(self, op: Any, x: Any, freqs: Any, interleaved: Any, num_heads: Any) -> Any:
            emb = op.Concat(freqs, freqs, axis=-1)
            cos, sin = op.Unsqueeze(op.Cos(emb), [1]), op.Unsqueeze(op.Sin(emb), [1])
            return op.RotaryEmbedding(x, cos, sin, interleaved=interleaved, num_heads=num_heads, _domain=_FUSION)

        def check(self, context: Any, freqs: Any, **_: Any) -> Any:
            if freqs.shape is None or freqs.shape.rank() != 3 or not isinstance(freqs.shape[2], int):
                return pattern.MatchResult().fail("the rotary angles are not (batch, sequence, half) with a known half", freqs)
            return True

        def rewrite(self, op: Any, x: Any, freqs: Any, interleaved: Any, num_heads: Any, **_: Any) -> Any:
            half = freqs.shape[2]
            rows = op.Shape(freqs, start=0, end=2)
            positions = op.Reshape(op.Range(op.Constant(value_int=0), op.ReduceProd(rows, keepdims=0),
                                            op.Constant(value_int=1)), rows)
            # Angles of one row (positions computed in the graph) serve the whole batch, as they broadcast in eager.
            positions = op.Expand(positions, op.Concat(op.Shape(x, start=0, end=1), op.Shape(freqs, start=1, end=2),
                                                       axis=0))
            table = op.Constant(value_ints=[-1, half])
            return op.RotaryEmbedding(x, positions, op.Reshape(op.Cos(freqs), table), op.Reshape(op.Sin(freqs), table),
                                      interleaved=interleaved.value, num_heads=num_heads.value, _domain=_MS)

    return pattern.RewriteRuleSet([RotaryTables.rule()])


def _gqa(presents: list[tuple[Any, Any]]) -> Any:
    """The rule from rotary + cache concat + repeat_kv + SDPA (+ the zeroing of fully masked rows) to GQA.

    The rule's pattern has one output, the attention's: onnxscript's matcher tries every combination of
    candidate nodes for each further output of a pattern (``_matcher.SimplePatternMatcher.match``), so a
    rule that also returned the concatenated caches took time cubic in the graph (over 20 minutes at 30
    layers). Each rewrite appends ``(concatenated cache, GQA's present output)`` to ``presents`` instead,
    for ``_presents_from_gqa`` to rewire once the rule has run.
    """
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    def split_heads(op: Any, x: Any, name: str) -> Any:
        return op.Transpose(op.Reshape(x, pattern.ANY_VALUE, _outputs=[name]), perm=[0, 2, 1, 3])

    def repeated(op: Any, cache: Any) -> Any:
        return op.Reshape(op.Expand(op.Unsqueeze(cache, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE)

    class GroupQueryAttention(pattern.RewriteRuleClassBase):
        def __init__(self, *, row_mask: bool) -> None:
            super().__init__(f"GQA(row_mask={row_mask})", remove_nodes=False)
            self._row_mask = row_mask

        def pattern(self, op: Any, query: Any, key: Any, value: Any, past_key: Any, past_value: Any,
                    q_positions: Any, k_positions: Any, cos: Any, sin: Any, mask: Any, rows: Any) -> Any:
            # Two position inputs: a batch-broadcast table is expanded to each input's batch separately.
            q = op.RotaryEmbedding(split_heads(op, query, "q_heads"), q_positions, cos, sin, _domain=_MS,
                                   _outputs=["q_rope"])
            k = op.RotaryEmbedding(split_heads(op, key, "k_heads"), k_positions, cos, sin, _domain=_MS,
                                   _outputs=["k_rope"])
            v = split_heads(op, value, "v_heads")
            keys = op.Concat(past_key, k, axis=-2, _outputs=["keys"])
            values = op.Concat(past_value, v, axis=-2, _outputs=["values"])
            attention = op.SDPA(q, repeated(op, keys), repeated(op, values), mask, key_format="BHSd",
                                _domain=_FUSION, _outputs=["sdpa"])
            if self._row_mask:
                attention = op.Mul(attention, rows)
            attention = pattern.OrValue([attention, op.Reshape(attention, pattern.ANY_VALUE)])  # a no-op view
            return op.Reshape(op.Transpose(attention, perm=[0, 2, 1, 3]), pattern.ANY_VALUE)

        def check(self, context: Any, q_heads: Any, k_heads: Any, q_rope: Any, k_rope: Any, mask: Any,
                  rows: Any = None, **_: Any) -> Any:
            result = pattern.MatchResult()
            heads = [v.shape[2] if v.shape is not None and v.shape.rank() == 4 else None for v in (q_heads, k_heads)]
            if not all(isinstance(h, int) for h in heads) or heads[0] % heads[1]:
                return result.fail("the query and key/value head counts are not known integers, or do not divide", q_heads)
            if dict(q_rope.producer().attributes).keys() - {"interleaved", "num_heads", "rotary_embedding_dim"}:
                return result.fail("a rotary attribute GQA's inputs cannot carry", q_rope)
            if _rotary_attrs(q_rope) != _rotary_attrs(k_rope):
                return result.fail("the query and key rotaries differ", [q_rope, k_rope])
            if mask.dtype != q_heads.dtype or mask.shape is None or mask.shape.rank() != 4:
                return result.fail("the mask is not an additive (B, 1, S, T) bias of the query's dtype", mask)
            if not _causal_inputs_only(mask):
                return result.fail("the mask reads inputs besides the padding mask and positions (a bidirectional "
                                   "prefix?), and GQA masks causally on top of it", mask)
            if rows is not None and (rows.shape is None or rows.shape.rank() != 4 or rows.shape[1] != 1
                                     or rows.shape[3] != 1):
                return result.fail("the row mask is not (B, 1, S, 1)", rows)
            self._heads = heads
            return result

        def rewrite(self, op: Any, query: Any, key: Any, value: Any, q_positions: Any, k_positions: Any, cos: Any,
                    sin: Any, mask: Any, q_rope: Any, sdpa: Any, past_key: Any, past_value: Any, keys: Any, values: Any,
                    rows: Any = None, **_: Any) -> Any:
            heads, kv_heads = self._heads
            rotary = _rotary_attrs(q_rope)
            q = op.RotaryEmbedding(query, q_positions, cos, sin, num_heads=heads, **rotary, _domain=_MS)
            k = op.RotaryEmbedding(key, k_positions, cos, sin, num_heads=kv_heads, **rotary, _domain=_MS)
            total = op.Shape(mask, start=-1)
            seqlens = op.Expand(op.Cast(op.Sub(total, op.Constant(value_ints=[1])), to=ir.DataType.INT32),
                                op.Shape(query, start=0, end=1))
            scale = sdpa.producer().attributes.get("scale")
            extra = {"scale": scale.value} if scale is not None and scale.value is not None else {}
            batch = op.Shape(query, start=0, end=1)
            # Every row's block is whole; saying so lets a block of several tokens over a past run at any batch
            # (without it ONNX Runtime takes such a block at batch 1 only).
            blocks = op.Expand(op.Cast(op.Shape(query, start=1, end=2), to=ir.DataType.INT32), batch)
            out, present_key, present_value = op.GroupQueryAttention(
                q, k, value, past_key, past_value, seqlens,
                op.Cast(op.Squeeze(total, op.Constant(value_ints=[0])), to=ir.DataType.INT32),
                None, None, None, mask, *([None] * 5), blocks,
                num_heads=heads, kv_num_heads=kv_heads, **extra, _domain=_MS, _outputs=3)
            presents.extend([(keys, present_key), (values, present_value)])
            if rows is not None:
                out = op.Mul(out, op.Squeeze(rows, op.Constant(value_ints=[1])))
            return out

    # With a cache only: a graph without one may be a bidirectional encoder (EmbeddingGemma's rotary, GQA heads and
    # padding-only mask), whose attention MultiHeadAttention takes as it is.
    return pattern.RewriteRuleSet([GroupQueryAttention.rule(row_mask=row_mask) for row_mask in (True, False)])


# The graph inputs a decoder's causal mask is built from: the padding mask and the positions (whose blocks of
# packed sequences only narrow the causal window); the other inputs' sizes (read through Shape) count as sizes.
_CAUSAL_MASK_INPUTS = frozenset({"attention_mask", "position_ids", "cache_position"})


def _causal_inputs_only(mask: Any) -> bool:
    """Whether ``mask`` reads no graph input's values but those a causal mask is built from.

    ONNX Runtime's ``GroupQueryAttention`` always masks causally (no key after the query's position) and then
    adds the bias; a mask that lets a block attend both ways (PaliGemma's image and prefix tokens, by
    ``token_type_ids``; Gemma 3's image tokens, by ``input_ids``) would lose its later keys.
    """
    seen: set[int] = set()
    stack = [mask]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.is_graph_input() and value.name not in _CAUSAL_MASK_INPUTS:
            return False
        node = value.producer()
        if node is not None and node.op_type not in ("Shape", "Size"):
            stack.extend(v for v in node.inputs if v is not None)
    return True


def _presents_from_gqa(presents: list[tuple[Any, Any]]) -> None:
    """Give every use of each concatenated cache (a graph output, the next layer's nothing) GQA's present output
    instead, under the old value's name, type and shape."""
    import onnx_ir as ir

    for old, new in presents:
        new.type, new.shape = old.type, old.shape
        name, old.name = old.name, None
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        new.name = name


def _rotary_attrs(value: Any) -> dict[str, Any]:
    """The attributes of the ``RotaryEmbedding`` that made ``value``, but its head count, as plain values."""
    return {name: attr.value for name, attr in value.producer().attributes.items() if name != "num_heads"}


def cleanup(model: Any, /) -> int:
    """Inline the unused intermediate functions of the rules and drop the nodes they left dead (counts nothing)."""
    from onnxscript.optimizer import optimize

    optimize(model)
    return 0


# The fusions ``lower_to_onnx`` runs by default, in order; each reads what the ones before it made.
ORT_FUSIONS: tuple[OnnxFusion, ...] = (rms_normalization, skip_rms_normalization, rotary_embedding, attention, cleanup)
# The same fusions, under the name they had while the attention fusion was opt-in (its rule then took time cubic in
# the graph's size); kept for code that names it.
ORT_ATTENTION_FUSIONS: tuple[OnnxFusion, ...] = ORT_FUSIONS
