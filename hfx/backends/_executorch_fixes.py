"""ExecuTorch's workarounds: the patches ``lower_to_pte`` enters while ExecuTorch builds a program, ``PTE_PATCHES``.

Each patch works around one bug of executorch 1.5.1 (or of torch 2.13 as ExecuTorch
uses it), names it, and can be left out on its own: ``lower_to_pte(patches=...)``
takes any tuple of patches, ``PTE_PATCHES`` by default. Where checking for the bug
is cheap, a patch steps aside when it is not there. Nothing here imports executorch
at import time; each patch imports what it swaps when it is entered.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import sympy
import torch
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm
from torch.utils._sympy import functions as symfn

from hfx.backends._executorch_retraces import (
    patch_bilinear_patterns_not_built_when_kept_whole,
    patch_decompositions_in_one_retrace,
    patch_decompositions_skipped_when_nothing_decomposes,
    patch_edge_dtype_check_reads_metadata,
    patch_export_pass_skips_unchanged_retraces,
)
from hfx.backends._size_arithmetic import size_range
from hfx.patches import Patch, swap_attr, swap_item

# --- the edge verifier ---------------------------------------------------------------------------


@contextlib.contextmanager
def patch_edge_verifier_sym_functions() -> Iterator[None]:
    """Let ExecuTorch's edge verifier accept the Python sym functions (``torch.sym_min``) of runtime asserts.

    An export that keeps guard-unprovable guards as runtime asserts (a decode
    step's cache contiguity check, ``Min(16*p + 16, 32*p + 32) == 16*p + 16``)
    has ``torch.sym_min`` nodes feeding ``_assert_scalar``. Every decomposition
    re-inserts them, and executorch 1.5.1's edge verifier fails on any plain
    Python function: "assert op.__name__ in ('alloc',)" (exir/verification/verifier.py).
    ExecuTorch itself maps these functions to ``executorch_prim`` ops
    (``EdgeToBackendOpsPass``) and drops the asserts (``RemoveGraphAssertsPass``),
    but only in ``to_executorch``, after the verifier has run. This adds the
    functions that pass maps to the verifier's allowlist for the lowering only,
    and steps aside when the allowlist already has them. Delete when the verifier
    accepts them (no upstream issue found for 1.5.1; the Transformers exporter
    carries the same workaround, ``_extend_sym_ops_allowlist``).
    """
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS
    from executorch.exir.verification import verifier

    original = vars(verifier)["_EXECUTORCH_SYM_OPS"]
    allowed = {*original, *_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS}
    if allowed == set(original):
        yield
        return
    with swap_attr(verifier, "_EXECUTORCH_SYM_OPS", allowed):
        yield


# --- the edge dtype validator --------------------------------------------------------------------


def _returns_one_tensor_list(target: Any) -> bool:
    """Whether ``target`` is an edge op whose schema returns a single ``Tensor[]`` (``split_with_sizes_copy``, ``unbind_copy``)."""
    returns = getattr(getattr(target, "_schema", None), "returns", ())
    return len(returns) == 1 and returns[0].type == torch.ListType.ofTensors()


def _validating_list_returns_whole(original: Any) -> Any:
    """Wrap ``EdgeOpArgValidator.call_function`` so that it sees a ``Tensor[]`` return as one value, not as its items."""

    @functools.wraps(original)
    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:  # noqa: ANN001
        if not _returns_one_tensor_list(target):
            return original(self, target, args, kwargs)
        with swap_item(self.node.meta, "val", (self.node.meta["val"],)):
            return original(self, target, args, kwargs)

    call_function.__wrapped__ = original
    return call_function


@contextlib.contextmanager
def patch_edge_validator_list_returns() -> Iterator[None]:
    """Keep ExecuTorch's edge dtype validator from fixing the batch of a graph that splits a batched tensor.

    executorch 1.5.1's ``EdgeOpArgValidator.call_function``
    (exir/verification/arg_validator.py:103-129) iterates ``node.meta["val"]``
    as the op's list of returns. For an op that returns one ``Tensor[]``
    (``split_with_sizes_copy``, ``split_copy``, ``unbind_copy``: any
    ``chunk``/``split``/``unbind``) that list is the split's pieces, so it takes
    the first piece for the whole return and calls ``range(len(piece))`` on it:
    the piece's symbolic dim 0 (the batch) is specialised to its trace size, the
    guard ``Eq(batch, 2)`` enters the program's shape environment and the memory
    plan, and the ``.pte`` runs at the trace batch only ("Attempted to resize a
    static tensor", 0x12; Mamba's ``in_proj(...).chunk(2, dim=1)``). This hands
    the validator such a return wrapped in a one-item tuple, which is what it
    expects; other ops reach it as before. Delete when the validator handles a
    single ``Tensor[]`` return.
    """
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator

    original = vars(EdgeOpArgValidator)["call_function"]
    with swap_attr(EdgeOpArgValidator, "call_function", _validating_list_returns_whole(original)):
        yield


# --- the edge decompositions ---------------------------------------------------------------------

# ATen ops outside core ATen that neither ExecuTorch's decompositions nor its kernels cover, and that torch's own
# decomposition table rewrites into core ops: Idefics3 / SmolVLM's patch positions call ``torch.bucketize``.
EDGE_DECOMPOSED_OPS: tuple[torch._ops.OpOverload, ...] = (torch.ops.aten.bucketize.Tensor,)


def _adding(original: Callable[..., Any], decompositions: Mapping[Any, Callable[..., Any]]) -> Callable[..., Any]:
    """Wrap ExecuTorch's ``_default_decomposition_table`` so that each table it builds also has ``decompositions``."""

    @functools.wraps(original)
    def _default_decomposition_table(*args: Any, **kwargs: Any) -> Any:
        table = original(*args, **kwargs)
        table.update(decompositions)
        return table

    _default_decomposition_table.__wrapped__ = original
    return _default_decomposition_table


@contextlib.contextmanager
def patch_edge_decomposition_table() -> Iterator[None]:
    """Let ExecuTorch decompose the ops of ``EDGE_DECOMPOSED_OPS`` with torch's own decompositions, and the ops
    without an ExecuTorch kernel (``scatter_reduce.two``, ``erfinv``: ``hfx.backends._decompositions``) with hfx's.

    executorch 1.5.1's edge verifier accepts core ATen ops only, and
    ``to_edge_transform_and_lower`` decomposes with the table
    ``_default_decomposition_table`` builds (exir/tracer.py: torch's core-ATen
    table plus ``linalg_vector_norm``), which leaves ``aten.bucketize.Tensor``
    out while ExecuTorch has no kernel for it either: Idefics3 and SmolVLM's
    patch positions failed with "Operator torch._ops.aten.bucketize.Tensor is not
    in Core ATen opset". This adds torch's decomposition of each such op that
    ExecuTorch's table lacks to every table ExecuTorch builds while the block
    runs (a graph without them is decomposed as before), and steps aside when
    the table has them all. Delete when ExecuTorch decomposes or runs ``bucketize``, ``scatter_reduce`` and ``erfinv``.

    Example:
        >>> from executorch.exir.program import _program
        >>> with patch_edge_decomposition_table():
        ...     torch.ops.aten.bucketize.Tensor in _program._default_decomposition_table()
        True
    """
    from executorch.exir.program import _program
    from torch._decomp import decomposition_table

    from hfx.backends._decompositions import cropping_constant_pad, executorch_decompositions, frame_wise_convolution

    original = vars(_program)["_default_decomposition_table"]
    table = original()  # reading it materialises the table (60 ms), so it is read once per lowering
    missing = {op: decomposition_table[op] for op in EDGE_DECOMPOSED_OPS if op not in table}
    missing.update({op: function for op, function in executorch_decompositions().items() if op not in table})
    if torch.ops.aten.constant_pad_nd.default not in table:  # its kernel refuses negative padding (a crop)
        missing[torch.ops.aten.constant_pad_nd.default] = cropping_constant_pad
    if torch.ops.aten.convolution.default not in table:  # neither its kernel nor XNNPACK takes a 3-D one
        missing[torch.ops.aten.convolution.default] = frame_wise_convolution
    if not missing:
        yield
        return
    with swap_attr(_program, "_default_decomposition_table", _adding(original, missing)):
        yield


# --- the XNNPACK partitioner ---------------------------------------------------------------------


def _dynamic_dims(node: torch.fx.Node) -> int:
    """How many dims of ``node``'s output are symbolic."""
    val = node.meta.get("val")
    return sum(isinstance(size, torch.SymInt) and not size.node.is_constant() for size in getattr(val, "shape", ()))


def _output_has_one_dynamic_dim(node: torch.fx.Node) -> bool:
    """Whether XNNPACK can serialise ``node`` as a static reshape: at most one dynamic dim in its output."""
    return _dynamic_dims(node) <= 1


def _is_conv1d(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a 1-D convolution (its weight is 3-D, the test ExecuTorch's ``Conv1dUnsqueezePass`` makes)."""
    weight = node.args[1] if len(node.args) > 1 else None
    return isinstance(weight, torch.fx.Node) and len(getattr(weight.meta.get("val"), "shape", ())) == 3


def _conv1d_reshapes_have_one_dynamic_dim(node: torch.fx.Node) -> bool:
    """Whether the reshapes XNNPACK wraps a 1-D convolution in have one dynamic dim at most (other convs have none)."""
    data = node.args[0]
    return not _is_conv1d(node) or (_dynamic_dims(node) <= 1 and _dynamic_dims(data) <= 1)


def _batch_norm1d_reshapes_have_one_dynamic_dim(node: torch.fx.Node) -> bool:
    """Whether a batch norm's input, when 3-D (the 1-D convolution XNNPACK decomposes it into), has one dynamic dim at most."""
    data = node.args[0]
    return len(getattr(data.meta.get("val"), "shape", ())) != 3 or _dynamic_dims(data) <= 1


def _is_exact_gelu(node: torch.fx.Node) -> bool:
    """Whether ``node`` is the erf GELU (``approximate="none"``), the only one XNNPACK computes."""
    return node.kwargs.get("approximate", "none") == "none"


def _refusing(original: Any, accepts: Callable[[torch.fx.Node], bool]) -> Any:
    """Wrap a config's ``check_constraints`` so it also refuses a node that ``accepts`` rejects."""

    @functools.wraps(original)
    def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:  # noqa: ANN001
        return original(self, node, ep) and accepts(node)

    check_constraints.__wrapped__ = original
    return check_constraints


@contextlib.contextmanager
def patch_xnnpack_unsqueeze_dynamic_dims() -> Iterator[None]:
    """Keep ``unsqueeze_copy`` with more than one dynamic output dim out of XNNPACK (ExecuTorch runs it itself).

    executorch 1.5.1's ``UnsqueezeCopyConfig.check_constraints``
    (backends/xnnpack/partition/config/generic_node_configs.py) accepts any
    trailing unsqueeze, but the serialiser (``operators/op_squeeze.py``) then
    fails on an output with two symbolic dims: "XNNPACK reshape only supports 1
    dynamic dimension". Mamba 2's chunked scan unsqueezes ``[batch, chunks, …]``
    tensors (Mamba 2, Bamba, FalconH1, Zamba2 …). The view-copy config already
    refuses such shapes; this adds the same check to unsqueeze, after the
    partitioner's own (a node it refuses stays refused). Delete when the
    partitioner checks it itself.
    """
    from executorch.backends.xnnpack.partition.config.generic_node_configs import UnsqueezeCopyConfig

    original = vars(UnsqueezeCopyConfig)["check_constraints"]
    with swap_attr(UnsqueezeCopyConfig, "check_constraints", _refusing(original, _output_has_one_dynamic_dim)):
        yield


def _one_valued(size: Any) -> Any:
    """``size`` as an int when its shape environment bounds its expression to one value, else ``size``."""
    if not isinstance(size, torch.SymInt) or size.node.is_constant():
        return size
    interval = size_range(size)
    if interval is None or not interval.is_singleton() or not interval.lower.is_integer:
        return size
    return int(interval.lower)


def with_one_valued_sizes(val: Any) -> Any:
    """A fake tensor like ``val`` (contiguous) whose sizes that can take one value only are ints; ``val`` itself
    when there are none (see ``patch_xnnpack_reshape_one_valued_sizes``)."""
    shape = list(val.shape)
    sizes = [_one_valued(size) for size in shape]
    if all(new is old for new, old in zip(sizes, shape, strict=True)):
        return val
    with val.fake_mode:
        return torch.empty(sizes, dtype=val.dtype, device=val.device)


@contextlib.contextmanager
def patch_xnnpack_reshape_one_valued_sizes() -> Iterator[None]:
    """XNNPACK's (un)squeeze serialiser counts as static a size whose bounds leave it one value.

    XNNPACK serialises an ``unsqueeze_copy`` or ``squeeze_copy`` as a static
    reshape with one dynamic dim at most (``operators/op_squeeze.py``, executorch
    1.5.1: "XNNPACK reshape only supports 1 dynamic dimension"), and the
    partitioner's check (``patch_xnnpack_unsqueeze_dynamic_dims``) counts the dims
    it sees. XNNPACK's preprocessing then retraces the partition
    (``FuseBatchNormPass``), and the sizes a convolution's meta function computes
    come back as expressions the export had reduced to a number. Model pattern:
    CvT's key and value projections (a stride-2 convolution and a batch norm over
    the token grid, then a class token) give ``((h - 3) // 32) + 2`` tokens, which
    is 2 for every height the bounds allow (19-34 px) and was 2 at partition
    time, so an unsqueeze of ``[batch, heads, tokens, head_dim]`` had two
    "dynamic" dims at serialisation. The patch hands the serialiser the node's
    value with each size that its bounds leave one value as that number (hfx
    checks the bounds before every call). Delete when XNNPACK's passes keep the
    sizes they were given.
    """
    import importlib

    importlib.import_module("executorch.backends.xnnpack.operators")  # importing it registers the visitors
    from executorch.backends.xnnpack.operators.node_visitor import _node_visitor_dict

    visitors = [visitor for target, visitor in _node_visitor_dict.items()
                if target in ("aten.unsqueeze_copy.default", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims")]

    def serialising_one_valued(define_node: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(define_node)
        def wrapped(self: Any, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
            val = node.meta.get("val")
            narrowed = with_one_valued_sizes(val) if isinstance(val, torch.Tensor) else val
            if narrowed is val:
                return define_node(self, node, *args, **kwargs)
            node.meta["val"] = narrowed
            try:
                return define_node(self, node, *args, **kwargs)
            finally:
                node.meta["val"] = val

        wrapped.__wrapped__ = define_node
        return wrapped

    with contextlib.ExitStack() as stack:
        for visitor in visitors:
            stack.enter_context(swap_attr(visitor, "define_node", serialising_one_valued(vars(visitor)["define_node"])))
        yield


@contextlib.contextmanager
def patch_xnnpack_conv1d_dynamic_dims() -> Iterator[None]:
    """Keep a 1-D convolution with more than one dynamic dim out of XNNPACK (ExecuTorch's portable kernel runs it).

    XNNPACK has no 1-D convolution: executorch 1.5.1's ``Conv1dUnsqueezePass``
    (backends/xnnpack/_passes/conv1d_unsqueeze_pass.py) rewrites it as
    ``unsqueeze_copy(-1) -> 2-D convolution -> squeeze_copy(-1)``, and the
    serialiser (``operators/op_squeeze.py``) fails on those reshapes when the
    3-D activation has two symbolic dims: "XNNPACK reshape only supports 1
    dynamic dimension". ``ConvolutionConfig.check_constraints``
    (partition/config/gemm_configs.py) does not check it. Audio encoders hit it
    in the feature extractor and the positional convolution over ``[batch,
    channels, frames]`` (wav2vec2, HuBERT, WavLM, Data2VecAudio, SEW …). A
    batch norm over such a tensor is the same 1-D convolution once
    ``DecomposeBatchNorm`` (``_passes/decompose_batch_norm.py``) makes it a 1x1
    depthwise one, and ``BatchNormConfig`` (partition/config/node_configs.py)
    does not check it either: the conformer convolution modules of Parakeet and
    LASR. The checks run after the partitioner's own. Delete when the
    partitioner checks it itself.
    """
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.config.node_configs import BatchNormConfig

    conv = vars(ConvolutionConfig)["check_constraints"]
    batch_norm = vars(BatchNormConfig)["check_constraints"]
    with (
        swap_attr(ConvolutionConfig, "check_constraints", _refusing(conv, _conv1d_reshapes_have_one_dynamic_dim)),
        swap_attr(BatchNormConfig, "check_constraints", _refusing(batch_norm, _batch_norm1d_reshapes_have_one_dynamic_dim)),
    ):
        yield


@contextlib.contextmanager
def patch_xnnpack_tanh_gelu() -> Iterator[None]:
    """Keep the tanh-approximated GELU out of XNNPACK (ExecuTorch's portable kernel computes it as asked).

    executorch 1.5.1's ``GeluConfig.check_constraints``
    (backends/xnnpack/partition/config/generic_node_configs.py) accepts
    ``gelu(approximate="tanh")``, but its serialiser (``operators/op_gelu.py``)
    drops ``approximate`` and XNNPACK computes the erf GELU: the tiny Gemma 2's
    logits then differ from eager by 8.7e-4 at logits of magnitude 1 (5e-4 at
    every position, 2.9e-6 once this patch keeps the op out). Models with
    ``hidden_act="gelu_pytorch_tanh"`` hit it (Gemma, Gemma 2/3, PaliGemma …).
    The check runs after the partitioner's own. Delete when the partitioner
    checks ``approximate``.
    """
    from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig

    original = vars(GeluConfig)["check_constraints"]
    with swap_attr(GeluConfig, "check_constraints", _refusing(original, _is_exact_gelu)):
        yield


def _input_is_4d(node: torch.fx.Node) -> bool:
    """Whether ``node``'s first input is a 4-D tensor."""
    value = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
    return isinstance(value, torch.Tensor) and value.dim() == 4


@contextlib.contextmanager
def patch_xnnpack_prelu_4d() -> Iterator[None]:
    """Keep a PReLU over a tensor that is not 4-D out of XNNPACK (ExecuTorch decomposes it).

    executorch 1.5.1's ``PreluConfig.check_constraints``
    (backends/xnnpack/partition/config/node_configs.py) checks only that the
    weight is a parameter, but XNNPACK computes PReLU in NHWC and its
    ``ChannelsLastTaggedReshapePass`` refuses any other rank: "Attempting to
    convert non-NHWC compatible node to NHWC". DAB-DETR's encoder applies
    ``nn.PReLU`` to ``[batch, tokens, channels]`` activations. The check runs
    after the partitioner's own, which also decides that the op is decomposed
    (to a ``where``) rather than kept whole. Delete when the partitioner checks
    the rank itself.
    """
    from executorch.backends.xnnpack.partition.config.node_configs import PreluConfig

    original = vars(PreluConfig)["check_constraints"]
    with swap_attr(PreluConfig, "check_constraints", _refusing(original, _input_is_4d)):
        yield


def _is_spatial_max_kept(node: torch.fx.Node) -> bool:
    """Whether ``max.dim`` keeps its dim and reduces dim 2 or 3 of its 4-D input: the max XNNPACK serialises."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return bool(keepdim) and isinstance(dim, int) and dim % 4 in (2, 3)


@contextlib.contextmanager
def patch_xnnpack_max_dim() -> Iterator[None]:
    """Keep a ``max.dim`` XNNPACK cannot serialise out of it (ExecuTorch's portable kernel runs it).

    executorch 1.5.1's ``MaxDimConfig.check_constraints`` (partition/config/node_configs.py)
    accepts any ``max.dim`` of a 4-D float tensor whose indices go unused, but its serialiser
    (``operators/op_max_dim.py``) takes only ``keepdim=True`` over dim 2 or 3 and fails
    otherwise: "amax.default only supports keep_dim == True". Hiera's mask-unit pooling
    (``max(dim=1)`` over ``[batch, units, tokens, hidden]``) hits it. The check runs after the
    partitioner's own. Delete when the partitioner checks what the serialiser takes.
    """
    from executorch.backends.xnnpack.partition.config.node_configs import MaxDimConfig

    original = vars(MaxDimConfig)["check_constraints"]
    with swap_attr(MaxDimConfig, "check_constraints", _refusing(original, _is_spatial_max_kept)):
        yield


def _stuck_partitions(graph: torch.fx.Graph, owner: Mapping[torch.fx.Node, int],
                      shared: Callable[[torch.fx.Node], bool]) -> set[int]:
    """The partitions on or after a cycle of the graph with each partition fused into one node (Kahn's leftovers).

    The edges out of a ``shared`` node (a constant, which ExecuTorch copies into each partition that uses it)
    are left out.
    """
    vertex = lambda node: owner.get(node, node)  # noqa: E731
    successors: dict[Any, set[Any]] = {}
    indegree: dict[Any, int] = {}
    for node in graph.nodes:
        indegree.setdefault(vertex(node), 0)
        if shared(node):
            continue
        for user in node.users:
            edge = (vertex(node), vertex(user))
            if edge[0] != edge[1] and edge[1] not in successors.setdefault(edge[0], set()):
                successors[edge[0]].add(edge[1])
                indegree[edge[1]] = indegree.get(edge[1], 0) + 1
    ready = [v for v, count in indegree.items() if count == 0]
    while ready:
        for successor in successors.get(ready.pop(), ()):
            indegree[successor] -= 1
            if indegree[successor] == 0:
                ready.append(successor)
    return {v for v, count in indegree.items() if count and isinstance(v, int)}


def _reached_again(members: set[torch.fx.Node], owner: Mapping[torch.fx.Node, int],
                   partitions: Mapping[int, Any], shared: Callable[[torch.fx.Node], bool]) -> set[torch.fx.Node]:
    """The nodes of ``members`` (a partition) that a path leaving it reaches, each other partition one fused node."""
    seen: set[torch.fx.Node] = set()
    fused: set[int] = set()
    reached: set[torch.fx.Node] = set()
    frontier = [user for node in members if not shared(node) for user in node.users if user not in members]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in members:
            reached.add(node)
        elif node in owner:  # a fused partition's outputs all depend on each of its inputs
            if owner[node] in fused:
                continue
            fused.add(owner[node])
            frontier.extend(u for n in partitions[owner[node]].nodes if not shared(n) for u in n.users)
            continue
        frontier.extend(node.users)
    return reached


def acyclic_partitions(partitions: list[Any], graph: torch.fx.Graph,
                       shared: Callable[[torch.fx.Node], bool] = lambda node: False) -> list[Any]:
    """``partitions`` (``torch.fx`` ``Partition``s, each convex), split until fusing them leaves the graph acyclic.

    A partition that a path through other partitions leads back into is split in two: the nodes such a path
    reaches (and everything after them in it) and the rest. Both halves stay convex and the second no longer
    feeds the first; this repeats until no partition is on a cycle. A ``shared`` node (a constant) goes with the
    half that uses it. Acyclic partitions come back as they were.

    Example: ``a -> c`` and ``b -> (refused) -> d``, partitioned ``{a, d}`` and ``{b, c}``, each feeding the other:
        >>> from torch.fx.passes.infra.partitioner import Partition
        >>> g = torch.fx.Graph()
        >>> x = g.placeholder("x")
        >>> a, b = (g.call_function(torch.relu, (x,), name=name) for name in "ab")
        >>> c = g.call_function(torch.relu, (a,), name="c")
        >>> d = g.call_function(torch.relu, (g.call_function(torch.neg, (b,)),), name="d")
        >>> _ = g.output((c, d))
        >>> split = acyclic_partitions([Partition(0, [a, d]), Partition(1, [b, c])], g)
        >>> sorted(sorted(node.name for node in partition.nodes) for partition in split)
        [['a'], ['b', 'c'], ['d']]
    """
    parts = {part.id: part for part in partitions}
    next_id = max(parts, default=-1) + 1
    order = {node: i for i, node in enumerate(graph.nodes)}  # splitting leaves the graph as it is
    while True:
        owner = {node: pid for pid, part in parts.items() for node in part.nodes}
        stuck = _stuck_partitions(graph, owner, shared)
        for pid in sorted(stuck):
            members = set(parts[pid].nodes)
            reached = _reached_again(members, owner, parts, shared)
            if reached:
                break
        else:
            return list(parts.values())
        constants = {node for node in members if shared(node)
                     and all(user in reached for user in node.users if user in members)}
        kept = sorted(members - reached - constants, key=order.get)
        moved = sorted(reached | constants, key=order.get)
        parts[pid] = type(parts[pid])(id=pid, nodes=kept)
        parts[next_id] = type(parts[pid])(id=next_id, nodes=moved)
        next_id += 1


def _generating_acyclic_partitions(original: Any) -> Any:
    """Wrap ``ConfigerationBasedPartitioner.generate_partitions`` so that its partitions fuse without a cycle."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import is_constant_data

    @functools.wraps(original)
    def generate_partitions(self, ep: Any) -> Any:  # noqa: ANN001
        partitions = original(self, ep)
        return acyclic_partitions(partitions, ep.graph_module.graph,
                                  lambda node: node.op == "placeholder" and is_constant_data(ep, node))

    generate_partitions.__wrapped__ = original
    return generate_partitions


@contextlib.contextmanager
def patch_xnnpack_acyclic_partitions() -> Iterator[None]:
    """Split an XNNPACK partition that other partitions lead back into, so that fusing the partitions leaves no cycle.

    executorch 1.5.1's ``GroupBasedPartitioner`` (exir/backend/canonical_partitioners/group_partitioner.py)
    merges partitions greedily, the latest first, as long as the merged nodes stay convex (no path leaves them and
    comes back), but it does not check the partitions against each other: two convex partitions can each feed the
    other through nodes XNNPACK refuses. Its order would rule that out for single nodes, but a linear's group holds
    its weight, and the weight's other users then block the merges that order expects. PegasusX applies the same
    projections, ``fc1``/``fc2`` and layer norms to its global tokens and its local blocks: the partition of layer
    0's ``out_proj`` over the local tokens and its residual add also took ``out_proj`` over the global tokens, whose
    attention another partition computed after the add's layer norm (a refused op), and fusing them failed: "Invalid
    partition, found dependency cycles" (``fuse_as_graphmodule``; pytorch/executorch#18397, in 1.5.1, checks each
    merge from both sides, not this). This splits such a partition in two (``acyclic_partitions``); partitions without
    a cycle are kept as they are. Delete when the partitioner keeps its partitions acyclic.
    """
    from executorch.exir.backend.canonical_partitioners.config_partitioner import ConfigerationBasedPartitioner

    original = vars(ConfigerationBasedPartitioner)["generate_partitions"]
    with swap_attr(ConfigerationBasedPartitioner, "generate_partitions", _generating_acyclic_partitions(original)):
        yield


# --- torch's SDPA decomposition ------------------------------------------------------------------

_FLASH_FOR_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def laid_out_like(tensor: torch.Tensor, like: torch.Tensor, /) -> torch.Tensor:
    """``tensor``'s values in the memory layout ``torch.empty_like(like)`` has (its dims in the same stride order).

    Example:
        >>> like = torch.zeros(2, 7, 4, 16).transpose(1, 2)
        >>> laid_out_like(torch.ones(2, 4, 7, 16), like).stride() == like.stride()
        True
    """
    physical, _ = compute_elementwise_output_logical_to_physical_perm(like)
    logical = [physical.index(dim) for dim in range(len(physical))]
    return tensor.permute(physical).contiguous().permute(logical)


def flash_attention_for_cpu_like_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,  # noqa: FBT001, FBT002 - the op's own schema
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` decomposed to the math kernel, output laid out like ``query``.

    The kernel and its meta function return ``empty_like(query)``; torch's own
    decomposition (torch/_decomp/decompositions.py) returns the layout of
    ``nn.MultiheadAttention``'s queries, (L, N, H, E), whatever the query's is.
    """
    torch._check(dropout_p == 0.0, lambda: f"dropout probability must be zero, got {dropout_p}")
    output, attn = torch.ops.aten._scaled_dot_product_attention_math.default(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        dropout_mask=None,
        scale=scale,
        enable_gqa=query.size(1) != key.size(1),
    )
    return laid_out_like(output, query), attn


@functools.cache
def _keeps_the_query_layout(decomposition: Callable[..., Any]) -> bool:
    """Whether ``decomposition`` lays a Hugging Face query's output out as the kernel does (one tiny call, cached)."""
    query = torch.zeros(1, 3, 2, 4).transpose(1, 2)  # (N, H, L, E) viewed over (N, L, H, E) memory
    return decomposition(query, query, query)[0].stride() == torch.empty_like(query).stride()


@contextlib.contextmanager
def patch_sdpa_decomposition_layout() -> Iterator[None]:
    """Decompose CPU flash attention into a tensor laid out as the kernel lays it out, while ExecuTorch lowers.

    ExecuTorch's ``to_edge`` (executorch 1.5.1) decomposes
    ``scaled_dot_product_attention`` through ``_scaled_dot_product_flash_attention_for_cpu``,
    whose decomposition in torch 2.13 (torch/_decomp/decompositions.py) returns an
    (L, N, H, E) memory layout, while the kernel and its meta function (what
    ``torch.export`` traced) lay the output out like the query. Hugging Face
    attention views (N, L, H, E) as (N, H, L, E), so ``transpose(1, 2).contiguous()``
    after SDPA was a no-op at export and left no node, and a later ``view`` is legal
    on the traced layout only: ``transformers.pytorch_utils.Conv1D``
    (``x.view(-1, x.size(-1))``; GPT-2, ImageGPT, OpenAI GPT, Decision Transformer,
    CLVP) failed with "Cannot view a tensor with shape [batch, sequence, 64] and
    strides (64, 64*batch, 1)" (pytorch/pytorch#141107, #136543); models that
    ``reshape`` instead (Llama) lowered. This swaps the table entry, which
    ExecuTorch reads when it builds its table, for one whose output follows the
    query's layout as the kernel's does (for ``nn.MultiheadAttention``'s queries that
    is torch's layout). It steps aside when torch's decomposition already keeps a
    Hugging Face query's layout. Delete when torch's decomposition keeps the kernel's layout.
    """
    from torch._decomp import decomposition_table

    decomposition = decomposition_table.get(_FLASH_FOR_CPU)
    if decomposition is not None and _keeps_the_query_layout(decomposition):
        yield
        return
    with swap_item(decomposition_table, _FLASH_FOR_CPU, flash_attention_for_cpu_like_query):
        yield


# --- memory planning -----------------------------------------------------------------------------

# The most points of the box of dim values an upper bound is evaluated at; a larger box keeps ExecuTorch's bound.
MAX_BOUND_POINTS = 1 << 20


class _Unsupported(Exception):
    """An expression this evaluator does not know; ExecuTorch's own bound is kept for it."""


def _floor_div(a: Any, b: Any, invalid: list[Any]) -> Any:
    invalid.append(np.equal(b, 0))
    return np.floor_divide(a, np.where(np.equal(b, 0), 1, b))


def _mod(a: Any, b: Any, invalid: list[Any]) -> Any:
    invalid.append(np.equal(b, 0))
    return np.mod(a, np.where(np.equal(b, 0), 1, b))


def _reduce(function: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    return lambda *args: functools.reduce(function, args)


# sympy / torch sympy function -> numpy version over integer arrays; a divisor of 0 marks the point invalid.
_NARY: Mapping[type, Callable[..., Any]] = {
    sympy.Add: _reduce(operator.add),
    sympy.Mul: _reduce(operator.mul),
    sympy.Max: _reduce(np.maximum),
    sympy.Min: _reduce(np.minimum),
    symfn.Max: _reduce(np.maximum),
    symfn.Min: _reduce(np.minimum),
}
_DIVIDING: Mapping[type, Callable[..., Any]] = {
    symfn.FloorDiv: _floor_div,
    symfn.CleanDiv: _floor_div,
    symfn.Mod: _mod,
    symfn.PythonMod: _mod,
    sympy.Mod: _mod,
}


def _evaluated(expr: sympy.Expr, values: Mapping[sympy.Symbol, Any], invalid: list[Any]) -> Any:
    """``expr`` at every point of ``values`` (broadcasting integer arrays); raises ``_Unsupported``."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return values[expr]
    args = [_evaluated(arg, values, invalid) for arg in expr.args]
    if type(expr) in _NARY:
        return _NARY[type(expr)](*args)
    if type(expr) in _DIVIDING:
        return _DIVIDING[type(expr)](*args, invalid)
    if isinstance(expr, symfn.ModularIndexing):
        return _mod(_floor_div(args[0], args[1], invalid), args[2], invalid)
    if isinstance(expr, (sympy.Pow, symfn.PowByNatural)) and expr.args[1].is_Integer and int(expr.args[1]) >= 0:
        return args[0] ** int(expr.args[1])
    raise _Unsupported(type(expr).__name__)


def exact_upper_bound(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any],
                      within: Mapping[sympy.Expr, int] | None = None) -> int | None:
    """The largest value ``expr`` takes at integer points of ``ranges`` where no divisor is 0, or ``None``.

    ``within`` (``{expression: its upper bound}``) leaves out the points where an
    expression over ``expr``'s symbols only is above its bound.

    ``None`` when a symbol has no finite range, the box has more than
    ``MAX_BOUND_POINTS`` points, or ``expr`` uses a function this evaluator does
    not know. Interval arithmetic (``bound_sympy``) bounds each operand on its
    own, so ``P // (P // 2)`` (which is 2 for every even ``P``) gets the bound of
    ``P``; evaluating at every point gives the exact maximum.

    Example:
        >>> p = sympy.Symbol("p", integer=True, positive=True)
        >>> from torch.utils._sympy.value_ranges import ValueRanges
        >>> exact_upper_bound(symfn.FloorDiv(2 * p, symfn.FloorDiv(2 * p, 2)), {p: ValueRanges(1, 64)})
        2
    """
    symbols = sorted(expr.free_symbols, key=str)
    spans = []
    for symbol in symbols:
        bounds = ranges.get(symbol)
        lower, upper = (getattr(bounds, "lower", None), getattr(bounds, "upper", None))
        if not (isinstance(lower, sympy.Integer) and isinstance(upper, sympy.Integer)):
            return None
        spans.append((int(lower), int(upper)))
    if math.prod(hi - lo + 1 for lo, hi in spans) > MAX_BOUND_POINTS:
        return None
    grid = np.meshgrid(*(np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in spans), indexing="ij", sparse=True)
    invalid: list[Any] = []
    try:
        values = np.broadcast_to(_evaluated(expr, dict(zip(symbols, grid)), invalid), np.broadcast_shapes(
            *(g.shape for g in grid)))
        for bounded, upper in (within or {}).items():
            if bounded.free_symbols and bounded.free_symbols <= set(symbols):
                invalid.append(np.greater(_evaluated(bounded, dict(zip(symbols, grid)), invalid), upper))
    except _Unsupported:
        return None
    valid = ~functools.reduce(np.logical_or, invalid, np.zeros(values.shape, dtype=bool))
    return int(values[valid].max()) if valid.any() else None


def _tightened(original: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap ExecuTorch's ``eval_upper_bound`` so that it returns the exact bound where one can be computed."""
    cache: dict[tuple[sympy.Expr, int], int | None] = {}

    @functools.wraps(original)
    def eval_upper_bound(maybe_symint: Any) -> int:
        if not isinstance(maybe_symint, torch.SymInt):
            return original(maybe_symint)
        node = maybe_symint.node
        key = (node.expr, id(node.shape_env))
        if key not in cache:
            cache[key] = exact_upper_bound(node.expr, node.shape_env.var_to_range)
        exact = cache[key]
        return original(maybe_symint) if exact is None else exact

    eval_upper_bound.__wrapped__ = original
    return eval_upper_bound


@contextlib.contextmanager
def patch_exact_upper_bounds() -> Iterator[None]:
    """Plan ExecuTorch's memory at the exact upper bound of each symbolic size, not an interval-arithmetic one.

    executorch 1.5.1 plans every tensor at ``eval_upper_bound`` of each dim
    (exir/sym_util.py, called by ``ConstraintBasedSymShapeEvalPass`` and the
    memory-planning allocs), which is ``bound_sympy``: interval arithmetic that
    bounds each operand on its own. Swin's window partition views a padded grid
    ``P`` as ``P // (P // 2)`` windows of 2 (always 2), whose bound is that of
    ``P``, and the planned arena of the tiny zoo Swin at batch 4 and 512 x 512
    pixels was 108 TB (``std::bad_alloc`` at load). Where the interval is
    unbounded, ``eval_upper_bound`` falls back to the size at the trace, which is
    no bound: Swin's ``(batch * (2 * 2 // 2)) // 2`` windows was planned for
    batch 2 and failed at batch 3 ("Attempted to resize a bounded tensor", 0x1,
    in ``et_view``). This evaluates each size at
    every integer point of its symbols' ranges (up to ``MAX_BOUND_POINTS``) and
    plans at the largest value, which is still an upper bound for every input
    the bounds allow; where it cannot, ExecuTorch's own bound is kept. Delete
    when ExecuTorch bounds correlated sizes tightly.
    """
    from executorch.exir import sym_util
    from executorch.exir.passes import sym_shape_eval_pass

    tight = _tightened(vars(sym_util)["eval_upper_bound"])
    with swap_attr(sym_util, "eval_upper_bound", tight), swap_attr(sym_shape_eval_pass, "eval_upper_bound", tight):
        yield


# --- unbacked sizes --------------------------------------------------------------------------------

# Rounds of bounding sides of the graph's equalities from bounds found in the round before (one per link of a chain:
# the patches ``s`` bound ``t * h * w``, which bounds ``h * w``, which bounds ``(h // m) * (w // m) * m**2`` …).
UNBACKED_BOUND_ROUNDS = 4
# The most factors of one product whose sub-products get bounds (2**n - 1 of them).
MAX_BOUNDED_FACTORS = 8


def _interval_end(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any], end: str) -> int | None:
    """The finite ``end`` (``"lower"`` or ``"upper"``) interval arithmetic gives ``expr`` in ``ranges``, or ``None``."""
    from torch.utils._sympy.value_ranges import bound_sympy

    try:
        value = getattr(bound_sympy(expr, dict(ranges)), end)
    except Exception:  # noqa: BLE001 - a function bound_sympy does not know: no bound
        return None
    return int(value) if isinstance(value, sympy.Integer) else None


def _upper(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> int | None:
    """The finite upper bound interval arithmetic gives ``expr`` in ``ranges``, or ``None``."""
    return _interval_end(expr, ranges, "upper")


def _lower(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> int | None:
    """The finite lower bound interval arithmetic gives ``expr`` in ``ranges``, or ``None``."""
    return _interval_end(expr, ranges, "lower")


def _never_negative(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> bool:
    lower = _lower(expr, ranges)
    return lower is not None and lower >= 0


def _nonnegative_products(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> list[tuple[int, list[sympy.Expr]]]:
    """``expr`` as a sum of a constant and products, each ``(positive coefficient, [factors never below 0])``
    (``h**2`` is ``[h, h]``; the constant is ``(constant, [])``); empty when it is not one."""
    products = []
    for term in sympy.Add.make_args(expr):
        if term.is_Integer:
            products.append((int(term), []))
            continue
        coefficient, factors = 1, []
        for factor in sympy.Mul.make_args(term):
            base, power = factor.as_base_exp() if isinstance(factor, sympy.Pow) else (factor, sympy.Integer(1))
            if factor.is_Integer:
                coefficient *= int(factor)
            elif power.is_Integer and int(power) > 0 and _never_negative(base, ranges):
                factors += [base] * int(power)
            else:
                return []
        if coefficient <= 0 or not factors:
            return []
        products.append((coefficient, factors))
    return products


def _proxied(expr: sympy.Expr, bounds: Mapping[sympy.Expr, int]) -> tuple[sympy.Expr, dict[sympy.Symbol, Any]]:
    """``expr`` with each bounded sub-expression a symbol ranging up to its bound, and those symbols' ranges."""
    from torch.utils._sympy.value_ranges import ValueRanges

    proxies = {bounded: sympy.Symbol(f"hfx_bounded_{index}", integer=True, nonnegative=True)
               for index, bounded in enumerate(bounds)}
    return expr.xreplace(proxies), {proxy: ValueRanges(0, bounds[bounded]) for bounded, proxy in proxies.items()}


class UnbackedBounds:
    """Upper bounds of a shape environment's unbacked sizes, read from the runtime asserts its graph holds.

    An equality ``Eq(s, t0*h0*w0 + t1*h1*w1)`` (the packed patches of every
    image: ``s`` is a bounded input dim, ``t, h, w`` are read from ``grid_thw``'s
    data) bounds each product of factors never below 0 by the bound of ``s``, and
    each part of a product by that bound over the other factors' least values,
    taken as at least 1 (``Ne(x, 0)`` asserts raise a factor's least value to 1);
    a bounded side then bounds the other side of further equalities. A factor
    that may be 0 (an image of ``t = 0`` frames) leaves its partners unbounded:
    they are planned as if it were 1, as ExecuTorch plans an unbounded backed
    size at its example value, and a larger size fails at run time with
    "Attempted to resize a bounded tensor" instead of being written.
    """

    def __init__(self, shape_env: Any) -> None:
        from torch.utils._sympy.value_ranges import ValueRanges

        asserts = [ra.expr for ras in shape_env.deferred_runtime_asserts.values() for ra in ras]
        self.ranges: dict[sympy.Symbol, Any] = dict(shape_env.var_to_range)
        self.bounds: dict[sympy.Expr, int] = {}  # expression (not a symbol) -> upper bound
        least: dict[sympy.Expr, int] = {}
        for fact in asserts:
            if isinstance(fact, sympy.Ne) and sympy.S.Zero in fact.args:  # a product that is not 0: no factor is
                nonzero = fact.args[0] if fact.args[1] == 0 else fact.args[1]
                products = _nonnegative_products(nonzero, self.ranges)
                for factor in products[0][1] if len(products) == 1 else ():
                    least[factor] = 1
                    if factor.is_Symbol and factor in self.ranges:
                        self.ranges[factor] = self.ranges[factor] & ValueRanges(1, self.ranges[factor].upper)
        equalities = [fact.args for fact in asserts if isinstance(fact, sympy.Eq)]
        for _ in range(UNBACKED_BOUND_ROUNDS):
            changed = False
            for pair in equalities:
                for side, other in (pair, pair[::-1]):
                    bound = self.upper(other)
                    if bound is not None:
                        changed |= self._bound(side, bound, least)
            if not changed:
                break

    def _least(self, factor: sympy.Expr, least: Mapping[sympy.Expr, int]) -> int:
        return max(1, least.get(factor, 0), _lower(factor, self.ranges) or 0)

    def _bound(self, side: sympy.Expr, bound: int, least: Mapping[sympy.Expr, int]) -> bool:
        """Bound ``side`` and the parts of its products by ``bound``; whether a bound got tighter."""
        from torch.utils._sympy.value_ranges import ValueRanges

        changed = self._tighten(side, bound) if not side.is_Symbol else False
        products = _nonnegative_products(side, self.ranges)
        constant = sum(coefficient for coefficient, factors in products if not factors)
        if constant < 0:
            return changed
        bound -= constant
        for coefficient, factors in products:
            if not factors or len(factors) > MAX_BOUNDED_FACTORS:
                continue
            for size in range(1, len(factors) + 1):
                for picked in {sympy.Mul(*c): c for c in itertools.combinations(factors, size)}.values():
                    rest = list(factors)
                    for factor in picked:
                        rest.remove(factor)
                    part = bound // (coefficient * math.prod(self._least(f, least) for f in rest))
                    product = sympy.Mul(*picked)
                    base, power = product.as_base_exp()
                    if base.is_Symbol and base in self.ranges and power.is_Integer:
                        upper = int(math.isqrt(part) if int(power) == 2 else math.floor(part ** (1 / int(power))))
                        while (upper + 1) ** int(power) <= part:
                            upper += 1
                        current = self.ranges[base]
                        if not (isinstance(current.upper, sympy.Integer) and int(current.upper) <= upper):
                            self.ranges[base] = ValueRanges(current.lower, max(upper, int(current.lower)))
                            changed = True
                    elif not product.is_Symbol:
                        changed |= self._tighten(product, part)
        return changed

    def _tighten(self, expr: sympy.Expr, bound: int) -> bool:
        if self.bounds.get(expr, bound + 1) <= bound:
            return False
        self.bounds[expr] = bound
        return True

    def upper(self, expr: sympy.Expr) -> int | None:
        """The least of the bounds interval arithmetic and the exact evaluation give ``expr``, or ``None``."""
        proxied, proxy_ranges = _proxied(expr, self.bounds)
        found = [_upper(proxied, {**self.ranges, **proxy_ranges}), exact_upper_bound(expr, self.ranges, self.bounds)]
        found = [bound for bound in found if bound is not None]
        return min(found) if found else None


def _bounding_unbacked(original: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap ``eval_upper_bound`` so that an unbacked size without a finite bound gets one from ``UnbackedBounds``."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    # per shape environment: its bounds, and the bound found for each size (ExecuTorch asks for one many times)
    found: dict[int, tuple[Any, UnbackedBounds, dict[sympy.Expr, int | None]]] = {}

    @functools.wraps(original)
    def eval_upper_bound(maybe_symint: Any) -> int:
        if not isinstance(maybe_symint, torch.SymInt) or not free_unbacked_symbols(maybe_symint.node.expr):
            return original(maybe_symint)
        shape_env, expr = maybe_symint.node.shape_env, maybe_symint.node.expr
        if _upper(expr, shape_env.var_to_range) is not None:
            return original(maybe_symint)
        if found.get(id(shape_env), (None,))[0] is not shape_env:
            found[id(shape_env)] = (shape_env, UnbackedBounds(shape_env), {})
        _, bounds, known = found[id(shape_env)]
        if expr not in known:
            known[expr] = bounds.upper(expr)
        return original(maybe_symint) if known[expr] is None else known[expr]

    eval_upper_bound.__wrapped__ = original
    return eval_upper_bound


@contextlib.contextmanager
def patch_unbacked_upper_bounds() -> Iterator[None]:
    """Plan an unbacked size (read from a tensor's data) at the bound the graph's runtime asserts give it.

    executorch 1.5.1's ``eval_upper_bound`` (exir/sym_util.py) bounds a size by
    the ranges of its symbols alone, and an unbacked symbol has no hint to fall
    back on: "Cannot evaluate a finite upper bound for symbolic expression u159
    (int_oo) and no trace hint is available" in ``ConstraintBasedSymShapeEvalPass``
    (``to_executorch``) for any tensor outside the XNNPACK delegate sized by one.
    Model pattern: vision towers that read each image's ``t, h, w`` from
    ``grid_thw``'s data (HunYuan-VL's position table resampled to ``h x w`` and
    repeated ``t`` times; MiniMax-M3-VL's ``get_vision_position_ids`` aranges),
    whose only bound is the graph's assert that the images' ``t * h * w`` sum to
    the packed patches, a bounded input dim. ``UnbackedBounds`` reads bounds
    from those asserts; a size it cannot bound keeps ExecuTorch's error. Delete
    when ExecuTorch bounds unbacked sizes by the shape environment's runtime
    asserts.
    """
    from executorch.exir import sym_util
    from executorch.exir.passes import sym_shape_eval_pass

    bounding = _bounding_unbacked(vars(sym_util)["eval_upper_bound"])
    with swap_attr(sym_util, "eval_upper_bound", bounding), swap_attr(sym_shape_eval_pass, "eval_upper_bound", bounding):
        yield


# --- tensor specs ----------------------------------------------------------------------------------

# The modules that bind executorch.exir.tensor's ``dim_order_from_stride`` under their own name.
_DIM_ORDER_USERS = ("executorch.exir.tensor", "executorch.exir.tensor_layout", "executorch.exir.emit._emitter",
                    "executorch.exir.passes.replace_view_copy_with_view_pass",
                    "executorch.backends.native.serialization.graph_serialize")


def stable_dim_order(stride: tuple[Any, ...]) -> tuple[int, ...]:
    """The dims from the largest stride down, two strides whose order is not known for every size kept as they are.

    >>> stable_dim_order((1, 12, 4))
    (1, 2, 0)
    """
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    def order(a: int, b: int) -> int:
        return -1 if guard_or_false(stride[a] > stride[b]) else 1 if guard_or_false(stride[a] < stride[b]) else 0

    return tuple(sorted(range(len(stride)), key=functools.cmp_to_key(order)))


def _dim_order_or_stable(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``original``, or ``stable_dim_order`` where ``original`` cannot order strides of data-dependent sizes."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    @functools.wraps(original)
    def dim_order_from_stride(stride: Any) -> Any:
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            return stable_dim_order(tuple(stride))

    return dim_order_from_stride


@contextlib.contextmanager
def patch_dim_order_of_data_dependent_strides() -> Iterator[None]:
    """Order the dims of a tensor whose strides hold a data-dependent size without guarding on its value.

    executorch 1.5.1's ``dim_order_from_stride`` (exir/tensor.py) sorts a tensor's strides when it
    builds the tensor's spec; for a stride such as ``8 * u0`` against ``8`` (a ``[2, u0, 8]``
    tensor, ``u0`` the row count of a boolean index) its fallback compares the values, and
    ``to_executorch`` fails: "GuardOnDataDependentSymNode: Could not guard on data-dependent
    expression 8*u11 < 8". Only ``u0 == 0`` would order them otherwise, where the tensor is
    empty and any order is its layout. Where the original fails, two strides whose order is
    not known keep their order (``stable_dim_order``): the contiguous layout torch.export
    traced. UltraVBERT's image rows (masked LM with images) hit it. Delete when ExecuTorch
    orders such strides itself.
    """
    import importlib

    with contextlib.ExitStack() as stack:
        for name in _DIM_ORDER_USERS:
            module = importlib.import_module(name)
            original = vars(module)["dim_order_from_stride"]
            stack.enter_context(swap_attr(module, "dim_order_from_stride", _dim_order_or_stable(original)))
        yield


def _symbolic_view_of_a_static_base(node: torch.fx.Node) -> bool:
    """Whether ``node`` views a tensor of static shape into a shape torch writes with symbols."""
    base = node.args[0] if node.args else None
    value, base_value = node.meta.get("val"), getattr(base, "meta", {}).get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(base_value, torch.Tensor):
        return False
    return (all(isinstance(size, int) for size in base_value.shape)
            and any(isinstance(size, torch.SymInt) for size in value.shape))


@contextlib.contextmanager
def patch_view_copies_of_static_bases_kept() -> Iterator[None]:
    """Keep a ``view_copy`` a copy where it views a tensor of static shape into a shape written with symbols.

    executorch 1.5.1's ``ReplaceViewCopyWithViewPass`` (in ``to_executorch``) makes every
    ``view_copy`` a view sharing its base's memory plan, and refuses one whose shape is dynamic
    over a static base: "_ViewSpec is incompatible with its base on creation. It has
    shape_dynamism=1, but its base has shape_dynamism=0". PVT's position embeddings (a
    parameter) are viewed by sizes computed from the image's, whose product torch knows to be the
    parameter's but writes with the image's symbols. Such a node stays a ``view_copy``: the same
    values, one small copy. Delete when the pass gives such a view a static spec.
    """
    from executorch.exir.passes import replace_view_copy_with_view_pass as views

    original = vars(views)["_is_view_copy"]

    def is_view_copy(node: torch.fx.Node) -> bool:
        return original(node) and not _symbolic_view_of_a_static_base(node)

    with swap_attr(views, "_is_view_copy", is_view_copy):
        yield


# --- empty tensors of a dynamic size ----------------------------------------------------------------


def _symbolic_empty(op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether an edge ``empty.memory_format`` call has a symbolic size and a contiguous (or no) memory format."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ProxyValue

    if op is not exir_ops.edge.aten.empty.memory_format or not args:
        return False
    contiguous = kwargs.get("memory_format") in (None, torch.contiguous_format, torch.preserve_format)
    return contiguous and any(isinstance(size, ProxyValue) for size in args[0])


@contextlib.contextmanager
def patch_symbolic_empties_as_zeros() -> Iterator[None]:
    """Give an ``empty`` tensor of a dynamic size as a ``full`` of zeros, so that its size stays dynamic.

    executorch 1.5.1's ``MemoryFormatOpsPass`` (in ``to_edge``) turns ``aten.empty.memory_format``
    (``SymInt[] size``) into ``dim_order_ops._empty_dim_order``, whose schema takes ``int[] size``:
    tracing it asks each symbolic size for an int, and torch specialises the dim to its traced
    size for the whole program (``set_replacement s99 = 2``). The ``.pte`` was planned for the
    capture's batch and refused another at ``set_inputs``. transformers fills buffers made with
    ``torch.empty(batch, ...)`` in 360-odd places (RF-DETR's two-stage proposals, DeepSeek-V2's
    latent keys). An empty tensor's values are unspecified, so zeros are one; ``full`` takes
    ``SymInt[]`` and has an ExecuTorch kernel. An ``empty`` of static size or another memory format
    is converted as before. Delete when ``_empty_dim_order`` takes ``SymInt[] size``.
    """
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass

    original = vars(MemoryFormatOpsPass)["call_operator"]

    def call_operator(self: Any, op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], meta: Any) -> Any:
        if _symbolic_empty(op, args, kwargs):
            kept = {key: value for key, value in kwargs.items() if key in ("dtype", "layout", "device", "pin_memory")}
            return original(self, exir_ops.edge.aten.full.default, (args[0], 0), kept, meta)
        return original(self, op, args, kwargs, meta)

    with swap_attr(MemoryFormatOpsPass, "call_operator", call_operator):
        yield


# The patches ``lower_to_pte`` enters around ExecuTorch's lowering (``to_edge_transform_and_lower``,
# ``to_executorch``), in order. Read, extend or replace: ``lower_to_pte(patches=(*PTE_PATCHES, my_patch))``.
PTE_PATCHES: tuple[Patch, ...] = (
    patch_edge_verifier_sym_functions,
    patch_edge_validator_list_returns,
    patch_edge_decomposition_table,
    patch_xnnpack_unsqueeze_dynamic_dims,
    patch_xnnpack_reshape_one_valued_sizes,
    patch_xnnpack_conv1d_dynamic_dims,
    patch_xnnpack_tanh_gelu,
    patch_xnnpack_max_dim,
    patch_xnnpack_prelu_4d,
    patch_xnnpack_acyclic_partitions,
    patch_sdpa_decomposition_layout,
    patch_exact_upper_bounds,
    patch_unbacked_upper_bounds,
    patch_dim_order_of_data_dependent_strides,
    patch_view_copies_of_static_bases_kept,
    patch_symbolic_empties_as_zeros,
    patch_export_pass_skips_unchanged_retraces,
    patch_bilinear_patterns_not_built_when_kept_whole,
    patch_decompositions_in_one_retrace,
    patch_decompositions_skipped_when_nothing_decomposes,
    patch_edge_dtype_check_reads_metadata,
)
