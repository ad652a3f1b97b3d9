"""``export``: ``torch.export`` under patches, with the flat signature and named shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
from toolz import curry
from torch.utils import _pytree as pytree

from hfx._capture.dynamic_shapes import dim_sizes, infer_dynamic_shapes
from hfx._export.guard_ranges import guard_interval, pinned_by_guards
from hfx._export.torch_shapes import derived_dim, refine, to_torch, widen_unit_axes
from hfx._errors import CaptureError, PatchError, describe
from hfx._export.asserts import on_input_sizes_only, without_asserts
from hfx._export.branches import recording_branches
from hfx._export.constant_outputs import constant_outputs, user_outputs, without_constant_outputs
from hfx._export.prune import without_unused_weights
from hfx._export.self_writes import without_self_writes
from hfx._export.signature import flatten_signature
from hfx._lift import per_component
from hfx._pytree import cache_classes, named_leaves, registered_caches
from hfx._records import Capture, DynamicShapes, Exported, IoSpec, TensorSpec
from hfx.patches import Patch, default_patches, with_patches
from hfx._serial import one_at_a_time

_MAX_REFINEMENTS = 3


@curry
@per_component
def export(
    capture: Capture,
    /,
    *,
    patches: Sequence[Patch] | None = None,
    bounds: Mapping[str, tuple[int, int | None]] | None = None,
) -> Exported:
    """Export a captured model with ``torch.export`` (non-strict) and named dynamic shapes.

    The model runs under ``patches`` (``hfx.patches.default_patches(model)`` by
    default), which put back every attribute, buffer and flag on exit. When
    torch.export proves that a dim the shapes marked dynamic is really fixed
    (a ViT's image size), the dim is made static and the export is retried.

    Args:
        capture: a ``Capture`` (or ``Components``).
        patches: the patches to enter; ``None`` for the defaults.
        bounds: ``{dim: (min, max)}`` for ``infer_dynamic_shapes`` (over a decomposed capture's own bounds).

    Returns:
        An ``Exported`` record, callable like the model.

    Raises:
        CaptureError: torch.export failed; the message names the component and model.

    Example:
        >>> import torch
        >>> from hfx import capture
        >>> ex = export(capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> ex(input=torch.ones(5, 3)).shape
        torch.Size([5, 4])
    """
    flat = flatten_signature(capture)
    shapes = infer_dynamic_shapes(flat, bounds=bounds)
    chosen = default_patches(capture.source) if patches is None else _checked_patches(patches)
    return exported_from_flat(flat, shapes, chosen)


def exported_from_flat(flat: Capture, shapes: DynamicShapes, patches: tuple[Patch, ...]) -> Exported:
    """The ``Exported`` record of a flat capture traced under ``patches`` with ``shapes``: ``export`` once its
    options are read (a new program on every call)."""
    with registered_caches(cache_classes(flat.source)):  # io_spec and module() walk cache outputs
        asked = with_span_bounds(shapes, dim_sizes(flat.kwargs, shapes))
        program, refined = _export_refining(flat, shapes, asked, patches)
        io = io_spec(program, flat, refined, declared=asked)
        return Exported(
            program=without_constant_outputs(without_self_writes(program)),
            io=io,
            dynamic_shapes=refined,
            name=flat.name,
            source_class=type(flat.source).__name__,
        )


def _checked_patches(patches: Any) -> tuple[Patch, ...]:
    """``patches`` as a tuple; a ``TypeError`` naming the option unless it holds zero-argument callables."""
    if not isinstance(patches, (tuple, list)) or not all(callable(patch) for patch in patches):
        msg = (f"export: patches must be a tuple of zero-argument context-manager factories, such as "
               f"(*hfx.patches.default_patches(model), my_patch); got {patches!r}")
        raise TypeError(msg)
    return tuple(patches)


@one_at_a_time
def _export_refining(
    flat: Capture, declared: DynamicShapes, asked: DynamicShapes, patches: tuple[Patch, ...]
) -> tuple[torch.export.ExportedProgram, DynamicShapes]:
    """Run torch.export on ``asked`` (the ``declared`` shapes with ``with_span_bounds``), applying its suggested
    fixes when a dim marked dynamic turns out static.

    A guard torch cannot prove over a dim's range but that holds for every
    valid size (``Min(16*p + 16, 32*p + 32) == 16*p + 16`` from a contiguity
    check on a growing cache) has no suggested fix: the export is then retried
    with such guards kept as runtime asserts in the graph.
    """
    # A growing cache's concatenation leaves a guard torch cannot prove (below): keep such guards as asserts at once.
    deferred, shapes = "past_sequence" in declared.bounds, asked
    traced = traced_minimums(shapes)
    for _ in range(_MAX_REFINEMENTS + 2):
        try:
            with recording_branches() as branches:
                program = _torch_export(flat, shapes, patches, deferred=deferred, declared=declared, traced=traced)
            if deferred:
                ranges = asserted_ranges(program, flat.kwargs, shapes, branches)
                pinned = frozenset(name for name, interval in ranges.items() if interval is None)
                if pinned:  # the program is the model's at the traced size of these dims alone
                    shapes = _static(shapes, pinned)
                    continue
                # Input-size asserts are then trace-time assumptions (a dim traced at 2 is not 1) or hold over the
                # ranges just narrowed to, which hfx checks at every call. Data-dependent checks stay.
                program = without_asserts(program, drop=on_input_sizes_only)
                shapes = DynamicShapes(axes=shapes.axes, bounds={**shapes.bounds, **ranges})
                _narrow(program, flat.kwargs, shapes, frozenset(ranges))
            return program, _with_lower_bounds(shapes, declared, traced)
        except torch._dynamo.exc.UserError as exc:  # noqa: SLF001 - the only type constraint violations have
            refined = refine(shapes, str(exc))
            pinned = ranged_by_guards(pinned_dims(shapes, refined), str(exc)) if refined is not None else frozenset()
            ranged = _guard_ranged(flat, shapes, pinned, patches, declared, traced) if pinned else None
            if ranged is not None:
                return ranged
            if refined is not None and refined != shapes:
                shapes = refined
            elif not deferred and "Not all values of" in str(exc):
                deferred = True
            else:
                raise _capture_error(flat, exc) from exc
        except PatchError as exc:  # the patch's own failure, not the model's: say which patch
            raise PatchError(describe("export", flat.source, flat.name, str(exc), "Fix or leave out that patch.")) from exc
        except AssertionError as exc:
            # torch fails to phrase its suggested fixes for a guard on a dim modulo a constant ("Cannot create Dim
            # with inconsistent min=1, max=-oo", torch 2.13): the dims as automatic ones, ranged by their guards.
            phrasing = "Cannot create Dim" in str(exc)
            ranged = _guard_ranged(flat, shapes, frozenset(shapes.bounds), patches, declared, traced) \
                if phrasing else None
            if ranged is not None:
                return ranged
            # Where the guards allow the captured size alone ("min=4, max=4": RADIO's patch grid, ``height // 8``,
            # over the bounds [32, 39] of ExecuTorch's re-export), the fix torch could not phrase makes it static.
            pinned = _pinned_by_guards(flat, shapes, patches, declared, traced) if phrasing else frozenset()
            if not pinned:
                raise _capture_error(flat, exc) from exc
            shapes = _static(shapes, pinned)
        except Exception as exc:
            raise _capture_error(flat, exc) from exc
    raise _capture_error(flat, RuntimeError("dynamic shapes did not settle"))


def pinned_dims(shapes: DynamicShapes, refined: DynamicShapes) -> frozenset[str]:
    """The dims of ``shapes`` that ``refined`` (torch's suggested fixes applied) makes static.

    Example:
        >>> before = DynamicShapes(axes={"x": {0: "batch", 1: "sequence"}}, bounds={"batch": (1, None), "sequence": (1, 9)})
        >>> pinned_dims(before, DynamicShapes(axes={"x": {0: "batch"}}, bounds={"batch": (1, None)}))
        frozenset({'sequence'})
    """
    used = {derived_dim(dim)[0] for per_axis in refined.axes.values() for dim in per_axis.values()}
    return frozenset(name for name in shapes.bounds if name not in used)


def ranged_by_guards(pinned: frozenset[str], message: str) -> frozenset[str]:
    """The ``pinned`` dims that torch's ``message`` refuses for a guard some of their sizes fail ("Not all values
    of sequence ... satisfy the generated guard"), not for a size the code fixed ("specialized it to be a constant":
    a ViT's image size), which no range would keep dynamic.

    Example:
        >>> ranged_by_guards(frozenset({"sequence", "height"}), "Not all values of sequence = L['x'].size()[1] in ...")
        frozenset({'sequence'})
    """
    return frozenset(name for name in pinned if f"Not all values of {name} " in message
                     and f"You marked {name} as dynamic but your code specialized it" not in message)


def _guard_ranged(
    flat: Capture, shapes: DynamicShapes, pinned: frozenset[str], patches: tuple[Patch, ...], declared: DynamicShapes,
    traced: Mapping[str, int],
) -> tuple[torch.export.ExportedProgram, DynamicShapes] | None:
    """The program with the ``pinned`` dims as ``Dim.AUTO`` and each narrowed to the sizes where its guards hold
    (``guard_interval``), as automatic dims would export it; ``None`` where that export fails or a dim stays pinned,
    and torch's fix (static) applies."""
    automatic = _with_automatic(flat, shapes, pinned, patches, declared, traced)
    if automatic is None:
        return None
    program, guards = automatic
    # The other dims as the named export gives them back; each pinned one the run of sizes its guards allow (not
    # lowered to the declared minimum: a guard may exclude the sizes below).
    sizes, bounds = dim_sizes(flat.kwargs, shapes), dict(_with_lower_bounds(shapes, declared, traced).bounds)
    for name in pinned:
        axes = {(leaf, axis) for leaf, per_axis in shapes.axes.items() for axis, dim in per_axis.items() if dim == name}
        interval = guard_interval(guards, flat.kwargs, axes, sizes[name], shapes.bounds[name]) if name in sizes else None
        if interval is None:
            return None
        bounds[name] = interval
    ranged = DynamicShapes(axes=shapes.axes, bounds=bounds)
    _narrow(program, flat.kwargs, ranged, pinned)
    return program, ranged


def _with_automatic(
    flat: Capture, shapes: DynamicShapes, names: frozenset[str], patches: tuple[Patch, ...], declared: DynamicShapes,
    traced: Mapping[str, int],
) -> tuple[torch.export.ExportedProgram, list[str]] | None:
    """The program exported with the dims ``names`` as ``Dim.AUTO``, and its guards; ``None`` where that fails."""
    try:
        program = _torch_export(flat, shapes, patches, deferred=False, declared=declared, traced=traced, auto=names)
    except Exception:  # noqa: BLE001 - the named export's own error is the one to report
        return None
    guards = getattr(program, "_guards_code", None)
    return (program, guards) if isinstance(guards, list) else None


def _pinned_by_guards(
    flat: Capture, shapes: DynamicShapes, patches: tuple[Patch, ...], declared: DynamicShapes,
    traced: Mapping[str, int],
) -> frozenset[str]:
    """The dims of ``shapes`` whose guards, with every dim automatic, hold at the captured size alone within the
    dim's bounds (``pinned_by_guards``): the sizes the program runs at, which torch's suggested fix would state."""
    automatic = _with_automatic(flat, shapes, frozenset(shapes.bounds), patches, declared, traced)
    if automatic is None:
        return frozenset()
    guards, sizes = automatic[1], dim_sizes(flat.kwargs, shapes)
    return frozenset(
        name for name in shapes.bounds if name in sizes and pinned_by_guards(
            guards, flat.kwargs, {(leaf, axis) for leaf, per_axis in shapes.axes.items()
                                  for axis, dim in per_axis.items() if dim == name},
            sizes[name], shapes.bounds[name]))


def _narrow(program: torch.export.ExportedProgram, kwargs: Mapping[str, Any], shapes: DynamicShapes,
            names: frozenset[str]) -> None:
    """Give the dims ``names`` of ``program`` their bounds in ``shapes``, in its range constraints and its shape
    environment; the program is changed in place (hfx's own, fresh from torch.export)."""
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = program_shape_env(program)
    for symbol, name in _symbol_names(program, kwargs, shapes).items():
        if name in names:
            lo, hi = shapes.bounds[name]
            program._range_constraints[symbol] = ValueRanges(lo, int(hi) if hi is not None else sympy.oo)  # noqa: SLF001
            if hi is not None and shape_env is not None:
                # The tensors' sizes read their ranges from the shape environment, not from range_constraints: an
                # automatic dim's stays unbounded there, and ExecuTorch, which plans memory at the sizes' upper
                # bounds, planned LED's and LongT5's inputs at their traced size (2 x 7; "Attempted to resize a
                # bounded tensor" at 3 x 11). Only the upper bound: torch traced the dim at >= 2.
                shape_env._update_var_to_range(symbol, ValueRanges(-sympy.oo, int(hi)))  # noqa: SLF001


def asserted_ranges(program: torch.export.ExportedProgram, kwargs: Mapping[str, Any], shapes: DynamicShapes,
                    branches: Sequence[Any]) -> dict[str, tuple[int, int | None] | None]:
    """Each dynamic dim of ``program`` the model's ``branches`` (``recording_branches``) name: the sizes around
    its traced one where every such condition holds, the other dims at their traced sizes
    (``condition_interval``), cut to a box where the conditions on several dims hold together
    (``jointly_held``); ``None`` where they fail next to it.

    Model pattern: a branch on a size, taken at the traced one, which torch can neither
    prove over the dim's range nor state as one, kept as an assert (Swin pads an odd
    feature map and shifts its windows only above the window size, ``Min(rows, columns) <= 2``:
    traced at 64 px, the program was Swin's at 61 to 64 px alone; at 128 px it stopped inside
    the graph). Equations between dims and conditions on one span's dims (``total <=
    past + sequence``) are relations hfx checks itself, not branches.
    """
    from hfx._export.guard_ranges import condition_interval, jointly_held

    shape_env = program_shape_env(program)
    if not branches or shape_env is None:
        return {}
    traced = getattr(shape_env, "backed_var_to_val", None)  # torch 2.13 renamed var_to_val (and deprecated it)
    traced = shape_env.var_to_val if traced is None else traced
    dims = {symbol: name for symbol, name in _symbol_names(program, kwargs, shapes).items()
            if symbol in traced and name in shapes.bounds}
    sizes = {symbol: int(traced[symbol]) for symbol in dims}
    conditions = [c for c in branches if _on_dims(c, dims)]
    named = {symbol for c in conditions for symbol in c.free_symbols}
    intervals = {symbol: condition_interval(conditions, symbol, sizes[symbol],
                                            _within(program, symbol, shapes.bounds[dims[symbol]]), others=sizes)
                 for symbol in dims if symbol in named}
    intervals = jointly_held([c for c in conditions if len(c.free_symbols) > 1], intervals, sizes)
    return {dims[symbol]: interval for symbol, interval in intervals.items()}


def _on_dims(condition: Any, dims: Mapping[Any, str]) -> bool:
    """Whether ``condition`` is a branch on input dims: on one alone, on several equated with a number
    (``_equates_a_number``), or on several but neither an equation between them nor a condition on one span's
    dims (``total <= past + sequence``: relations hfx checks itself)."""
    symbols = getattr(condition, "free_symbols", set())
    if not symbols or not symbols <= dims.keys():
        return False
    names = {dims[symbol] for symbol in symbols}
    return (len(symbols) == 1 or _equates_a_number(condition)
            or not (isinstance(condition, sympy.Eq) or any(names <= set(span) for span in _SPANS)))


def _equates_a_number(condition: Any) -> bool:
    """Whether ``condition`` equates an expression of sizes with a number: a branch taken where the expression
    has the value it had in the capture, not a relation between dims.

    Model pattern: TimeSformer resizes its position table when the patch count differs from the table's
    (``embeddings.size(1) != self.position_embeddings.size(1)``); traced where they match, the graph adds the
    table as it is, and the guard is ``Eq((h // 8) * (w // 8) + 1, 17)``. The program served 32 x 32 px alone
    and failed inside the graph at 64 x 64 ("The size of tensor a (65) must match the size of tensor b (17)").

    >>> h, w = sympy.symbols("h w", integer=True, positive=True)
    >>> _equates_a_number(sympy.Eq((h // 8) * (w // 8) + 1, 17)), _equates_a_number(sympy.Eq(h, w + 1))
    (True, False)
    """
    return isinstance(condition, sympy.Eq) and any(side.is_number for side in condition.args)


def _within(program: torch.export.ExportedProgram, symbol: Any, bounds: tuple[int, int | None]) -> tuple[int, int | None]:
    """``bounds`` cut to the range torch.export gave ``symbol`` (never widened past it)."""
    current = program.range_constraints.get(symbol)
    if current is None:
        return bounds
    lo, hi = bounds
    upper = _finite(current.upper)
    lower = _finite(current.lower)
    return (max(lo, lower) if lower is not None else lo,
            upper if hi is None else min(hi, upper) if upper is not None else hi)


def _static(shapes: DynamicShapes, names: frozenset[str]) -> DynamicShapes:
    """``shapes`` with the dims ``names`` (and the dims derived from them) static."""
    axes = {leaf: {axis: dim for axis, dim in per_axis.items() if derived_dim(dim)[0] not in names}
            for leaf, per_axis in shapes.axes.items()}
    return DynamicShapes(axes=axes, bounds={name: b for name, b in shapes.bounds.items() if name not in names})


def program_shape_env(program: torch.export.ExportedProgram) -> Any:
    """The shape environment ``program``'s tensors share (that of its first input with one), or None."""
    for node in program.graph.nodes:
        shape_env = getattr(getattr(node.meta.get("val"), "fake_mode", None), "shape_env", None)
        if node.op == "placeholder" and shape_env is not None:
            return shape_env
    return None


# (query dim, cached dim, the mask's dim): a mask spanning the cached tokens and the new ones.
_SPANS = (("sequence", "past_sequence", "total_sequence"), ("decoder_sequence", "past_sequence", "total_sequence"))
_TRACED_MIN = 2  # torch.export traces a dynamic dim as >= 2 (it specialises 0 and 1)


def with_span_bounds(shapes: DynamicShapes, sizes: Mapping[str, int]) -> DynamicShapes:
    """``shapes`` with the ranges torch.export derives for a mask that spans the cache and the new tokens.

    A multi-token decode graph concatenates ``sequence`` new keys to
    ``past_sequence`` cached ones under a ``total_sequence`` mask. torch.export
    then proves ``total = past + sequence`` with each part >= 2, refuses the
    declared ranges and suggests ``sequence <= total_max - 2``,
    ``past <= total_max - 2`` and ``total >= 4``: applied up front, the graph
    is traced once instead of twice. Applied only where the captured sizes
    show the relation (``sizes``: each dim's size in the capture).

    Example:
        >>> shapes = DynamicShapes(axes={}, bounds={"sequence": (1, 256), "past_sequence": (0, 255),
        ...                                         "total_sequence": (1, 256)})
        >>> dict(with_span_bounds(shapes, {"sequence": 3, "past_sequence": 4, "total_sequence": 7}).bounds)
        {'sequence': (1, 254), 'past_sequence': (0, 254), 'total_sequence': (4, 256)}
    """
    for query, cached, mask in _SPANS:
        if not {query, cached, mask} <= set(shapes.bounds) or sizes.get(mask) != sizes.get(query, -1) + sizes.get(cached, -1):
            continue
        (q_lo, q_hi), (c_lo, c_hi), (m_lo, m_hi) = (shapes.bounds[name] for name in (query, cached, mask))
        if m_hi is None:
            continue
        least_query, least_cached = max(q_lo, _TRACED_MIN), max(c_lo, _TRACED_MIN)
        bounds = {
            **shapes.bounds,
            query: (q_lo, min(m_hi - least_cached, q_hi if q_hi is not None else m_hi)),
            cached: (c_lo, min(m_hi - least_query, c_hi if c_hi is not None else m_hi)),
            mask: (max(m_lo, least_query + least_cached), m_hi),
        }
        return DynamicShapes(axes=shapes.axes, bounds=bounds)
    return shapes


def _torch_export(
    flat: Capture, shapes: DynamicShapes, patches: tuple[Patch, ...], *, deferred: bool, declared: DynamicShapes,
    traced: Mapping[str, int], auto: frozenset[str] = frozenset(),
) -> torch.export.ExportedProgram:
    kwargs = widen_unit_axes(shapes, flat.kwargs)
    with with_patches(*patches), torch.no_grad():
        program = torch.export.export(
            flat.module, (), kwargs, dynamic_shapes=to_torch(shapes, kwargs, auto), strict=False,
            prefer_deferred_runtime_asserts_over_guards=deferred,
        )
        _restore_lower_bounds(program, flat.kwargs, shapes, declared, traced)
    return without_unused_weights(program)


def traced_minimums(shapes: DynamicShapes) -> dict[str, int]:
    """Each dim's minimum that tracing alone makes torch assume: 2 (torch.export specialises 0 and 1), or more
    for a mask spanning two such dims (``with_span_bounds``: its lower bound in ``shapes``).

    Example:
        >>> traced_minimums(DynamicShapes(axes={}, bounds={"sequence": (1, 9), "total_sequence": (4, 9)}))
        {'sequence': 2, 'total_sequence': 4}
    """
    return {name: max(_TRACED_MIN, lo) for name, (lo, _) in shapes.bounds.items()}


def _declared_minimum(name: str, lower: int, declared: DynamicShapes, traced: Mapping[str, int]) -> int:
    """The minimum a dim keeps: the declared one when ``lower`` (torch's) is only what tracing assumed, else
    ``lower``, which the model's own code set (DeepSeek-V4 compresses every 4 tokens only when there are 4)."""
    return declared.bounds.get(name, (lower, None))[0] if lower <= traced.get(name, _TRACED_MIN) else lower


def _with_lower_bounds(shapes: DynamicShapes, declared: DynamicShapes, traced: Mapping[str, int]) -> DynamicShapes:
    """``shapes`` with each dim's declared minimum where tracing alone raised it (see ``_restore_lower_bounds``)."""
    bounds = {name: (_declared_minimum(name, lo, declared, traced), hi) for name, (lo, hi) in shapes.bounds.items()}
    return DynamicShapes(axes=shapes.axes, bounds=bounds)


def _restore_lower_bounds(
    program: torch.export.ExportedProgram, kwargs: Mapping[str, Any], shapes: DynamicShapes, declared: DynamicShapes,
    traced: Mapping[str, int],
) -> None:
    """Give each dim back the lower bound it was declared with, where tracing alone raised it.

    Tracing on sizes >= 2 (``widen_unit_axes``) lets torch assume every dim is
    at least 2 and derive larger minimums (a decode mask ``>= 4``); the graph
    computes the same function for 0 and 1, which the tests check at those
    sizes, so the program accepts the declared range. A larger minimum comes
    from the model's code, a branch on the size taken at the capture's size
    (``traced_minimums``), and stays: below it the graph is not the model's.
    """
    from torch.utils._sympy.value_ranges import ValueRanges

    for symbol, name in _symbol_names(program, kwargs, shapes).items():
        current = program.range_constraints.get(symbol)
        if current is None:
            continue
        lower = _declared_minimum(name, int(current.lower), declared, traced)
        if lower < int(current.lower):
            program._range_constraints[symbol] = ValueRanges(lower, current.upper)  # noqa: SLF001


def _capture_error(flat: Capture, exc: BaseException) -> CaptureError:
    first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
    todo = (
        "Check that the model runs eagerly on these inputs; if it does, the traceback above "
        "names the operation torch.export could not trace (add a patch for it with export(patches=...))."
    )
    return CaptureError(describe("export", flat.source, flat.name, f"torch.export failed: {first}.", todo))


def io_spec(program: torch.export.ExportedProgram, flat: Capture, shapes: DynamicShapes,
            declared: DynamicShapes | None = None) -> IoSpec:
    """The calling contract of ``program``: flat inputs and outputs with named dims, specs and bounds (and the
    ``declared`` bounds of the dims whose range the trace narrowed)."""
    symbols = _symbol_names(program, flat.kwargs, shapes)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = [_tensor_spec(name, placeholders[user].meta["val"], symbols) for name, user in _user_inputs(program, flat.kwargs)]
    returned = user_outputs(program)
    taken = {spec.name for spec in inputs}
    names = [_distinct(name, taken) for name in _output_names(program.call_spec.out_spec, len(returned))]
    outputs = [_tensor_spec(name, node.meta["val"], symbols) for name, node in zip(names, returned)
               if isinstance(node, torch.fx.Node)]
    bounds = {}
    for symbol, name in symbols.items():
        vr = program.range_constraints.get(symbol)
        if vr is not None:
            bounds[name] = (int(vr.lower), _finite(vr.upper))
    written = _written_inputs(program)
    return IoSpec(
        inputs=inputs,
        outputs=outputs,
        in_spec=pytree.treespec_dumps(program.call_spec.in_spec),
        out_spec=pytree.treespec_dumps(program.call_spec.out_spec),
        constants=flat.constants,
        bounds=bounds,
        updates=[spec.name for spec, user in zip(inputs, program.graph_signature.user_inputs) if user in written],
        constant_outputs=constant_outputs(program),
        declared_bounds=narrowed_from(bounds, declared.bounds if declared is not None else {}),
    )


def narrowed_from(bounds: Mapping[str, tuple[int, int | None]],
                  declared: Mapping[str, tuple[int, int | None]]) -> dict[str, tuple[int, int | None]]:
    """The ``declared`` bounds of each dim whose ``bounds`` are narrower.

    Example:
        >>> narrowed_from({"sequence": (4, 7), "batch": (1, None)}, {"sequence": (1, 512), "batch": (1, None)})
        {'sequence': (1, 512)}
    """
    def narrower(now: tuple[int, int | None], asked: tuple[int, int | None]) -> bool:
        return now[0] > asked[0] or (now[1] is not None and (asked[1] is None or now[1] < asked[1]))

    return {name: tuple(declared[name]) for name, now in bounds.items() if name in declared and narrower(now, declared[name])}


def _written_inputs(program: torch.export.ExportedProgram) -> set[str]:
    """Placeholder names of the user inputs an in-place op writes (``index_copy_`` into a static cache)."""
    root = {name: name for name in program.graph_signature.user_inputs}  # node name -> the input it aliases
    written = set(program.graph_signature.user_inputs_to_mutate.values())
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args):
            source = root.get(getattr(value, "name", None))
            if source is None or argument.alias_info is None:
                continue
            if argument.alias_info.is_write:
                written.add(source)
            elif schema.returns and schema.returns[0].alias_info is not None:
                root[node.name] = source  # a view or alias (``to`` with the same dtype) of the input
    return written


def _user_inputs(program: torch.export.ExportedProgram, kwargs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(leaf name, placeholder name)`` of each tensor input; ``None`` and other constants have no placeholder."""
    pairs = zip(named_leaves(kwargs), program.graph_signature.user_inputs, strict=True)
    return [(name, user) for (name, leaf), user in pairs if isinstance(leaf, torch.Tensor) and user is not None]


def _finite(bound: Any) -> int | None:
    """``int(bound)``, or ``None`` for torch's ``int_oo`` / sympy's ``oo``."""
    return int(bound) if getattr(bound, "is_Integer", False) else None


def _symbol_names(program: torch.export.ExportedProgram, kwargs: Mapping[str, Any], shapes: DynamicShapes) -> dict[sympy.Symbol, str]:
    """Map each input symbol of ``program`` (``s43``) to its dim name (``batch``)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    names: dict[sympy.Symbol, str] = {}
    for leaf, user in _user_inputs(program, kwargs):
        val = placeholders[user].meta.get("val")
        for axis, dim in shapes.axes.get(leaf, {}).items():
            size = val.shape[axis] if isinstance(val, torch.Tensor) else None
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                names.setdefault(size.node.expr, dim)
    return names


def _tensor_spec(name: str, val: Any, symbols: Mapping[sympy.Symbol, str]) -> TensorSpec:
    if not isinstance(val, torch.Tensor):
        return TensorSpec(name=name, dtype=type(val).__name__, shape=())
    shape: list[int | str] = []
    for size in val.shape:
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            shape.append(int(expr) if expr.is_number else str(expr.xreplace({s: sympy.Symbol(n) for s, n in symbols.items()})))
        else:
            shape.append(int(size))
    return TensorSpec(name=name, dtype=str(val.dtype).removeprefix("torch."), shape=tuple(shape))


def _distinct(name: str, inputs: set[str]) -> str:
    """An output name no input has: a cache handed back is ``present.*`` (as in Optimum's ONNX files)."""
    if name not in inputs:
        return name
    top, _, rest = name.partition(".")
    return f"present.{rest}" if rest and top in ("past_key_values", "cache_params") else f"output.{name}"


def _output_names(out_spec: pytree.TreeSpec, count: int) -> list[str]:
    """Dotted names of the output leaves (``logits``, ``hidden_states.0``)."""
    structure = pytree.tree_unflatten([torch.empty(0)] * count, out_spec)
    with_paths, _ = pytree.tree_flatten_with_path(structure)
    from hfx._pytree import leaf_name

    return [leaf_name(path) or "output" for path, _ in with_paths]
