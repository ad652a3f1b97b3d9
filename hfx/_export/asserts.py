"""Runtime asserts in an exported graph: which ones a program keeps, and a copy of the graph without the others."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.export.exported_program import ExportedProgram

from hfx._records import Exported

_ASSERT_OPS = ("aten._assert_scalar", "aten._assert_tensor_metadata", "aten.sym_constrain_range_for_size",
               "aten._assert_async")
_CONDITION_OPS = ("_is_all_true", "_local_scalar_dense", "aten.item", "operator.", "sym_", "aten.eq", "aten.ge",
                  "aten.le", "aten.lt", "aten.gt", "aten.ne", "aten.all", "aten.any")


def is_assert(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a runtime assert (``_assert_scalar`` and kin)."""
    return node.op == "call_function" and any(name in str(node.target) for name in _ASSERT_OPS)


def on_input_sizes_only(node: torch.fx.Node) -> bool:
    """Whether the assert ``node`` checks input sizes alone (no size that depends on tensor data).

    Kept as asserts when torch.export cannot prove them over the declared
    ranges, these are trace-time assumptions (a dim traced at 2 is not 1:
    ``Ne(Mod(p, batch*p), 0)`` in Gemma 3's vision projector), not the model's
    own checks (``torch._check`` on counted image tokens, data-dependent).
    """
    if node.target is not torch.ops.aten._assert_scalar.default:
        return False
    condition = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(condition, torch.SymBool):
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return not free_unbacked_symbols(condition)


def without_asserts(program: ExportedProgram, drop: Callable[[torch.fx.Node], bool] = is_assert) -> ExportedProgram:
    """A copy of ``program`` without the assert nodes ``drop`` selects (and what only they used); ``program`` is kept."""
    if not any(is_assert(node) and drop(node) for node in program.graph.nodes):
        return program
    graph = copy.deepcopy(program.graph)
    for original, node in zip(program.graph.find_nodes(op="placeholder"), graph.find_nodes(op="placeholder")):
        node.name = node.target = original.name  # the copy renames a builtin's name (``input`` -> ``input_1``)
    for node in [n for n in graph.nodes if is_assert(n) and drop(n)]:
        graph.erase_node(node)
    without_unused_conditions(graph)  # then what computed their conditions, now unused
    module = torch.fx.GraphModule(program.graph_module, graph)
    return ExportedProgram(
        root=module,
        graph=module.graph,
        graph_signature=program.graph_signature,
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        constants=program.constants,
        verifiers=[program.verifier],
    )


def without_unused_conditions(graph: torch.fx.Graph) -> int:
    """Erase from ``graph``, in place, the nodes that computed a condition no node reads any more; how many."""
    erased = 0
    while dead := [n for n in graph.nodes if n.op == "call_function" and not n.users and _computes_a_condition(n)]:
        for node in dead:
            graph.erase_node(node)
        erased += len(dead)
    return erased


def _computes_a_condition(node: Any) -> bool:
    """Nodes that compute an assert's condition (``_is_all_true``, ``item``, comparisons of sizes)."""
    if getattr(node.target, "__module__", None) in ("_operator", operator.__name__):
        return True  # size comparisons (``sym_ite(cond) >= 1``)
    return any(name in str(node.target) for name in _CONDITION_OPS)


def without_runtime_asserts(exported: Exported) -> Exported:
    """``exported`` with the graph's runtime asserts (and the nodes only they used) removed.

    Checks like transformers' ``torch_compilable_check`` (image tokens match
    image features) and deferred shape relations trace to
    ``_is_all_true -> item -> _assert_scalar``: ONNX has no ``_is_all_true``,
    ExecuTorch and OpenVINO no asserts. hfx checks names, dtypes, dims and
    bounds before a call. The graph is copied; the ``Exported`` given is not changed.
    """
    import attrs

    stripped = without_asserts(exported.program)
    return exported if stripped is exported.program else attrs.evolve(exported, program=stripped)
