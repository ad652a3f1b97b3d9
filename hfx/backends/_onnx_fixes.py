"""ONNX's workarounds: the fixes ``lower_to_onnx`` wraps its ``torch.onnx.export`` call in (``ONNX_FIXES``).

A fix (``OnnxFix``) takes ``convert``, a zero-argument function that runs
``torch.onnx.export`` (and the fixes before this one) and returns the
``onnx_ir.Model``, and returns the model: it can set state up around the export
(a grad mode) or rewrite the model it gets back. Each fix works around one bug of
torch 2.13's exporter or of ONNX Runtime 1.32, names it, and can be left out on its
own: ``lower_to_onnx(fixes=...)`` takes any tuple of fixes, ``ONNX_FIXES`` by default.
Nothing here imports onnx at import time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.backends._size_arithmetic import floor_divisions_of_signed_sizes

# A fix of the ONNX conversion: ``fix(convert) -> onnx_ir.Model``, where ``convert()`` returns the model.
OnnxFix = Callable[[Callable[[], Any]], Any]


def convert_under_no_grad(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` under ``no_grad``, as ``export`` traced, so torch.onnx's fake re-run keeps the traced strides.

    torch.onnx (2.13) re-runs the decomposed graph on fake tensors in its
    InsertTypePromotion pass with grad enabled, where parameters require grad.
    An attention mask built from a parameter (T5's relative position bias; mT5,
    UMT5) then requires grad, so CPU SDPA takes the math kernel, whose output is
    contiguous (B, H, S, D), instead of the flash kernel it was traced with, whose
    output is laid out (B, S, H, D) (pytorch/pytorch#133671). The
    ``.transpose(1, 2).contiguous()`` after SDPA was a no-op at trace time and left
    no node, and torch.onnx's decompositions had turned the ``reshape`` after it
    into a ``view`` the re-run layout cannot take: "Cannot view a tensor with
    shape ... and strides ..." (pytorch/pytorch#136543, #179287). The grad mode
    changes no value, only the kernel the fake run picks. Delete when torch.onnx
    re-runs graphs under ``no_grad`` or torch.export keeps no-op ``contiguous`` calls.
    """
    with torch.no_grad():
        return convert()


def unused_assert_conditions_dropped(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with torch.onnx's assert removal also dropping the conditions only the asserts read.

    torch.onnx (2.13) decomposes the program again, which puts back a runtime
    assert for each range constraint, then erases the ``_assert_scalar`` nodes
    (``_fx_passes.remove_assertion_nodes``) but not the comparisons that fed
    them, and translates those. A data-dependent size whose range torch derived
    past int64 (Idefics3's and SmolVLM's image-token count on transformers 5.22:
    ``u1 <= 147573952589676412896``) leaves a comparison with a constant ONNX
    cannot hold, and the export fails ("OverflowError: Python int too large to
    convert to C long"). The wrapped pass erases what is left unused, as
    ``hfx._export.asserts`` does for every runtime; where torch's pass leaves
    nothing, it changes nothing. Delete when torch.onnx drops dead conditions.
    """
    from torch.onnx._internal.exporter import _fx_passes

    from hfx._export.asserts import without_unused_conditions
    from hfx.patches import swap_attr

    remove = _fx_passes.remove_assertion_nodes

    def remove_with_conditions(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        graph_module = remove(graph_module)
        _rewrite_each_graph(graph_module, without_unused_conditions)
        return graph_module

    with swap_attr(_fx_passes, "remove_assertion_nodes", remove_with_conditions):
        return convert()


def scalar_first_operands_as_tensors(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with a number in a Tensor operand of the decomposed graph made a 0-d tensor first.

    Model pattern: ``1.0 - attention_mask`` on an integer mask (XLNet,
    ProphetNet, BigBird). torch.onnx (2.13, and 2.14.1) decomposes
    ``aten.rsub.Scalar`` into ``aten.sub.Tensor(1.0, mask)``, and its type
    promotion pass then finds no ``sub`` overload for a float in the first
    place ("Cannot find a compatible OpOverload for aten.sub";
    pytorch/pytorch#194381, a regression of 2.13.0, fix proposed in #194522).
    The wrapped pass first replaces each such number with
    ``aten.scalar_tensor`` of the dtype a Python number promotes as (float32,
    int64, bool: a 0-d tensor ranks below the dimensioned operand, as the
    number does), so the result's dtype is torch's. A graph without a number in
    a Tensor operand is left as it is. Delete when torch.onnx materialises them.
    """
    return _converted_with_rewrite_before_promotion(convert, _numbers_made_tensors)


def size_divisions_rounded_down(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with the decomposed graph's ``a // b`` on possibly negative sizes made exact first.

    torch.onnx (2.13) converts ``operator.floordiv`` on SymInts to an int64 ``Div``, which ONNX
    Runtime rounds toward zero: a ceiling torch wrote as ``-((-n) // k)`` came out one short, and an
    output with it (Mimi's and EnCodec's last conv window) one row shorter than eager's, silently.
    ``floor_divisions_of_signed_sizes`` shifts such dividends positive; a graph whose dividends torch
    knows are never negative is left as it is. Delete when torch.onnx emits a floor division.
    """
    return _converted_with_rewrite_before_promotion(convert, floor_divisions_of_signed_sizes)


def zero_size_views_as_new_tensors(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with each ``view`` to a shape holding a literal 0 made a ``new_zeros`` of that shape first.

    Model pattern: the rotary half of a no-RoPE layer's keys, ``k_rot.view(batch, 1, seq, 0)``
    (Mistral Large 4's ``no_rope_layers``, its ``qk_rope_head_dim`` 0 there). onnxscript 0.7's
    ``MaterializeReshapeShape`` rule writes the target shape ``[-1, 1, 1, 0]`` with
    ``allowzero=1``, which ONNX Runtime refuses at load ("Invalid Target shape product of 0.
    Product cannot be 0 in combination with -1"). A tensor of no elements has no values to keep,
    so a new one of the same shape and dtype is the same. Delete when the rule leaves such shapes.
    """
    return _converted_with_rewrite_before_promotion(convert, _zero_size_views_made_new)


def _zero_size_views_made_new(graph: torch.fx.Graph) -> int:
    """Replace ``aten.view`` / ``aten.reshape`` to a size list with a literal 0 by ``aten.new_zeros``; how many."""
    views = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)
    rewritten = 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in views]:
        source, size = node.args[:2]
        if not any(type(s) is int and s == 0 for s in size):
            continue
        with graph.inserting_before(node):
            empty = graph.call_function(torch.ops.aten.new_zeros.default, (source, list(size)))
        empty.meta.update(node.meta)
        node.replace_all_uses_with(empty)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _converted_with_rewrite_before_promotion(convert: Callable[[], Any],
                                              rewrite: Callable[[torch.fx.Graph], Any]) -> Any:
    """``convert()``, with ``rewrite`` run on each decomposed graph just before torch.onnx's type promotion pass."""
    from torch.onnx._internal.exporter import _fx_passes

    from hfx.patches import swap_attr

    promote = _fx_passes.insert_type_promotion_nodes

    def promote_after_rewrite(graph_module: torch.fx.GraphModule) -> None:
        _rewrite_each_graph(graph_module, rewrite)
        promote(graph_module)

    with swap_attr(_fx_passes, "insert_type_promotion_nodes", promote_after_rewrite):
        return convert()


def _rewrite_each_graph(graph_module: torch.fx.GraphModule, rewrite: Callable[[torch.fx.Graph], Any]) -> None:
    """Run ``rewrite(graph)`` on the graph of ``graph_module`` and of each submodule; recompile those it changed
    (it returns a true value then)."""
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule) and rewrite(module.graph):
            module.recompile()


def _numbers_made_tensors(graph: torch.fx.Graph) -> int:
    """Replace every Python number that ``graph``'s ATen calls pass where their schema wants a Tensor by an
    ``aten.scalar_tensor`` node; return how many were replaced."""
    count = 0
    for node in list(graph.nodes):
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        args = list(node.args)
        numbers = [index for index, (value, argument) in enumerate(zip(args, schema.arguments))
                   if isinstance(value, (bool, int, float)) and isinstance(argument.type, torch.TensorType)]
        for index in numbers:
            value = args[index]
            dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float32
            with graph.inserting_before(node):
                args[index] = graph.call_function(torch.ops.aten.scalar_tensor.default, (value,), {"dtype": dtype})
            args[index].meta["val"] = torch.scalar_tensor(value, dtype=dtype)
        if numbers:  # only a changed node gets new arguments (setting them re-registers its inputs' users)
            node.args = tuple(args)
            count += len(numbers)
    return count


# Elementwise ops that ONNX Runtime's CPU provider (1.32) has no bfloat16 kernel for, and whose float32
# result rounded to bfloat16 is what torch computes for bfloat16 on CPU (it upcasts each element).
_BFLOAT16_UPCAST_OPS = frozenset({
    "Abs", "Add", "Cos", "Div", "Equal", "Erf", "Exp", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Log",
    "Max", "Min", "Mul", "Neg", "Pow", "Reciprocal", "Sigmoid", "Sin", "Sqrt", "Sub", "Tanh", "Where",
})


def bfloat16_arithmetic_in_float32(convert: Callable[[], Any], /) -> Any:
    """The model ``convert`` returns, with each bfloat16 elementwise op computed in float32 between two ``Cast`` s.

    A float32 model can hold a little bfloat16 arithmetic: Falcon's ALiBi slopes
    (``build_alibi_tensor``: ``slopes[..., None].bfloat16() * arange_tensor``) give a
    bfloat16 ``Mul``, which ONNX Runtime 1.32's CPU provider cannot load ("NOT_IMPLEMENTED :
    Could not find an implementation for Mul(14)"). Each such op reads its bfloat16 inputs
    cast to float32 and its bfloat16 outputs are cast back, which rounds exactly as torch's
    CPU kernels do; a model without bfloat16 elementwise ops is returned as it is.
    Delete when ONNX Runtime has bfloat16 CPU kernels for these ops.
    """
    import onnx_ir as ir

    model = convert()
    bf16 = ir.DataType.BFLOAT16
    for node in list(model.graph.all_nodes()):
        values = [v for v in (*node.inputs, *node.outputs) if v is not None]
        if node.domain not in ("", "ai.onnx") or node.op_type not in _BFLOAT16_UPCAST_OPS:
            continue
        if not any(v.dtype == bf16 for v in values):
            continue
        for index, value in enumerate(node.inputs):
            if value is not None and value.dtype == bf16:
                upcast = _cast(value, ir.DataType.FLOAT)
                node.graph.insert_before(node, upcast)
                node.replace_input_with(index, upcast.outputs[0])
        for value in node.outputs:
            if value.dtype == bf16:
                _round_output_to_bfloat16(node, value)
    return model


def _cast(value: Any, dtype: Any) -> Any:
    """A ``Cast`` node of ``value`` to ``dtype`` (its output typed and shaped)."""
    import onnx_ir as ir

    node = ir.Node("", "Cast", [value], [ir.AttrInt64("to", dtype)], num_outputs=1)
    node.outputs[0].dtype = dtype
    node.outputs[0].shape = value.shape
    return node


def _round_output_to_bfloat16(node: Any, value: Any) -> None:
    """Make ``node``'s output ``value`` float32 and give its readers (and the graph output) a bfloat16 ``Cast`` of it."""
    import onnx_ir as ir

    uses = list(value.uses())
    name = value.name
    value.dtype = ir.DataType.FLOAT
    value.name = f"{name}_float32"
    rounded = _cast(value, ir.DataType.BFLOAT16)
    rounded.outputs[0].name = name
    node.graph.insert_after(node, rounded)
    for user, index in uses:
        user.replace_input_with(index, rounded.outputs[0])
    outputs = node.graph.outputs
    for position, output in enumerate(outputs):
        if output is value:
            outputs[position] = rounded.outputs[0]


def _recorded_value_promotion(interpreter: type, rule_of: Callable[[torch.fx.Node, Any], Any]) -> type:
    """A subclass of torch.onnx's ``_TypePromotionInterpreter`` that takes the value of each node it leaves unchanged
    from the node's ``meta["val"]``, and runs only the nodes it promotes (their values change); ``rule_of(node,
    table)`` is torch.onnx's ``get_type_promotion_rule``."""

    class RecordedValuePromotion(interpreter):
        """``_TypePromotionInterpreter`` over the values the graph recorded (hfx: ``type_promotion_reads_recorded_values``)."""

        hfx_reads_recorded_values = True

        def run_node(self, node: torch.fx.Node) -> Any:
            recorded = node.meta.get("val")
            if node.op != "call_function" or recorded is None:
                return super().run_node(node)
            with self._set_current_node(node):
                if rule := rule_of(node, self.type_promotion_table):
                    self._maybe_promote_node(node, rule)
            if node.meta.get("val") is not recorded:  # promoted and re-run: its value is the new one
                return torch.fx.Interpreter.run_node(self, node)
            return recorded

    return RecordedValuePromotion


def type_promotion_reads_recorded_values(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with torch.onnx's type promotion pass reading the values the graph recorded instead of
    running every op again.

    torch.onnx (2.13, and 2.14.1) inserts the casts an op's type promotion
    needs with ``InsertTypePromotion``, an ``fx.Interpreter`` that runs every
    node of the just-decomposed graph again on fake tensors with symbolic
    shapes only to learn each argument's dtype, although the decomposition
    recorded each node's value in ``meta["val"]``: ~8% of lowering a one-layer
    decoder graph here. The fix's interpreter returns the recorded value of each
    node the pass leaves unchanged and runs only the nodes it promotes, as
    torch's pass does (their values change); it inserts the same casts. It also
    keeps the traced strides where a re-run would pick another kernel (see
    ``convert_under_no_grad``). Steps aside where torch.onnx has no such
    interpreter. Delete when torch.onnx's pass reads the recorded values.
    """
    from hfx.patches import swap_attr

    try:
        from torch.onnx._internal.fx.passes import type_promotion
    except ImportError:  # another torch.onnx: no such pass
        return convert()
    interpreter = getattr(type_promotion, "_TypePromotionInterpreter", None)
    rule_of = getattr(type_promotion, "get_type_promotion_rule", None)
    if (not isinstance(interpreter, type) or not issubclass(interpreter, torch.fx.Interpreter)
            or hasattr(interpreter, "hfx_reads_recorded_values") or not callable(rule_of)):
        return convert()
    with swap_attr(type_promotion, "_TypePromotionInterpreter", _recorded_value_promotion(interpreter, rule_of)):
        return convert()


# The registry torch.onnx builds from torchlib, per (class, opset): read-only, handed out as copies.
_TORCHLIB_REGISTRIES: dict[tuple[Any, ...], Any] = {}


def _registry_copy(registry: Any) -> Any:
    """A copy of ``registry`` whose function lists are its own (``register_op`` appends to them)."""
    import copy

    duplicate = copy.copy(registry)
    duplicate.functions = {target: list(metas) for target, metas in registry.functions.items()}
    return duplicate


def torchlib_registry_built_once(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` with torch.onnx's ATen-to-ONNX registry built once per process and copied for each export.

    torch.onnx (2.13) rebuilds ``ONNXRegistry.from_torchlib()`` on every export
    (``_compat.export_compat``): it imports and registers torchlib's ~500 functions
    again, 0.7 s here, a third of lowering a one-layer decoder graph and paid again
    for each component. The registry depends only on the opset; the fix builds it
    once per opset and gives each export a copy whose function lists are its own,
    so a ``custom_translation_table`` registered into one export's copy never
    reaches another. Delete when torch.onnx caches its registry.
    """
    from torch.onnx._internal.exporter import _registration

    from hfx.patches import swap_attr

    owner = _registration.ONNXRegistry
    build = vars(owner).get("from_torchlib")
    if not isinstance(build, classmethod):  # another torch.onnx: the registry is built otherwise
        return convert()

    def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())))  # the opset, however it is passed
        if key not in _TORCHLIB_REGISTRIES:
            _TORCHLIB_REGISTRIES[key] = build.__func__(cls, *args, **kwargs)
        return _registry_copy(_TORCHLIB_REGISTRIES[key])

    with swap_attr(owner, "from_torchlib", classmethod(from_torchlib)):
        return convert()


def _tolerant_no_op_constants() -> list[Any]:
    """The constant patterns (``x + 0``, ``x * 1`` ...) of onnxscript's no-op rules that match within a tolerance."""
    import importlib

    for name in ("onnxscript.rewriter.rules.common._no_op", "onnxscript.rewriter._no_op"):
        try:
            rules = importlib.import_module(name).rules
            break
        except (ImportError, AttributeError):
            continue
    else:
        return []
    from onnxscript.rewriter._pattern_ir import Constant

    return [value for rule in rules for node in rule._target_pattern._nodes for value in node.inputs  # noqa: SLF001
            if isinstance(value, Constant) and (value._abs_tol or value._rel_tol)]  # noqa: SLF001


@contextlib.contextmanager
def exact_no_op_constants() -> Iterator[None]:
    """Make onnxscript's no-op rules (``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``) match exact constants only, in the block.

    onnxscript 0.7's optimizer removes ``Add(x, c)`` where ``c`` is within 1e-8 of 0
    (``_pattern_ir.Constant``'s default ``abs_tol``) and ``Mul(x, c)`` where ``c`` is within
    1e-5 of 1: the 1e-8 epsilon of an RMSNorm (``mean(x**2) + 1e-8``, MuSE Spark's
    post-attention norm) went, and a padded row's zero output then gave ``0 * inf = NaN``.
    ``lower_to_onnx``'s fusions run the optimizer too and enter this as well. Delete when
    the rules match only exact identities.
    """
    from hfx.patches import swap_attr

    with contextlib.ExitStack() as stack:
        for constant in _tolerant_no_op_constants():
            stack.enter_context(swap_attr(constant, "_abs_tol", 0.0))
            stack.enter_context(swap_attr(constant, "_rel_tol", 0.0))
        yield


def no_op_rules_match_exact_constants(convert: Callable[[], Any], /) -> Any:
    """Run ``convert`` (torch.onnx's export and its optimizer) under ``exact_no_op_constants``."""
    with exact_no_op_constants():
        return convert()


# The fixes ``lower_to_onnx`` wraps ``torch.onnx.export`` in; each wraps the ones before it (the first is
# closest to the export). Read, extend or replace: ``lower_to_onnx(fixes=(*ONNX_FIXES, my_fix))``.
ONNX_FIXES: tuple[OnnxFix, ...] = (convert_under_no_grad, unused_assert_conditions_dropped,
                                   scalar_first_operands_as_tensors, size_divisions_rounded_down,
                                   zero_size_views_as_new_tensors,
                                   bfloat16_arithmetic_in_float32,
                                   torchlib_registry_built_once, type_promotion_reads_recorded_values,
                                   no_op_rules_match_exact_constants)
