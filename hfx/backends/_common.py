"""Helpers every runtime module shares."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from hfx._records import Capture, Exported


def require(*modules: str, extra: str) -> None:
    """Raise ``ImportError`` naming the pip extra to install when any of ``modules`` is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = (
            f"this runtime needs {', '.join(missing)}, which is not installed. "
            f"Install it with: pip install 'hfx[{extra}]'"
        )
        raise ImportError(msg)


def as_exported(subject: Any, *, stage: str) -> Exported:
    """``subject`` if it is already ``Exported``; a ``Capture`` is exported first."""
    if isinstance(subject, Exported):
        return subject
    if isinstance(subject, Capture):
        from hfx._export.export import export

        return export(subject)
    msg = f"{stage} takes an Exported or a Capture (or Components of them), got {type(subject).__name__}"
    raise TypeError(msg)


def spec_caches(exported: Exported) -> Any:
    """A context in which the cache classes named by ``exported``'s specs are pytree nodes (for lowering)."""
    from hfx._pytree import classes_in_spec, registered_caches

    return registered_caches(classes_in_spec(exported.io.in_spec) + classes_in_spec(exported.io.out_spec))


def without_runtime_asserts(exported: Exported) -> Exported:
    """``exported`` with the graph's runtime asserts (and the nodes only they used) removed.

    Checks like transformers' ``torch_compilable_check`` (image tokens match
    image features) and deferred shape relations trace to
    ``_is_all_true -> item -> _assert_scalar``: ONNX has no ``_is_all_true``,
    ExecuTorch and OpenVINO no asserts. hfx checks names, dtypes, dims and
    bounds before a call. The graph is copied; the ``Exported`` given is not changed.
    """
    import attrs

    from hfx._export.asserts import without_asserts

    stripped = without_asserts(exported.program)
    return exported if stripped is exported.program else attrs.evolve(exported, program=stripped)


def for_runtime(exported: Exported) -> Exported:
    """What a runtime that cannot write inputs or run asserts lowers: asserts removed, in-place writes as outputs."""
    return with_updates_as_outputs(without_runtime_asserts(exported))


def with_updates_as_outputs(exported: Exported) -> Exported:
    """``exported`` with its in-place input writes turned into trailing outputs.

    ONNX, ExecuTorch and OpenVINO graphs cannot write their inputs: the
    functional program returns the new values of ``io.updates`` after the
    model's outputs (named ``updated.<input>``), and the call copies them back
    into the caller's tensors. The ``Exported`` given is not changed.
    """
    if not exported.io.updates:
        return exported
    import dataclasses

    import attrs
    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec
    from torch.utils import _pytree as pytree

    from hfx._records import TensorSpec

    with spec_caches(exported):
        functional = exported.program.run_decompositions({})
        signature = functional.graph_signature
        output = next(n for n in functional.graph.nodes if n.op == "output")
        pairs = list(zip(output.args[0], signature.output_specs))
        kept = [(arg, spec) for arg, spec in pairs if spec.kind != OutputKind.USER_INPUT_MUTATION]
        written = {spec.target: arg for arg, spec in pairs if spec.kind == OutputKind.USER_INPUT_MUTATION}
        placeholder_of = dict(zip(exported.io.input_names, signature.user_inputs))
        moved = [(written[placeholder_of[name]], name) for name in exported.io.updates]
        output.args = (tuple(arg for arg, _ in kept) + tuple(arg for arg, _ in moved),)
        functional.graph_module.recompile()
        specs = [spec for _, spec in kept]
        specs += [OutputSpec(kind=OutputKind.USER_OUTPUT, arg=spec_arg(arg), target=None) for arg, _ in moved]
        out_spec = pytree.TreeSpec(tuple, None, [functional.call_spec.out_spec] + [pytree.treespec_leaf()] * len(moved))
        entries = [
            dataclasses.replace(entry, signature=dataclasses.replace(entry.signature, out_spec=out_spec))
            if entry.fqn == "" and entry.signature is not None else entry
            for entry in functional.module_call_graph
        ]
        program = ExportedProgram(
            root=functional.graph_module,
            graph=functional.graph,
            graph_signature=ExportGraphSignature(input_specs=signature.input_specs, output_specs=specs),
            state_dict=functional.state_dict,
            range_constraints=functional.range_constraints,
            module_call_graph=entries,
            constants=functional.constants,
            verifiers=[functional.verifier],
        )
    by_name = {spec.name: spec for spec in exported.io.inputs}
    extra = [TensorSpec(name=f"updated.{name}", dtype=by_name[name].dtype, shape=by_name[name].shape) for name in exported.io.updates]
    return attrs.evolve(exported, program=program, io=attrs.evolve(exported.io, outputs=(*exported.io.outputs, *extra)))


def spec_arg(node: Any) -> Any:
    """The ``TensorArgument`` naming an FX node in a graph signature."""
    from torch.export.graph_signature import TensorArgument

    return TensorArgument(name=node.name)


@contextlib.contextmanager
def captured_output(buffer: io.StringIO, namespaces: tuple[str, ...]) -> Iterator[None]:
    """Write prints, warnings and the log records of ``namespaces`` to ``buffer`` while the block runs.

    The loggers' handlers are swapped and put back on exit, so this is
    process-global while active, like every hfx patch: do not lower in threads.
    """
    from hfx.patches import swap_attr

    handler = logging.StreamHandler(buffer)
    with contextlib.ExitStack() as stack:
        for logger in _loggers(namespaces):
            stack.enter_context(swap_attr(logger, "handlers", [handler]))
            stack.enter_context(swap_attr(logger, "propagate", False))
        stack.enter_context(contextlib.redirect_stdout(buffer))
        stack.enter_context(contextlib.redirect_stderr(buffer))
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        try:
            yield
        finally:
            buffer.writelines(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)


def _loggers(namespaces: tuple[str, ...]) -> list[logging.Logger]:
    """The top logger of each namespace and every existing logger under it that has its own handlers."""
    existing = [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and logger.handlers and name.split(".")[0] in namespaces
    ]
    return list({id(lg): lg for lg in [*map(logging.getLogger, namespaces), *existing]}.values())


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def root_cause(exc: BaseException) -> str:
    """``Type: first line`` of the innermost cause (runtimes wrap failures in long preambles)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {first_line(exc)}"


def with_log(message: str, log: str, *, source: str) -> str:
    """``message`` followed by the last 40 lines ``source`` printed, when it printed anything."""
    tail = "\n".join(log.strip().splitlines()[-40:])
    return f"{message}\n{source} output:\n{tail}" if tail else message


def lowering_error(stage: str, exported: Exported, what: str, todo: str, log: str = "", *, source: str) -> Any:
    """A ``LoweringError`` naming the stage, component and model, with the runtime's own output."""
    from hfx._errors import LoweringError, describe

    message = describe(stage, exported.source_class or "model", exported.name, what, todo)
    return LoweringError(with_log(message, log, source=source))


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of ``packages`` (for the manifest)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found
