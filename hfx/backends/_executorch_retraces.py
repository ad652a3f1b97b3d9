"""Lowering-speed patches for ExecuTorch: work whose result is known to change nothing is skipped.

``patch_export_pass_skips_unchanged_retraces``: no fake-tensor retrace of a graph
that no pass has changed since its last.

Every ``ExportPass`` of executorch 1.5.1 ends by re-tracing the whole graph with
fake tensors and symbolic shapes (``ExportPass.call``), whether or not the pass
changed anything. XNNPACK preprocesses each partition with 17 such passes
(``backends/xnnpack/_passes/__init__.py``), and on a decoder about two of them
change a graph; on a Llama of SmolLM-135M's shape with 8 layers these retraces
were a third of the lowering (18 of 57 s here). ExecuTorch knows the cost:
pytorch/executorch#1893 ("XNNPACK preprocess is very very slow due to running many
transform passes") and #21138 (the Arm backend skips passes that do not apply).

``patch_export_pass_skips_unchanged_retraces`` returns the graph as it is when a
pass that does its work in ``call`` (it overrides none of the per-node hooks the
retrace runs) reaches ``ExportPass.call`` with a graph whose text is the one the
last retrace produced: the retrace would rebuild the same graph with the same
metadata. Any other pass retraces as before. The program is byte for byte the
one ExecuTorch builds without it (tests/backends/test_executorch_retraces.py).
Delete when ``ExportPass.call`` skips unchanged graphs itself.

``patch_bilinear_patterns_not_built_when_kept_whole``: XNNPACK's
``ConvertToUpsampleBilinear2d`` looks for decomposed bilinear upsamples by
matching four pattern graphs, which it builds on first use with a
``torch.export`` and a ``to_edge`` each (~4 s, the first ExecuTorch lowering
in every process). torch keeps ``aten.upsample_bilinear2d.vec`` whole (it is in
``torch.export``'s ``PRESERVED_ATEN_CIA_OPS``, and ExecuTorch's edge table does
not decompose it), so each pattern is that one op, which the pass leaves as it
is ("Op was not decomposed, do nothing"): the search cannot change a graph. The
patch skips building and matching the patterns and keeps the rest of the pass.
It steps aside when torch decomposes the op. Delete when the pass builds its
patterns only for graphs that hold their ops.

``patch_decompositions_skipped_when_nothing_decomposes``: ExecuTorch turns a
program into its edge dialect with up to three ``run_decompositions`` calls
(``_gen_edge_manager_for_partitioners``, for a partitioner such as XNNPACK's
that keeps some ops whole): one that functionalises, one with the table less
the kept ops, and one with the whole table after the kept ops were renamed.
Each retraces the whole graph with fake tensors (about 2 s per decoder layer
of SmolLM-135M's shape here); the last one finds nothing left to decompose on a
decoder (its only hit is ``aten.sym_size.int``, whose entry gives back the same
size query). ExecuTorch skips such a pass on its other path ("safe to skip when
none of those targets occur in the graph", executorch 1.5.1). The patch returns
the program as it is from a ``run_decompositions`` on a program that a previous
one produced (so functional), holds no higher-order op (but ``auto_functionalized``, the
functional form of a mutating op such as the KV cache's update), no mutating op
and no call the table would decompose (an entry that declines most calls, as hfx's
``cropping_constant_pad`` declines every pad that crops nothing, says which it
rewrites: Mamba 2's padded chunks kept two retraces, a fifth of its lowering).
The program is byte for byte the one built without it (tests/backends/test_executorch_retraces.py). Delete when ExecuTorch
skips that pass itself.

``patch_decompositions_in_one_retrace``: of those calls, the first
(``run_decompositions({})``) only functionalises and the second decomposes
with the table less the partitioner's kept ops; each retraces the whole graph.
``torch.export`` documents one call with the table as the way from its training
IR to a decomposed functional program. The patch makes that one call where
ExecuTorch hands the program to its partitioner's pre-decomposition transforms
(``_apply_pre_decomposition_transforms``, executorch 1.5.1), with the table
ExecuTorch builds next (its ``_default_decomposition_table`` less the kept ops,
the invalid ones removed as it does), for one partitioner; the skip above then
returns the program as it is from both of ExecuTorch's own calls. It steps aside
without that skip (it would add a retrace) and for several partitioners or none.
The program has the same operators; where the graph has runtime asserts on its
sizes (a decoder's cache), each is kept once: the two retraces re-inserted some
twice and added tautologies (``Eq(s70, s70)``). On a graph without them it is
byte for byte the one built without the patch (tests/backends/test_executorch_retraces.py).
The runner program of a 4-layer SmolLM-shaped Llama is the same bytes and lowered in
about 8% less time (``benchmarks/lowering_patches.py --patch
patch_decompositions_in_one_retrace --layers 4``). Delete when ExecuTorch
functionalises and decomposes in one call.

``patch_edge_dtype_check_reads_metadata``: ExecuTorch's edge verifier checks
that each edge op's tensor arguments and results have dtypes its schema allows
(``_check_tensor_args_matching_op_allowed_dtype``, executorch 1.5.1). Its
``EdgeOpArgValidator`` is an ``fx.Interpreter`` that runs every op of the graph
on fake tensors with symbolic shapes only to learn its arguments' dtypes, and
the verifier runs on every program ExecuTorch builds or hands on (the edge
program, before and after the transform passes, the fake copy the partitioner
gets, each delegate's submodule): on a one-layer Llama decode step these runs
were 14% of the lowering (py-spy, AVX2 EPYC). Each node's ``meta["val"]``
already holds what that run computes: ExecuTorch's memory planning and emitter
read the same metadata. The patch hands the validator a node's recorded value
where it would run the op; the dtypes it checks, and the error it raises on a
mismatch, are the same. Running the ops also asked the shape environment
questions that could guard a symbolic size; reading the metadata asks none. The
program is byte for byte the one built without it
(tests/backends/test_executorch_retraces.py). Delete when the validator reads
the recorded values itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches import swap_attr

# ``GraphModule.meta`` key: the text of the graph as ExportPass's last retrace left it.
_TRACED = "hfx_retraced_graph"

# ExportPass's per-node hooks: a pass that overrides one does its work while ``ExportPass.call`` retraces.
RETRACE_HOOKS = ("inputs", "placeholder", "call_operator", "call_sym", "call_cond", "call_while", "call_map",
                 "call_scan", "call_getitem", "output", "call_submodule", "call_delegate", "on_attr")


def works_in_call_only(export_pass: Any, base: type) -> bool:
    """Whether ``export_pass`` (an ``ExportPass``) keeps every per-node hook of ``base`` (``ExportPass``)."""
    return all(getattr(type(export_pass), hook, None) is getattr(base, hook, None) for hook in RETRACE_HOOKS)


def _skipping_unchanged(original: Callable[..., Any], base: type, result_type: type) -> Callable[..., Any]:
    """Wrap ``ExportPass.call`` so that it returns an unchanged graph as it is (see the module's docstring)."""

    def call(self: Any, graph_module: Any) -> Any:
        text = str(graph_module.graph)
        if graph_module.meta.get(_TRACED) == text and works_in_call_only(self, base):
            return result_type(graph_module, False)
        result = original(self, graph_module)
        result.graph_module.meta[_TRACED] = str(result.graph_module.graph)
        return result

    call.__wrapped__ = original
    return call


@contextlib.contextmanager
def patch_export_pass_skips_unchanged_retraces() -> Iterator[None]:
    """Skip ExecuTorch's fake-tensor retrace of a graph no pass has changed since the last one (module docstring).

    Steps aside when ``ExportPass.call`` is already wrapped (a lowering inside a lowering).
    """
    from executorch.exir.pass_base import ExportPass, PassResult

    original = ExportPass.call  # defined on its base class, swapped on ExportPass, which every pass subclasses
    if hasattr(original, "__wrapped__"):
        yield
        return
    with swap_attr(ExportPass, "call", _skipping_unchanged(original, ExportPass, PassResult)):
        yield


def bilinear_kept_whole() -> bool:
    """Whether ``torch.export`` and ExecuTorch's edge lowering keep ``aten.upsample_bilinear2d.vec`` as one op."""
    from executorch.exir.program._program import _default_decomposition_table
    from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS

    op = torch.ops.aten.upsample_bilinear2d.vec
    return op in PRESERVED_ATEN_CIA_OPS and op not in _default_decomposition_table()


def _without_pattern_search(pass_class: type, result_type: type) -> Callable[..., Any]:
    """``ConvertToUpsampleBilinear2d.call`` without its pattern search: the ``ExportPass`` retrace it ends with."""

    def call(self: Any, graph_module: Any) -> Any:
        graph_module.recompile()
        graph_module = super(pass_class, self).call(graph_module).graph_module
        return result_type(graph_module, True)

    return call


@contextlib.contextmanager
def patch_bilinear_patterns_not_built_when_kept_whole() -> Iterator[None]:
    """Skip XNNPACK's search for decomposed bilinear upsamples while torch keeps the op whole (module docstring)."""
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d
    from torch.fx.passes.infra.pass_base import PassResult

    if not bilinear_kept_whole():
        yield
        return
    with swap_attr(ConvertToUpsampleBilinear2d, "call", _without_pattern_search(ConvertToUpsampleBilinear2d, PassResult)):
        yield


# ``GraphModule.meta`` key: set on the graph a ``run_decompositions`` returned (functional, in inference IR).
_DECOMPOSED = "hfx_decomposed"


def _size_queries() -> set[Any]:
    """Size queries: the decomposition tables list them (CompositeImplicitAutograd); their entry traces back to them."""
    aten = torch.ops.aten
    return {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}


def _functionalized_mutations() -> set[Any]:
    """The higher-order ops functionalisation wraps a mutating op in (the KV cache's ``llama::update_cache``)."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

    return {auto_functionalized, auto_functionalized_v2}


def _decomposes(node: torch.fx.Node, table: Any) -> bool:
    """Whether ``table`` has an entry for ``node``'s call that rewrites it: an entry that says which calls it rewrites
    (an ``applies_to`` predicate, as hfx's ``cropping_constant_pad``) is asked, any other counts."""
    if node.target not in table:
        return False
    applies_to = getattr(table[node.target], "applies_to", None)
    return applies_to is None or applies_to(node)


def decomposes_nothing(program: Any, table: Any) -> bool:
    """Whether ``table`` would change no call of ``program``'s graphs, which are functional ATen: no target
    (but a size query) has an entry that rewrites the call, none mutates its inputs and none is a higher-order op (but the
    functional form of a mutating one)."""
    size_queries = _size_queries()
    functionalized = _functionalized_mutations()
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OperatorBase):  # noqa: SLF001
                continue
            if isinstance(node.target, torch._ops.HigherOrderOperator) and node.target not in functionalized:  # noqa: SLF001
                return False
            schema = getattr(node.target, "_schema", None)
            if (_decomposes(node, table) and node.target not in size_queries) or (schema is not None and schema.is_mutable):
                return False
    return True


def _skipping_empty_decompositions(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``ExportedProgram.run_decompositions`` so that a pass with nothing to do returns the program as it is."""

    def run_decompositions(self: Any, decomp_table: Any = None, *args: Any, **kwargs: Any) -> Any:
        if (decomp_table is not None and not args and not kwargs and self.graph_module.meta.get(_DECOMPOSED)
                and decomposes_nothing(self, decomp_table)):
            return self
        result = original(self, decomp_table, *args, **kwargs)
        result.graph_module.meta[_DECOMPOSED] = True
        return result

    run_decompositions.__wrapped__ = original
    run_decompositions.hfx_skips_empty = True  # torch's own method is a functools.wraps wrapper too
    return run_decompositions


@contextlib.contextmanager
def patch_decompositions_skipped_when_nothing_decomposes() -> Iterator[None]:
    """Skip a ``run_decompositions`` that would decompose nothing in an already decomposed program (module docstring).

    Steps aside when ``run_decompositions`` is already wrapped (a lowering inside a lowering).
    """
    owner = torch.export.ExportedProgram
    original = owner.run_decompositions
    if getattr(original, "hfx_skips_empty", False):
        yield
        return
    with swap_attr(owner, "run_decompositions", _skipping_empty_decompositions(original)):
        yield


def partitioner_table(partitioner: Any, program: Any) -> Any:
    """The decomposition table ExecuTorch (1.5.1) uses for ``partitioner``: its default edge table less the ops the
    partitioner keeps whole (less the ones it cannot keep, where the partitioner checks its ops)."""
    from executorch.exir.program import _program

    keep, check = partitioner.ops_to_not_decompose(program)
    if check is not None:
        keep = _program._remove_invalid_ops_for_not_decompose(keep)  # noqa: SLF001
    table = _program._default_decomposition_table()  # noqa: SLF001
    for op in keep:
        table.pop(op, None)
    return table


def _decomposing_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``_apply_pre_decomposition_transforms`` so that its program comes out decomposed for its one partitioner."""

    def transformed(program: Any, partitioners: Any) -> Any:
        program = original(program, partitioners)
        skips = getattr(torch.export.ExportedProgram.run_decompositions, "hfx_skips_empty", False)
        if not skips or len(partitioners) != 1 or program.graph_module.meta.get(_DECOMPOSED):
            return program
        return program.run_decompositions(partitioner_table(partitioners[0], program))

    transformed.__wrapped__ = original
    return transformed


@contextlib.contextmanager
def patch_decompositions_in_one_retrace() -> Iterator[None]:
    """Functionalise and decompose a program for its partitioner in one ``run_decompositions`` (module docstring).

    Steps aside when ``_apply_pre_decomposition_transforms`` is already wrapped (a lowering inside a lowering).
    """
    from executorch.exir.program import _program

    original = _program._apply_pre_decomposition_transforms  # noqa: SLF001
    if hasattr(original, "__wrapped__"):
        yield
        return
    with swap_attr(_program, "_apply_pre_decomposition_transforms", _decomposing_once(original)):
        yield


def _recorded_value_validator(validator: type) -> type:
    """A subclass of ExecuTorch's ``EdgeOpArgValidator`` that takes each call's result from its node's ``meta["val"]``
    instead of running the op on fake tensors; its checks are its base's."""

    class _RecordedValues(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            self.recorded = node.meta.get("val")  # before a check swaps it (patch_edge_validator_list_returns)
            return super().run_node(node)

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:  # noqa: ARG002 - read, not run
            return self.recorded

    class RecordedValueValidator(validator, _RecordedValues):
        """``EdgeOpArgValidator`` over the values the graph recorded (hfx: ``patch_edge_dtype_check_reads_metadata``)."""

    return RecordedValueValidator


@contextlib.contextmanager
def patch_edge_dtype_check_reads_metadata() -> Iterator[None]:
    """Check edge ops' dtypes from the values their nodes recorded, without running them (module docstring).

    Steps aside when the verifier's validator is already replaced (a lowering inside a lowering) or is not an
    ``fx.Interpreter`` (a release whose validator does not run the graph).
    """
    from executorch.exir.verification import verifier

    validator = getattr(verifier, "EdgeOpArgValidator", None)
    if not isinstance(validator, type) or not issubclass(validator, torch.fx.Interpreter) or hasattr(
            validator, "hfx_reads_metadata"):
        yield
        return
    replacement = _recorded_value_validator(validator)
    replacement.hfx_reads_metadata = True
    with swap_attr(verifier, "EdgeOpArgValidator", replacement):
        yield
