"""OpenVINO's workarounds: the FX graph rewrites ``lower_to_ov`` applies before ``convert_model``, ``OV_GRAPH_FIXES``.

A graph fix (``OvGraphFix``) changes a ``torch.fx.Graph`` in place: the graph of a
private copy of the exported program, decomposed with the table ``convert_model``
uses, so a fix never touches the ``Exported``. Each works around one gap of
OpenVINO 2026.4's PyTorch frontend, names it, rewrites only the nodes that have the
pattern (a graph without it is left as it is), and can be left out on its own:
``lower_to_ov(graph_fixes=...)`` takes any tuple of fixes, ``OV_GRAPH_FIXES`` by
default. Nothing here imports openvino.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from hfx.backends._empty_cats import cat_dim, empty_cats_as_zeros, is_legacy_empty
from hfx.backends._size_arithmetic import floor_divisions_of_signed_sizes, is_size, sym_node

# OpenVINO's CPU plugin computes int sizes in float32, exact to 2**24: dividends are shifted below that.
_FLOAT_EXACT_SHIFT = 1 << 22

# A rewrite of the decomposed FX graph, in place: ``fix(graph) -> None``.
OvGraphFix = Callable[[Any], None]


def static_view_sizes(graph: Any, /) -> None:
    """Write the size a ``view``/``reshape`` infers for ``-1`` when the graph knows it statically.

    Falcon's decode step reshapes its ALiBi bias ``[batch*heads, 1, past+1]`` to
    ``(batch, -1, 1, past+1)``. OpenVINO 2026.4's symbolic shape optimisation
    (at ``convert_model``) rewrites that target to ``[0, 1, 1, -1]`` (``0``: copy
    the input's dim 0, ``batch*heads``), so the compiled model fails at run time
    ("Eltwise shape infer input shapes dim index: 0 mismatch", intel_cpu
    eltwise.cpp). With the static ``heads`` written in place of ``-1`` the
    target converts as traced. Delete when OpenVINO keeps such a target.
    """
    import torch

    aten = torch.ops.aten
    for node in graph.nodes:
        if node.target not in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            continue
        target = list(node.args[1])
        shape = getattr(node.meta.get("val"), "shape", None)
        if shape is None or len(shape) != len(target) or -1 not in target:
            continue
        index = target.index(-1)
        if isinstance(shape[index], int):
            target[index] = shape[index]
            node.args = (node.args[0], target, *node.args[2:])


def drop_empty_cat_operands(graph: Any, /) -> None:
    """Drop the 1-D empty operands of ``aten.cat`` (a transformers cache layer's first update).

    ``torch.cat`` skips a legacy empty ``f32[0]`` operand whatever the others'
    rank; a prefill's ``DynamicLayer`` concatenates its empty initial keys that
    way. OpenVINO 2026.4 fails on it ("Conversion is failed for: SequenceMark,
    aten.cat.default"). Delete when OpenVINO converts such a cat.
    """
    import torch

    for node in [n for n in graph.nodes if n.target is torch.ops.aten.cat.default]:
        operands = list(node.args[0])
        kept = [v for v in operands if not is_legacy_empty(v)]
        if not kept or len(kept) == len(operands):
            continue
        node.args = (kept, *node.args[1:])
        for value in operands:
            if value not in kept and not value.users:
                graph.erase_node(value)


def negate_by_multiplying(graph: Any, /) -> None:
    """Rewrite ``aten.neg(x)`` as ``x * -1`` so the in-memory model compiles like its saved form.

    OpenVINO 2026.4 converts ``neg`` to ``x * convert(-1 as i32)``, which
    ``convert_model`` marks as a dequantization (``dequantization_node``,
    ``DisableConstantFolding``). The marks are not saved in the IR: in memory they
    stop the CPU plugin's RoPE fusion (rotate_half) and a saved and read-back model
    computes other (1e-7) numbers than the program that saved it. Delete when the
    neg conversion no longer carries the marks (``program._compiled.get_runtime_model()``
    lists ``RoPE`` nodes for Llama without this fix).
    """
    import torch

    for node in [n for n in graph.nodes if n.target is torch.ops.aten.neg.default]:
        with graph.inserting_before(node):
            product = graph.call_function(torch.ops.aten.mul.Tensor, (node.args[0], -1))
        product.meta.update(node.meta)
        node.replace_all_uses_with(product)
        graph.erase_node(node)


def mod_by_floordiv(graph: Any, /) -> None:
    """Rewrite ``a % b`` on sizes (``operator.mod``) as ``a - (a // b) * b``, which is the same for ints.

    Shape arithmetic such as Swin's window padding (``(window - width % window) % window``) stays
    in the exported graph as ``operator.mod`` on SymInts when the image size is dynamic; OpenVINO
    2026.4's PyTorch frontend converts ``operator`` ``add``, ``sub``, ``mul``, ``floordiv`` and ``neg``
    but not ``mod`` ("No conversion rule found for operations: <built-in function mod>"). Delete
    when the frontend converts ``mod``.
    """
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is operator.mod]:
        dividend, divisor = node.args
        with graph.inserting_before(node):
            quotient = sym_node(graph, operator.floordiv, dividend, divisor)
            multiple = sym_node(graph, operator.mul, quotient, divisor)
            remainder = sym_node(graph, operator.sub, dividend, multiple)
        remainder.meta.update(node.meta)
        node.replace_all_uses_with(remainder)
        graph.erase_node(node)


def floor_divisions_in_float_range(graph: Any, /) -> None:
    """``floor_divisions_of_signed_sizes`` with shifts float32 holds exactly.

    OpenVINO 2026.4's frontend converts ``operator.floordiv`` to a Python-rounding ``Divide``, yet a
    ceiling torch writes as ``-((-n) // k)`` ran rounded toward zero (an output one row short), and the
    CPU plugin computes the sizes in float32 (a dividend shifted by 2**30 came out wrong). Dividends
    down to -2**22 are divided right. Delete when the plugin floors integer ``Divide``.
    """
    floor_divisions_of_signed_sizes(graph, shift=_FLOAT_EXACT_SHIFT)


def power_by_products(graph: Any, /) -> None:
    """Rewrite ``a ** k`` on sizes (``operator.pow``, ``k`` a small non-negative int) as ``a * a * ...``.

    torch's symbolic shapes simplify a size times itself to a power: Funnel's relative
    shift (``hfx.patches.patch_funnel_positions``) views a ``[.., s * s]`` tensor, which
    the exported graph computes as ``operator.pow(s, 2)`` on a SymInt. OpenVINO 2026.4's
    PyTorch frontend has no conversion rule for it ("No conversion rule found for
    operations: <built-in function pow>"). Delete when the frontend converts ``pow``.
    """
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is operator.pow]:
        base, exponent = node.args
        if not isinstance(exponent, int) or isinstance(exponent, bool) or not 1 <= exponent <= _MAX_POWER:
            continue
        with graph.inserting_before(node):
            product = base
            for _ in range(exponent - 1):
                product = sym_node(graph, operator.mul, product, base)
        if product is base:  # a ** 1
            node.replace_all_uses_with(base)
        else:
            product.meta.update(node.meta)
            node.replace_all_uses_with(product)
        graph.erase_node(node)


def index_add_with_alpha(graph: Any, /) -> None:
    """Write out ``aten.index_add``'s ``alpha`` where the graph leaves it at its default.

    JetMoE's experts scatter their outputs back with ``zeros.index_add(0, index, outputs)``;
    the exported node has four arguments, and OpenVINO 2026.4's PyTorch frontend reads five
    ("Got less inputs 4 than expected 5", "Conversion is failed for: aten.index_add.default").
    ``alpha=1`` is the default, so the node computes the same. Delete when the frontend
    reads the default.
    """
    import torch

    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.index_add.default and len(node.args) == 4:
            node.args = (*node.args, node.kwargs.get("alpha", 1))
            node.kwargs = {key: value for key, value in node.kwargs.items() if key != "alpha"}


def min_max_by_floordiv(graph: Any, /) -> None:
    """Rewrite ``torch.sym_min``/``torch.sym_max`` of two sizes with ``+``, ``-``, ``*`` and ``//``.

    A size clamped to another (HunYuan-V4's window, ``min(sequence, window)`` computed on
    SymInts) stays in the exported graph as ``torch.sym_min``; OpenVINO 2026.4's PyTorch
    frontend has no conversion rule for it ("No conversion rule found for operations:
    <function sym_min ...>"). With ``d = a - b``, ``(d + _SPAN - 1) // _SPAN`` is 1 when
    ``a > b`` and 0 otherwise for ``|d| < _SPAN`` (the dividend is never negative, so no
    rounding direction is relied on); ``min = a - d * that``, ``max = b + d * that``.
    Delete when the frontend converts ``sym_min`` and ``sym_max``.
    """
    import torch

    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in (torch.sym_min, torch.sym_max)]:
        left, right = node.args
        if not all(is_size(value) for value in (left, right)):
            continue
        with graph.inserting_before(node):
            difference = sym_node(graph, operator.sub, left, right)
            greater = sym_node(graph, operator.floordiv, sym_node(graph, operator.add, difference, _SPAN - 1), _SPAN)
            step = sym_node(graph, operator.mul, difference, greater)
            if node.target is torch.sym_min:
                result = sym_node(graph, operator.sub, left, step)
            else:
                result = sym_node(graph, operator.add, right, step)
        result.meta.update(node.meta)
        node.replace_all_uses_with(result)
        graph.erase_node(node)


def _whole_factor_of_a_float_size(value: Any) -> tuple[Any, int] | None:
    """``(size, k)`` where ``value`` is ``torch.sym_float(size)`` times a whole float ``k`` (or alone, ``k = 1``)."""
    import torch

    if not hasattr(value, "op") or value.op != "call_function":
        return None
    if value.target is torch.sym_float and is_size(value.args[0]):
        return value.args[0], 1
    if value.target is operator.mul and len(value.args) == 2:
        for factor, other in (value.args, reversed(value.args)):
            inner = _whole_factor_of_a_float_size(other)
            if isinstance(factor, float) and factor.is_integer() and inner is not None:
                return inner[0], inner[1] * int(factor)
    return None


def whole_ceilings_as_products(graph: Any, /) -> None:
    """Rewrite ``math.ceil(k * sym_float(n))`` with a whole float ``k`` as the size product ``n * k``.

    NLLB-MoE's router sizes its experts' capacity as ``math.ceil(fraction * tokens)``
    (``moe_eval_capacity_token_fraction``, 1.0 by default): the exported graph keeps
    ``torch.sym_float`` and ``math.ceil`` on sizes, for which OpenVINO 2026.4's PyTorch
    frontend has no conversion rule ("No conversion rule found for operations: <built-in
    function ceil>, <function sym_float ...>"). With a whole ``k`` the product of floats is
    exact (below 2**53) and its ceiling is ``n * k``; other fractions are left as they are.
    Delete when the frontend converts ``sym_float`` and ``ceil``.
    """
    import math

    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is math.ceil]:
        found = _whole_factor_of_a_float_size(node.args[0])
        if found is None:
            continue
        size, factor = found
        with graph.inserting_before(node):
            product = size if factor == 1 else sym_node(graph, operator.mul, size, factor)
        node.replace_all_uses_with(product)
        arithmetic = node.args[0]
        graph.erase_node(node)
        _erase_unused(graph, [arithmetic])  # the float arithmetic only the ceiling read


# More than any difference of two sizes the graph compares (min_max_by_floordiv), and exact in OpenVINO's
# floordiv: with 2**30 its converted graph kept the larger size (measured, OpenVINO 2026.4.1), with 2**24 it is
# exact for every difference below 2**24, whether the division runs on integers or float32.
_SPAN = 1 << 24


# Powers written out as products up to this exponent (a size squared or cubed; larger ones stay as they are).
_MAX_POWER = 4


def _broadcast_row_fill(node: Any) -> tuple[Any, Any, Any, int] | None:
    """``(data, mask, value, rank)`` when ``node`` writes one broadcast value at a boolean mask's rows, else None."""
    import torch

    data, indices, value, *rest = node.args
    accumulate = rest[0] if rest else node.kwargs.get("accumulate", False)
    if accumulate or len(indices) != 1 or not hasattr(indices[0], "meta") or not hasattr(value, "meta"):
        return None
    mask, shapes = indices[0], [getattr(v.meta.get("val"), "shape", None) for v in (data, indices[0], value)]
    if any(shape is None for shape in shapes) or mask.meta["val"].dtype != torch.bool:
        return None
    data_shape, mask_shape, value_shape = shapes
    rank = len(mask_shape)
    if not 0 < rank < len(data_shape) or len(value_shape) > len(data_shape) - rank:
        return None
    tail = list(data_shape[rank:])
    # the value broadcasts to every written row: its dims are the rows' trailing dims, or 1
    if any(size != 1 and size != want for size, want in zip(reversed(value_shape), reversed(tail))):
        return None
    return data, mask, value, len(data_shape) - rank


def _erase_unused(graph: Any, values: list[Any]) -> None:
    """Erase each of ``values`` that no node reads any more, and then what only they read."""
    while values:
        value = values.pop()
        if hasattr(value, "op") and not value.users and value.op == "call_function":
            values.extend(value.all_input_nodes)
            graph.erase_node(value)


_FLOAT_ARITHMETIC = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div"}


def _float_size_tensor(graph: Any, value: Any) -> Any | None:
    """A 0-d float32 tensor node computing ``value``: a number, or ``+ - * /`` over ``torch.sym_float`` of sizes."""
    import torch

    aten = torch.ops.aten
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return graph.call_function(aten.scalar_tensor.default, (float(value),), {"dtype": torch.float32})
    if not hasattr(value, "op") or value.op != "call_function":
        return None
    if value.target is torch.sym_float and is_size(value.args[0]):
        return graph.call_function(aten.scalar_tensor.default, (value.args[0],), {"dtype": torch.float32})
    name = _FLOAT_ARITHMETIC.get(value.target)
    if name is None:
        return None
    left, right = (_float_size_tensor(graph, operand) for operand in value.args)
    if left is None or right is None:
        return None
    return graph.call_function(getattr(aten, name).Tensor, (left, right))


def linspaces_of_float_sizes_as_ranges(graph: Any, /) -> None:
    """Rewrite ``torch.linspace(start, end, steps)`` whose ends are float arithmetic on sizes as an ``arange``.

    Deformable DETR and its family (Grounding DINO, MM Grounding DINO …) place reference points with
    ``torch.linspace(0.5, height - 0.5, height)`` on the feature maps' sizes: the graph keeps
    ``torch.sym_float`` of a size, for which OpenVINO 2026.4's PyTorch frontend has no conversion rule
    ("No conversion rule found for operations: <function sym_float ...>"). The ends are computed as
    0-d float32 tensors and the points as ``start + arange(steps) * (end - start) / (steps - 1)``,
    torch's values (the same formula; at most a rounding apart where torch counts from the end).
    Delete when the frontend converts ``sym_float``.
    """
    import torch

    aten = torch.ops.aten
    for node in [n for n in graph.nodes if n.target is aten.linspace.default]:
        start, end, steps = node.args[:3]
        if not any(hasattr(v, "op") for v in (start, end)) or not isinstance(steps, int) or steps < 2:
            continue
        dtype = node.kwargs.get("dtype") or torch.float32
        with graph.inserting_before(node):
            first, last = _float_size_tensor(graph, start), _float_size_tensor(graph, end)
            if first is None or last is None:
                continue
            step = graph.call_function(aten.div.Tensor,
                                       (graph.call_function(aten.sub.Tensor, (last, first)), float(steps - 1)))
            counts = graph.call_function(aten.arange.default, (steps,), {"dtype": torch.float32})
            points = graph.call_function(aten.add.Tensor, (graph.call_function(aten.mul.Tensor, (counts, step)), first))
            if dtype != torch.float32:
                points = graph.call_function(aten._to_copy.default, (points,), {"dtype": dtype})
        points.meta.update(node.meta)
        node.replace_all_uses_with(points)
        graph.erase_node(node)
        _erase_unused(graph, [start, end])  # the float arithmetic only the linspace read


def masked_row_fills_as_where(graph: Any, /) -> None:
    """Rewrite ``x[mask] = value`` (a boolean mask over leading dims, one value broadcast to each row) as a ``where``.

    T5Gemma 2 writes its end-of-image embedding at the matching tokens,
    ``input_embeddings[input_ids == eoi_token_index] = eoi_embedding``: an ``index_put`` of a ``[hidden]``
    vector at a ``[batch, sequence]`` mask. OpenVINO 2026.4's ``AtenIndexPutReplacer`` turns it into a
    ``ScatterND`` whose updates have the wrong rank and conversion fails ("Rank of updates must be rank
    of inputs + rank of indices - last dimension of indices - 1"). ``where(mask[..., None], value, x)``
    writes the same rows. Delete when the frontend broadcasts such values.
    """
    import torch

    aten = torch.ops.aten
    for node in [n for n in graph.nodes if n.target is aten.index_put.default]:
        found = _broadcast_row_fill(node)
        if found is None:
            continue
        data, mask, value, trailing = found
        with graph.inserting_before(node):
            rows = mask
            for _ in range(trailing):
                rows = graph.call_function(aten.unsqueeze.default, (rows, -1))
            written = graph.call_function(aten.where.self, (rows, value, data))
        written.meta.update(node.meta)
        node.replace_all_uses_with(written)
        graph.erase_node(node)


def _static_size(value: Any, dim: int) -> int | None:
    """``value``'s size along ``dim`` if the graph knows it as an int, else ``None``."""
    shape = getattr(getattr(value, "meta", {}).get("val"), "shape", None)
    return shape[dim] if shape is not None and -len(shape) <= dim < len(shape) and isinstance(shape[dim], int) else None


def splits_of_a_cat_as_its_operands(graph: Any, /) -> None:
    """Read the parts of a split that undoes a ``cat`` (same dim, same boundaries) from the cat's operands.

    Model pattern: GLM-5-Next's sparse-attention indexer packs its keys, gate scores and valid mask
    with ``torch.cat([k, gate_scores, valid_channel], dim=-1)`` (a cache keeps them together) and
    unpacks them with ``torch.split(packed, [head_dim, head_dim, 1], dim=-1)`` (transformers
    5.22-5.24). OpenVINO 2026.4.1's CPU plugin fails to compile that model ("While validating node
    'opset1::VariadicSplit' ... Default output not supported"), also when the split is written as
    slices (the plugin fuses them back). Where the split's sizes are the operands' sizes along the
    cat's dim, each part is its operand: the same values, and no split. Other splits and cats are
    left as they are. Delete when the plugin compiles such a split.
    """
    import operator

    import torch

    aten = torch.ops.aten
    for node in [n for n in graph.nodes if n.target is aten.split_with_sizes.default]:
        source, sizes = node.args[0], list(node.args[1])
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        if getattr(source, "target", None) is not aten.cat.default or not all(
                user.target is operator.getitem for user in node.users):
            continue
        operands = list(source.args[0])
        joined = cat_dim(source)
        rank = len(source.meta["val"].shape) if "val" in source.meta else None
        if rank is None or dim % rank != joined % rank or len(operands) != len(sizes):
            continue
        if [_static_size(operand, joined) for operand in operands] != sizes:
            continue
        for user in list(node.users):
            user.replace_all_uses_with(operands[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        _erase_unused(graph, [source])


def separate_outputs(graph: Any, /) -> None:
    """Give each graph output its own node when it repeats another output or returns an input as is.

    OpenVINO 2026.4's PyTorch frontend names a tensor after the output that
    returns it: a tensor returned twice fails conversion ("Tensor name is not a
    number", translate_session.cpp), and naming a returned input renames the
    input too: any graph whose outputs repeat a value or return an input as is
    (tests/backends/test_openvino_fixes.py has one). ``x * 1`` (``x & x`` for
    bool) survives conversion as a node of its own. Delete when the frontend
    gives each output port its own tensor name.
    """
    import torch

    aten = torch.ops.aten
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    seen: set[Any] = set()
    values = []
    for value in output.args[0]:
        if isinstance(value, torch.fx.Node) and (value in seen or value.op == "placeholder"):
            is_bool = getattr(value.meta.get("val"), "dtype", None) == torch.bool
            with graph.inserting_before(output):
                if is_bool:
                    value = graph.call_function(aten.logical_and.default, (value, value))
                else:
                    value = graph.call_function(aten.mul.Tensor, (value, 1))
        seen.add(value)
        values.append(value)
    output.args = (type(output.args[0])(values),)


# The rewrites ``lower_to_ov`` applies to the decomposed FX graph (a private copy), in order.
# separate_outputs comes last: the others may leave an output that is another output or an input.
# Read, extend or replace: ``lower_to_ov(graph_fixes=(*OV_GRAPH_FIXES, my_fix))``.
OV_GRAPH_FIXES: tuple[OvGraphFix, ...] = (
    static_view_sizes,
    drop_empty_cat_operands,
    empty_cats_as_zeros,
    negate_by_multiplying,
    mod_by_floordiv,
    floor_divisions_in_float_range,
    power_by_products,
    min_max_by_floordiv,
    whole_ceilings_as_products,
    linspaces_of_float_sizes_as_ranges,
    index_add_with_alpha,
    masked_row_fills_as_where,
    splits_of_a_cat_as_its_operands,
    separate_outputs,
)
