"""The ExecuTorch runtime: ``lower_to_pte`` and ``PteProgram``, a ``.pte`` program delegated to XNNPACK.

ExecuTorch plans the memory of every tensor when the program is built, at the
upper bound of each dynamic dim, and the runtime cannot grow a tensor past it
(error 0x12, "Attempted to resize a bounded tensor"). An unbounded dim is
planned at its trace size instead, so a program captured at batch 2 fails at
batch 3. ``lower_to_pte`` therefore gives every dynamic dim a finite upper
bound (``max_sizes``, with defaults below), plans the program for it and
records it in ``io.bounds``: ``hfx._contract`` rejects a larger input with an
``InputError`` that names the dim before the runtime sees it.

The bounds live in the shape environment that every tensor of an
``ExportedProgram`` shares, not in its ``range_constraints`` (narrowing a copy
of those changes nothing in the plan). So ``hfx.export`` exports the graph
once more, from ``exported.program.module()`` with the narrowed dims: a new
program with its own shape environment, which the lowering may change at will
while the ``Exported`` stays as it was. In-place input writes (a static cache)
become trailing outputs first (``with_updates_as_outputs``).

ExecuTorch's bugs are worked around by the patches of ``_executorch_fixes``
(``PTE_PATCHES``, the ``patches`` option), entered only while ExecuTorch lowers.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._capture.dynamic_shapes import dim_sizes
from hfx._export.example_inputs import example_kwargs
from hfx._export.torch_shapes import derived_dim
from hfx._export.updates import for_runtime
from hfx.backends._lowering_speed import lowering_speedups
from hfx._contract import FlatCall, call
from hfx._errors import InputError, LoweringError
from hfx._kept_positions import KEPT_DIM
from hfx._lift import per_component
from hfx._mapped_pages import release_copied_pages
from hfx._records import Capture, Components, DynamicShapes, Exported, IoSpec
from hfx.backends._common import (
    as_exported,
    captured_output,
    check_threads,
    first_line,
    fix_names,
    fixes_option,
    lowering_error,
    require,
    root_cause,
    with_log,
)
from hfx.backends._empty_cats import empty_cats_as_zeros
from hfx.backends._executorch_dtypes import long_scatter_indices
from hfx.backends._executorch_fixes import PTE_PATCHES
from hfx.backends._executorch_generation_bounds import with_generation_max_sizes
from hfx.backends._executorch_threads import loading_on_threads
from hfx.backends._executorch_rewrites import XNNPACK_REWRITES, PteRewrite, as_edge_passes
from hfx.backends._size_arithmetic import integer_powers_as_products, remainders_of_signed_sizes
from hfx.patches import Patch, with_patches
from hfx._serial import one_at_a_time

RUNTIME = "pte"

# Upper bounds a dim gets when ``max_sizes`` does not name it; any other dim gets
# min(its export bound, DEFAULT_MAX_SIZE). The runtime allocates the memory planned
# for them at load, and attention makes that grow as batch * sequence**2: the tiny
# zoo Llama plans 58 MiB at (4, 512) but 454 MiB at (8, 1024) (docs/runtimes/executorch.md).
# A waveform's dim counts samples: 512 would be 32 ms at 16 kHz. It gets up to 10 s, as many samples as keep the
# frames its model makes of them (every output size computed from it alone) within DEFAULT_MAX_SIZE: a 320x
# feature encoder (wav2vec2) plans 10 s, the zoo's 10x one 5139 samples (its attention over 16 000 frames
# asked for more memory than the machine has: std::bad_alloc at load).
DEFAULT_MAX_SIZES: Mapping[str, int] = MappingProxyType({"batch": 4, "audio_length": 160_000})
_SAMPLE_DIMS = frozenset({"audio_length"})
DEFAULT_MAX_SIZE = 512

_METHOD = "forward"

# Logger namespaces whose records a lowering keeps for its error message instead of printing them.
_QUIET_LOGGERS = ("torch", "torchao", "executorch")

# Lines the native runtime writes to stderr on a successful load (XNNPACK's CPU probe, once per process).
# XNNPACK's CPU probe on the first load in a process, and the notice of a new threadpool (``threads``).
_NATIVE_NOISE = re.compile(r"^\[(cpuinfo_utils\.cpp:\d+\]|threadpool\.cpp:\d+\] Resetting threadpool to \d+ threads)")

# executorch/runtime/core/error.h
_ERROR_NAMES = MappingProxyType(
    {
        0x01: "Internal", 0x02: "InvalidState", 0x10: "NotSupported", 0x11: "NotImplemented",
        0x12: "InvalidArgument", 0x13: "InvalidType", 0x14: "OperatorMissing", 0x20: "NotFound",
        0x21: "MemoryAllocationFailed", 0x22: "AccessFailed", 0x23: "InvalidProgram",
        0x24: "InvalidExternalData", 0x25: "OutOfResources", 0x30: "DelegateInvalidCompatibility",
        0x31: "DelegateMemoryAllocationFailed", 0x32: "DelegateInvalidHandle",
    }
)

# The part of hfx._contract's bounds error that names the dim and the size asked for.
_BEYOND_BOUND = re.compile(r"\((\w+)\) is (\d+), outside the program's bounds")

_FD2_LOCK = threading.Lock()

# The operator namespace of ExecuTorch's LLM kernels, as a program's operator table spells it.
_LLM_KERNELS = b"llama::"

# The tag of the weights a program keeps apart from its .pte: ExecuTorch writes them to "<tag>.ptd".
_WEIGHTS_TAG = "weights"


@attrs.frozen(eq=False)
class PteWeights:
    """The ``.ptd`` file (ExecuTorch's named-data format) holding the weights a ``.pte`` keeps apart.

    ExecuTorch's runtime reads it at load (``Runtime.load_program(pte, data_path=...)``,
    ``TextLLMRunner(pte, tokenizer, data_path)``). A freshly lowered program's file lies in a
    temporary folder that is removed with the last program that refers to it; a loaded
    program's is the saved file: keep its directory while the program runs.
    """

    path: Path

    @property
    def size(self) -> int:
        """The file's bytes."""
        return self.path.stat().st_size


def _weights_in_a_temporary_file(write: Any) -> PteWeights:
    """A ``PteWeights`` whose file ``write(folder)`` writes into a new temporary folder, removed with the record."""
    folder = Path(tempfile.mkdtemp(prefix="hfx-pte-"))
    try:
        write(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weights = PteWeights(path=folder / f"{_WEIGHTS_TAG}.ptd")
    weakref.finalize(weights, shutil.rmtree, folder, ignore_errors=True)
    return weights


@attrs.frozen(kw_only=True, eq=False)
class PteProgram:
    """An ExecuTorch program (XNNPACK-delegated), its calling contract and a loaded runtime method.

    ``buffer`` is the ``.pte`` flatbuffer. ``io.bounds`` holds the bounds its
    memory was planned for: calling the program with a larger dim raises
    ``InputError`` naming the dim. ``patches`` names the patches it was lowered
    under (``lower_to_pte(patches=...)``) and ``rewrites`` how many places each
    rewrite of the edge graph changed (``lower_to_pte(rewrites=...)``; only those
    that fired). ``constant_methods`` are the methods
    that return a constant (``lower_to_pte(constant_methods=...)``: ExecuTorch's
    LLM runner reads its metadata so). Calling it checks the keyword arguments
    against ``io``, runs the ``forward`` method and returns the eager model's
    output structure; buffers the graph writes (a KV cache kept inside) keep
    their values from call to call, starting at the model's
    (``written_buffers_with_state``). ``weights`` is the ``.ptd`` file that
    holds the weights when they are kept apart from the ``.pte``
    (``lower_to_pte(weights_apart=...)``), else ``None``. XNNPACK computes on
    ExecuTorch's one threadpool per process; ``threads`` sizes it before the method
    loads (``None``: as it is, a thread per core unless set), refused while another
    loaded program runs on it at another size (``hfx.backends._executorch_threads``).
    Do not call one program from several threads at once: ExecuTorch methods reuse
    one memory arena.
    """

    buffer: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    io: IoSpec
    name: str = "model"
    patches: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    rewrites: Mapping[str, int] = attrs.field(factory=dict, converter=lambda counts: MappingProxyType(dict(counts)))
    constant_methods: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)))
    weights: PteWeights | None = None
    threads: int | None = attrs.field(default=None)
    _program: Any = attrs.field(
        init=False, repr=False,
        default=attrs.Factory(lambda s: _load_program(s.buffer, s.name, s.weights), takes_self=True),
    )
    _method: Any = attrs.field(
        init=False, repr=False, default=attrs.Factory(
            lambda s: loading_on_threads(s, s.threads, lambda: _load_method(s._program, s.name, s.buffer),
                                         quiet=_native_stderr), takes_self=True)
    )

    @property
    def max_sizes(self) -> Mapping[str, int | None]:
        """The largest size each dynamic dim may take, as planned (``{"batch": 4, "sequence": 256}``)."""
        return MappingProxyType({name: hi for name, (_, hi) in self.io.bounds.items()})

    @property
    def planned_bytes(self) -> int:
        """Bytes of the arenas the runtime allocates when it loads the program (activations, inputs, outputs)."""
        with _quietly():
            from executorch.exir._serialize._program import deserialize_pte_binary

            plans = deserialize_pte_binary(self.buffer).program.execution_plan
        return sum(sum(plan.non_const_buffer_sizes) for plan in plans)

    @property
    def operators(self) -> tuple[str, ...]:
        """The operators the ``forward`` method runs outside delegates (``"aten::embedding"``, ``"llama::custom_sdpa"`` ...)."""
        with _quietly():
            from executorch.exir._serialize._program import deserialize_pte_binary

            plans = deserialize_pte_binary(self.buffer).program.execution_plan
        plan = next(plan for plan in plans if plan.name == _METHOD)
        return tuple(operator.name for operator in plan.operators)

    def __call__(self, **kwargs: Any) -> Any:
        """Run the program on ``kwargs`` (checked against ``io``); return the eager model's output structure."""
        try:
            return call(self.io, self._run, kwargs, program=f"PteProgram({self.name})")
        except InputError as exc:
            beyond = _BEYOND_BOUND.search(str(exc))
            limit = self.max_sizes.get(beyond.group(1)) if beyond else None
            if limit is not None and int(beyond.group(2)) > limit:
                dim, size = beyond.groups()
                exc.add_note(
                    f"This .pte was memory-planned for {dim} <= {limit}. Lower again with "
                    f"lower_to_pte(exported, max_sizes={{{dim!r}: {size}}}) (up to the export's own bound)."
                )
            raise

    def flat_call(self) -> FlatCall:
        """The ``forward`` method on flat torch tensors, nothing checked (``hfx._contract.FlatCall``): what
        ``hfx.generate`` runs per step."""
        return FlatCall(io=self.io, run=self._run)

    def _run(self, flat: list[torch.Tensor]) -> list[Any]:
        try:
            return list(self._method.execute(flat))
        except RuntimeError as exc:
            msg = (
                f"PteProgram({self.name}): the ExecuTorch runtime failed: {_explain(exc)}. "
                "Its own log (on stderr, above) names the operator."
            )
            raise LoweringError(msg) from exc


def _generation_options(components: Components, key: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of ``lower_to_pte`` for one component: bounds that cover a beam search's batch and the
    encoder's output length (``with_generation_max_sizes``)."""
    return with_generation_max_sizes(components, key, options, batch=DEFAULT_MAX_SIZES["batch"])


@curry
@functools.partial(per_component, options_for=_generation_options)
def lower_to_pte(
    exported: Exported | Capture,
    /,
    *,
    max_sizes: Mapping[str, int] | None = None,
    patches: tuple[Patch, ...] = PTE_PATCHES,
    rewrites: tuple[PteRewrite, ...] = XNNPACK_REWRITES,
    constant_methods: Mapping[str, Any] | None = None,
    weights_apart: bool | None = None,
    threads: int | None = None,
) -> PteProgram:
    """Lower ``exported`` to an ExecuTorch program delegated to XNNPACK, planned for bounded dims.

    ExecuTorch plans memory at each dynamic dim's upper bound, so every dim gets
    a finite one: ``max_sizes[name]``, else ``DEFAULT_MAX_SIZES[name]`` (batch 4; audio_length 160 000, or
    fewer samples where its frames would pass 512),
    else ``min(export bound, DEFAULT_MAX_SIZE)`` (512), never above the export's
    own bound. For ``Components``, the sizes the model fixes come first: a beam search's batch
    (4 x the generation config's ``num_beams``) and a dim another component's output fixes
    (Whisper's 1500 encoder tokens; ``generation_max_sizes``). The program records them in
    ``io.bounds``; a larger input raises ``InputError``. ExecuTorch's lowering runs under ``patches``, the
    workarounds of ExecuTorch's bugs (``hfx.backends.PTE_PATCHES``); the program
    records their names in ``patches``. ``rewrites`` then change the edge graph
    so that XNNPACK takes more of it (``hfx.backends.XNNPACK_REWRITES``: exact
    reshapes it otherwise refuses) and the program records how many places each
    changed in ``rewrites``. The ``Exported`` is not changed.
    ExecuTorch's log records, prints and warnings are kept for the error message, not printed.

    A weight that feeds an embedding lookup and another operator (tied input
    and output embeddings, ``tie_word_embeddings``) would be stored twice in a
    ``.pte``: once for ExecuTorch's portable ``embedding`` kernel and once in
    XNNPACK's packed ``lm_head`` weights. Such a program keeps its weights apart,
    in one ``.ptd`` file (``PteProgram.weights``) whose store keeps equal bytes
    once; ``hfx.save`` writes it beside the ``.pte`` and ExecuTorch's runtime
    reads it at load.

    Args:
        exported: an ``Exported`` (a ``Capture`` is exported first), or ``Components`` of them.
        max_sizes: ``{dim name: largest size}`` for the program's dynamic dims
            (``{"batch": 4, "sequence": 512}``). Per-component values: ``hfx.by_component``.
        patches: the zero-argument context-manager factories entered around ExecuTorch's
            lowering, in order: ``PTE_PATCHES`` extended (``(*hfx.backends.PTE_PATCHES, my_patch)``)
            or filtered, or your own.
        rewrites: functions ``rewrite(graph_module) -> int`` that change ExecuTorch's edge graph in
            place before XNNPACK partitions it, in order (``XNNPACK_REWRITES`` extended, filtered
            or ``()``).
        constant_methods: ``{method name: value}`` (an int, float, bool or a list of them) that the
            program also carries as methods returning the value (ExecuTorch's LLM runner reads
            ``get_max_seq_len``, ``get_eos_ids`` ... so).
        weights_apart: keep the weights in a ``.ptd`` file beside the ``.pte`` (``True``), inside the
            ``.pte`` (``False``), or apart only when a weight is tied to an embedding (``None``).
        threads: the threads of ExecuTorch's process-wide threadpool, set before the program
            loads; ``None`` leaves the pool as it is (a thread per core unless set). Refused
            (``ValueError``) while another loaded program is alive on a pool of another size.

    Returns:
        A ``PteProgram`` callable like the model (``Components`` of them for ``Components``).

    Raises:
        ImportError: executorch is missing (install ``hfx[executorch]``).
        ValueError: ``max_sizes`` names a dim the program does not have, or asks for more than
            the export allows (or less than its lower bound); ``threads`` is not a positive int, or
            differs from the pool's while another loaded program is alive.
        TypeError: ``exported`` is neither ``Exported`` nor ``Capture``, or ``patches`` or
            ``rewrites`` is not a tuple of callables.
        LoweringError: torch.export, ExecuTorch or its runtime failed; names the component and model.

    Example:
        >>> import contextlib, torch, hfx
        >>> lin = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
        >>> program = lower_to_pte(lin, max_sizes={"batch": 16})
        >>> program(input=torch.ones(5, 3)).shape, dict(program.max_sizes)
        (torch.Size([5, 4]), {'batch': 16})
        >>> @contextlib.contextmanager
        ... def my_patch():
        ...     yield
        >>> lower_to_pte(lin, patches=(*hfx.backends.PTE_PATCHES, my_patch)).patches[-2:]
        ('patch_edge_dtype_check_reads_metadata', 'my_patch')
    """
    require("executorch", extra="executorch", stage="lower_to_pte")
    patches = fixes_option(patches, stage="lower_to_pte", option="patches", default="PTE_PATCHES")
    rewrites = fixes_option(rewrites, stage="lower_to_pte", option="rewrites", default="XNNPACK_REWRITES")
    methods = _constant_methods(constant_methods)
    if threads is not None:
        check_threads("lower_to_pte", threads)
    if weights_apart is not None and not isinstance(weights_apart, bool):
        msg = f"lower_to_pte: weights_apart must be True, False or None (apart when tied), got {weights_apart!r}"
        raise TypeError(msg)
    exported = as_exported(exported, stage="lower_to_pte")
    bounds = pte_bounds(exported, max_sizes=max_sizes)
    apart = ties_an_embedding(exported.program) if weights_apart is None else weights_apart
    with _quietly() as log:
        exported = for_runtime(exported)  # an ExecuTorch program cannot write its inputs or run asserts
        with lowering_speedups(exported.io):
            buffer, weights, kept, counts = _to_pte(exported, bounds, log, patches, rewrites, methods, apart=apart)
    io_spec = attrs.evolve(exported.io, bounds={**exported.io.bounds, **kept})
    try:
        return PteProgram(buffer=buffer, io=io_spec, name=exported.name, patches=fix_names(patches),
                          rewrites=counts, constant_methods=methods, weights=weights, threads=threads)
    except LoweringError as exc:
        what = f"the program was built, but the ExecuTorch runtime refused it: {first_line(exc)}."
        todo = "The runtime's output below names the operator or delegate; replace it with a patch at export."
        raise _lowering_error(exported, what, todo, str(exc)) from exc


def pte_bounds(
    exported: Exported, /, *, max_sizes: Mapping[str, int] | None = None
) -> dict[str, tuple[int, int]]:
    """The ``(min, max)`` each dynamic dim of ``exported`` gets in a ``.pte`` (see ``lower_to_pte``).

    Raises:
        ValueError: ``max_sizes`` names an unknown dim, or a size outside the export's bounds.

    Example:
        >>> import torch, hfx
        >>> ex = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> pte_bounds(ex), pte_bounds(ex, max_sizes={"batch": 64})
        ({'batch': (1, 4)}, {'batch': (1, 64)})
    """
    export_bounds = {**exported.dynamic_shapes.bounds, **exported.io.bounds}
    names = [n for n in exported.dynamic_shapes.names if n in export_bounds]
    asked = dict(max_sizes or {})
    unknown = sorted(set(asked) - set(names))
    if unknown:
        msg = (
            f"lower_to_pte: max_sizes names dim(s) {unknown} that {exported.name!r} does not have; "
            f"its dynamic dims are {names}. Give each component its own with hfx.by_component."
        )
        raise ValueError(msg)
    bounds = {}
    for name in names:
        lo, hi = export_bounds[name]
        if name in asked:
            size = asked[name]
            if not isinstance(size, int) or isinstance(size, bool) or size < max(lo, 1):
                msg = (
                    f"lower_to_pte: max_sizes[{name!r}] must be an int >= {max(lo, 1)} "
                    f"(the export's lower bound), got {size!r}"
                )
                raise ValueError(msg)
            if hi is not None and size > hi:
                msg = (
                    f"lower_to_pte: max_sizes[{name!r}] = {size} is above the export's bound for {name!r}, "
                    f"{hi}. Export again with bounds={{{name!r}: ({lo}, {size})}} to allow it."
                )
                raise ValueError(msg)
        else:
            default = DEFAULT_MAX_SIZES.get(name, DEFAULT_MAX_SIZE)
            if name in _SAMPLE_DIMS:
                default = _samples_whose_frames_fit(exported, name, lo, default)
            size = max(lo, min(default, hi if hi is not None else default))
        bounds[name] = (lo, size)
    # the positions a decode graph keeps logits for are some of its new tokens: planned for as many, not more
    if KEPT_DIM in bounds and "sequence" in bounds and KEPT_DIM not in asked:
        lo, size = bounds[KEPT_DIM]
        bounds[KEPT_DIM] = (lo, max(lo, min(size, bounds["sequence"][1])))
    return bounds


def _symbol_of(exported: Exported, name: str) -> Any:
    """The sympy symbol torch.export gave the dim ``name`` (read from the first input that has it), or None."""
    placeholders = {n.name: n for n in exported.program.graph.nodes if n.op == "placeholder"}
    for spec, user in zip(exported.io.inputs, exported.program.graph_signature.user_inputs):  # as hfx._export.updates
        for axis, dim in enumerate(spec.shape):
            size = placeholders[user].meta["val"].shape[axis] if dim == name else None
            if isinstance(size, torch.SymInt):
                return size.node.expr
    return None


def _samples_whose_frames_fit(exported: Exported, name: str, lo: int, limit: int) -> int:
    """The most samples of ``name`` (at most ``limit``) whose frames, in every output size computed from it alone,
    stay within ``DEFAULT_MAX_SIZE``: a waveform's default bound, planned for the frames its model makes of it."""
    symbol = _symbol_of(exported, name)
    output = next(n for n in exported.program.graph.nodes if n.op == "output")
    values = [node.meta.get("val") for node in output.all_input_nodes]
    sizes = [size.node.expr for value in values for size in getattr(value, "shape", ()) if isinstance(size, torch.SymInt)]
    framed = [expr for expr in sizes if symbol is not None and expr.free_symbols == {symbol}]
    if not framed:
        return limit

    def fits(samples: int) -> bool:
        return all(int(expr.subs(symbol, samples)) <= DEFAULT_MAX_SIZE for expr in framed)

    low, high = max(lo, 1), limit  # sizes grow with the samples: the largest that fits, by bisection
    if fits(high):
        return high
    while low < high - 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def ties_an_embedding(program: torch.export.ExportedProgram) -> bool:
    """Whether a weight of ``program`` feeds an embedding lookup and another operator too.

    Model pattern: tied input and output embeddings (``tie_word_embeddings``:
    SmolLM, Llama 3.2 1B, Gemma, Qwen2.5-0.5B). ExecuTorch's portable
    ``embedding`` kernel reads the weight from the ``.pte``'s constants and
    XNNPACK stores its own copy for the ``lm_head`` matmul, so the ``.pte``
    holds it twice.

    Example:
        >>> import torch, hfx
        >>> emb = torch.nn.Embedding(8, 4)
        >>> head = torch.nn.Linear(4, 8, bias=False)
        >>> head.weight = emb.weight
        >>> tied = torch.nn.Sequential(emb, head)
        >>> ex = hfx.export(hfx.capture({"input": torch.ones(1, 3, dtype=torch.long)}, tied))
        >>> ties_an_embedding(ex.program), ties_an_embedding(hfx.export(hfx.capture({"input": torch.ones(1, 3, dtype=torch.long)}, emb)).program)
        (True, False)
    """
    signature = program.graph_signature
    weights = {*signature.inputs_to_parameters, *signature.inputs_to_lifted_tensor_constants}
    embedding = torch.ops.aten.embedding.default
    return any(
        node.op == "placeholder" and node.name in weights and len(node.users) > 1
        and any(user.target is embedding for user in node.users)
        for node in program.graph.nodes
    )


def _constant_methods(methods: Mapping[str, Any] | None) -> dict[str, Any]:
    """``constant_methods`` checked: names that are not ``forward``, values JSON scalars or lists of them."""
    methods = dict(methods or {})
    for name, value in methods.items():
        values = value if isinstance(value, list) else [value]
        if not isinstance(name, str) or name == _METHOD or not values or not all(
                isinstance(v, (bool, int, float)) for v in values):
            msg = (f"lower_to_pte: constant_methods[{name!r}] must name a method other than {_METHOD!r} and "
                   f"give an int, float, bool or a non-empty list of them, got {value!r}")
            raise ValueError(msg)
    return methods


@one_at_a_time
def _to_pte(
    exported: Exported, bounds: Mapping[str, tuple[int, int]], log: io.StringIO, patches: tuple[Patch, ...],
    rewrites: tuple[PteRewrite, ...], methods: Mapping[str, Any], *, apart: bool,
) -> tuple[bytes, PteWeights | None, dict[str, tuple[int, int]], dict[str, int]]:
    """Export the graph again with ``bounds``, lower it under ``patches`` with ``rewrites`` and serialise it.

    With ``apart``, every constant (XNNPACK's weights and those of the kernels
    outside it) is tagged for one ``.ptd`` file, returned as ``PteWeights``.
    Also returns the bounds kept and the places each rewrite changed.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    tag = (lambda node: _WEIGHTS_TAG) if apart else None
    try:
        program, kept = _bounded(exported, bounds, tag=tag)
    except Exception as exc:
        what = f"torch.export could not trace the graph again with the bounds {dict(bounds)}: {root_cause(exc)}."
        todo = "Lower with other max_sizes; the error names the dim torch.export disagrees with."
        raise _lowering_error(exported, what, todo, log.getvalue()) from exc
    # ExecuTorch's prim mod takes C's remainder, it has no power of sizes, and its scatter_add takes int64 indices only
    # and its empty-cat pruning writes symbolic sizes its emitter refuses (``empty_cats_as_zeros``)
    if (remainders_of_signed_sizes(program.graph) + integer_powers_as_products(program.graph)
            + long_scatter_indices(program.graph) + empty_cats_as_zeros(program.graph)):
        program.graph_module.recompile()
    try:
        counts: dict[str, int] = {}
        with with_patches(*patches):
            edge = to_edge_transform_and_lower(program, transform_passes=as_edge_passes(rewrites, counts) or None,
                                               partitioner=[XnnpackPartitioner()], constant_methods=dict(methods) or None)
            built = edge.to_executorch(ExecutorchBackendConfig(
                external_constants=tag or False, passes=_initial_states(edge.exported_program())))
            weights = _weights_in_a_temporary_file(built.write_tensor_data_to_file) if tag else None
            return built.buffer, weights, kept, counts
    except Exception as exc:
        what = f"ExecuTorch could not lower the program: {root_cause(exc)}."
        todo = (
            "An operator without an ExecuTorch kernel or XNNPACK support can be replaced by a patch at "
            "export (export(patches=...)); the log below names the pass that failed."
        )
        raise _lowering_error(exported, what, todo, log.getvalue()) from exc


def written_buffers_with_state(program: torch.export.ExportedProgram) -> list[str]:
    """The placeholders of the buffers ``program`` writes (a functional program's ``buffers_to_mutate``) whose
    value is not all zeros.

    ExecuTorch "assumes buffers that are mutated in the graph have a
    meaningless initial state" (its emitter's warning) and serialises their
    shape alone: the runtime starts them at zero. A model's buffer that counts
    or carries state from call to call starts at its value in eager. A zero
    buffer (a KV cache) is left out: the runtime's zeros are its value, and
    the ``.pte`` does not grow by it.
    """
    signature = program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    values = {**program.state_dict, **program.constants}
    return [name for name, fqn in signature.inputs_to_buffers.items()
            if fqn in written and fqn in values and bool(values[fqn].any())]


def _initial_states(program: torch.export.ExportedProgram) -> list[Any]:
    """The ExecuTorch pass that serialises the initial values of ``written_buffers_with_state(program)``."""
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    names = written_buffers_with_state(program)
    return [InitializedMutableBufferPass(names)] if names else []


def _bounded(
    exported: Exported, bounds: Mapping[str, tuple[int, int]], *, tag: Any = None
) -> tuple[torch.export.ExportedProgram, dict[str, tuple[int, int]]]:
    """``exported``'s graph exported again by ``hfx.export`` with ``bounds``, and the bounds that program has.

    A dim whose bounds meet becomes static. ``hfx.export`` applies torch's
    suggested fixes and keeps unprovable guards as runtime asserts, as it did
    for the model; a dim it narrows further keeps the narrower bound. ``tag``
    (``node -> file tag``) marks the constants a delegate takes for that file.
    """
    from hfx._export.export import export

    program = exported.program
    dynamic = {name: b for name, b in bounds.items() if b[0] != b[1]}
    kwargs = example_kwargs(exported, bounds)
    axes = {leaf: {a: d for a, d in per_axis.items() if derived_dim(d)[0] in dynamic} for leaf, per_axis in exported.dynamic_shapes.axes.items()}
    module = program.module()
    if tag is not None:  # only an unlifted module's get_attr nodes carry the tag through the new export
        from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

        delegate_external_constants_pass_unlifted(module, tag)
    again = export(
        Capture(module=module, source=module, kwargs=kwargs, dynamic_shapes=DynamicShapes(axes=axes, bounds=dynamic),
                is_flat=True, name=exported.name),
        patches=(),
    )
    # A dim the new export makes static runs at its example size alone within ``bounds`` (the graph's guards fail
    # at every other: RADIO's patch grid at 32 to 39 px): it keeps that size.
    static = {name: size for name, size in dim_sizes(kwargs, exported.dynamic_shapes).items()
              if name in dynamic and name not in again.dynamic_shapes.names}
    kept = {}
    for name, (lo, hi) in bounds.items():
        narrower = again.dynamic_shapes.bounds.get(name, (lo, hi))[1]
        kept[name] = (static[name],) * 2 if name in static else (lo, min(hi, narrower if narrower is not None else hi))
    return again.program, kept


def _load_program(buffer: bytes, name: str, weights: PteWeights | None = None) -> Any:
    """The runtime ``Program`` of ``buffer`` (with its ``weights`` file); the native loader's stderr is kept for the error."""
    with _quietly():  # the first import of executorch imports torchao, which logs warnings
        from executorch.runtime import Runtime

    with _native_stderr() as native:
        try:
            return Runtime.get().load_program(buffer, data_path=None if weights is None else str(weights.path))
        except Exception as exc:
            msg = f"PteProgram({name}): the ExecuTorch runtime could not load the program: {_explain(exc)}"
            raise LoweringError(with_log(msg, native.getvalue(), source="ExecuTorch")) from exc


def _load_method(program: Any, name: str, buffer: bytes) -> Any:
    """The loaded ``forward`` method of ``program`` (XNNPACK initialises here, and probes the CPU once).

    A program that runs ExecuTorch's LLM kernels (``llama::custom_sdpa``, ``llama::update_cache``:
    ``decompose(internal_cache_length=...)``) needs them registered with the runtime first, also in a
    process that only loads it (``hfx.load``): the method would fail with OperatorMissing.
    """
    if _LLM_KERNELS in buffer:
        from hfx._capture.internal_cache import load_custom_ops

        load_custom_ops()
    with _native_stderr() as native:
        try:
            return program.load_method(_METHOD)
        except Exception as exc:
            msg = f"PteProgram({name}): the ExecuTorch runtime could not load method {_METHOD!r}: {_explain(exc)}"
            raise LoweringError(with_log(msg, native.getvalue(), source="ExecuTorch")) from exc


@contextlib.contextmanager
def _quietly() -> Iterator[io.StringIO]:
    """Collect prints, warnings and torch/ExecuTorch log records into a buffer while the block runs."""
    buffer = io.StringIO()
    with captured_output(buffer, _QUIET_LOGGERS):
        yield buffer


@contextlib.contextmanager
def _native_stderr() -> Iterator[io.StringIO]:
    """Collect what native code writes to file descriptor 2 while the block runs.

    ExecuTorch's runtime logs with ``fprintf(stderr)``, which ``sys.stderr``
    cannot intercept, and its Python bindings send part of that log to
    ``sys.stderr`` instead (XNNPACK's cpuinfo probe prints five lines on the first
    load in a process: into a notebook's or pytest's ``sys.stderr`` when it is not
    fd 2). Both are collected. On exit every line except that probe is written back
    to ``sys.stderr``; the block's caller may also put the text in an error. fd 2
    and ``sys.stderr`` are process-wide: another thread's stderr output in the
    block is delayed, not lost.
    """
    buffer = io.StringIO()
    with _FD2_LOCK, tempfile.TemporaryFile() as sink:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no fd 2 or no sys.stderr (a GUI process)
            yield buffer
            return
        os.dup2(sink.fileno(), 2)
        written = io.StringIO()
        try:
            with contextlib.redirect_stderr(written):
                yield buffer
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            buffer.write(sink.read().decode(errors="replace") + written.getvalue())
    kept = [line for line in buffer.getvalue().splitlines(keepends=True) if not _NATIVE_NOISE.match(line)]
    if kept and sys.stderr is not None:
        sys.stderr.write("".join(kept))


def _explain(exc: BaseException) -> str:
    """The runtime's message with its error code named (``0x12`` -> ``0x12 InvalidArgument``)."""
    text = first_line(exc)
    match = re.search(r"0x:?([0-9a-fA-F]+)", text)
    if match and int(match.group(1), 16) in _ERROR_NAMES:
        text = text.replace(match.group(0), f"{match.group(0)} ({_ERROR_NAMES[int(match.group(1), 16)]})", 1)
    return text


def _lowering_error(exported: Exported, what: str, todo: str, log: str = "") -> LoweringError:
    return lowering_error("lower_to_pte", exported, what, todo, log, source="ExecuTorch")


def save_files(program: PteProgram, directory: Path) -> dict[str, Any]:
    """Write ``<name>.pte`` (and ``<name>.ptd``, its weights kept apart) into ``directory``; return the manifest entry."""
    files = [f"{program.name}.pte"]
    (Path(directory) / files[0]).write_bytes(program.buffer)
    if program.weights is not None:
        files.append(f"{program.name}.ptd")
        shutil.copyfile(program.weights.path, Path(directory) / files[1])
    return {"files": files, "patches": list(program.patches), "rewrites": dict(program.rewrites),
            "constant_methods": dict(program.constant_methods)}


def load_files(entry: Mapping[str, Any], directory: Path, *, name: str, io: IoSpec,
               threads: int | None = None) -> PteProgram:
    """Load a program written by ``save_files``: the ``.pte`` is read into memory, a ``.ptd`` beside it
    is read by the runtime from the saved file (keep the directory while the program runs). ``threads``
    sizes ExecuTorch's threadpool as the method loads (``None``: the pool as it is)."""
    require("executorch", extra="executorch", stage="load")
    files = entry["files"]
    buffer = (Path(directory) / files[0]).read_bytes()
    weights = PteWeights(path=Path(directory) / files[1]) if len(files) > 1 else None
    program = PteProgram(buffer=buffer, io=io, name=name, patches=entry.get("patches", ()),
                         rewrites=entry.get("rewrites", {}), constant_methods=entry.get("constant_methods", {}),
                         weights=weights, threads=threads)
    # Workaround (ExecuTorch 1.5.1, measured on a SmolLM-135M-shaped decoder): the runtime maps the .ptd and
    # locks what it maps; XNNPACK copies the weights into its own packed memory, and the embedding lookup
    # reads its rows in place, so the whole 108 MB table stayed resident (its pages read while packing the
    # tied lm_head). Dropping them keeps the mapping; generating reads back the rows a prompt looks up, a
    # page each (read_back_page_by_page). A no-op without a weights file.
    if weights is not None:
        release_copied_pages(weights.path)
    return program
