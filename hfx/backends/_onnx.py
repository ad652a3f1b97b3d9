"""The ONNX runtime: ``lower_to_onnx`` and ``OnnxProgram``, run on ONNX Runtime.

The ONNX model is held as an ``onnx_ir.Model``, the in-memory form that
``torch.onnx`` builds and that the onnxscript optimizer, rewriter and version
converter work on. Keeping that form needs no conversion after lowering, and it
is not bound by protobuf's 2 GB limit: ``save_files`` streams the weights to
``<name>.onnx.data`` and large models reach ONNX Runtime as files. Use
``onnx_ir.to_proto(program.model)`` where an ``onnx.ModelProto`` is needed.
The exporter's and ONNX Runtime's bugs are worked around by the fixes of
``_onnx_fixes`` (``ONNX_FIXES``, the ``fixes`` option), wrapped around ``torch.onnx.export``;
the graph then gets ONNX Runtime's fused operators from the fusions of ``_onnx_fusions``
(``ORT_FUSIONS``, the ``fusions`` option). A session runs on ``threads`` intra-op threads
and the ``providers`` given (CUDA first when ONNX Runtime has it, then CPU).
"""

from __future__ import annotations

import functools
import io
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._contract import FlatCall, call
from hfx._errors import LoweringError
from hfx._export.updates import for_runtime
from hfx.backends._lowering_speed import lowering_speedups
from hfx._lift import per_component
from hfx._mapped_pages import release_copied_pages
from hfx._records import Capture, Exported, IoSpec
from hfx.backends._common import (
    as_exported,
    captured_output,
    check_threads,
    default_threads,
    first_line,
    fix_names,
    fixes_option,
    given_options,
    lowering_error,
    require,
    root_cause,
)
from hfx.backends._onnx_fixes import ONNX_FIXES, OnnxFix, exact_no_op_constants
from hfx.backends._onnx_fusions import ORT_FUSIONS, OnnxFusion
from hfx._serial import one_at_a_time
from hfx.backends._onnx_translations import onnx_translations

RUNTIME = "onnx"

# torchlib implements every aten op at opset 18; below it torch.onnx silently keeps 18.
MIN_OPSET = 18

# Models whose in-memory weights exceed this are handed to ONNX Runtime as files (protobuf stops at 2 GB).
_IN_MEMORY_LIMIT = 1_500_000_000
# A loaded program reads weights up to this into memory, so it outlives its directory; larger ones stay in the
# saved data file, which ONNX Runtime reads itself: read into Python, serialised and parsed, they were held three
# times (SmolLM-135M's 538 MB of weights: 2391 MB peak RSS while generating, 1137 MB from the file; docs/benchmarks.md).
_LOAD_IN_MEMORY_LIMIT = 256 * 2**20

# Lets ONNX Runtime resolve external data of a model given as bytes (onnxruntime >= 1.18).
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"

# Logger namespaces whose records a lowering keeps for its error message instead of printing them.
_QUIET_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnx")

_CPU = "CPUExecutionProvider"
# Used, in this order, when ONNX Runtime has them; the CPU provider runs what the others do not take.
_PREFERRED_PROVIDERS = ("CUDAExecutionProvider", _CPU)


def default_providers() -> tuple[str, ...]:
    """The execution providers a session uses unless told: CUDA when this ONNX Runtime has it, then CPU."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    return tuple(p for p in _PREFERRED_PROVIDERS if p in available or p == _CPU)


@attrs.frozen(kw_only=True, eq=False)
class OnnxProgram:
    """An in-memory ONNX model, its calling contract and an ONNX Runtime session.

    ``model`` is an ``onnx_ir.Model`` whose graph inputs and outputs carry the
    names of ``io`` and whose dynamic axes carry hfx's dim names (``batch``,
    ``sequence``). ``fixes`` names the fixes it was lowered with
    (``lower_to_onnx(fixes=...)``) and ``fusions`` counts the fused operators each
    fusion made (``lower_to_onnx(fusions=...)``; only those that fired). The session
    runs on ``threads`` intra-op threads (one inter-op thread, sequential) and on
    ``providers``, in order; ``attrs.evolve(program, threads=1)`` opens a new one.
    Calling the program checks the keyword arguments against ``io``, runs the
    session and returns the model's output structure.
    """

    model: Any = attrs.field(repr=False)  # onnx_ir.Model
    io: IoSpec
    name: str = "model"
    opset: int = MIN_OPSET
    fixes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    fusions: Mapping[str, int] = attrs.field(factory=dict, converter=lambda counts: MappingProxyType(dict(counts)))
    threads: int = attrs.field(factory=default_threads)
    providers: tuple[str, ...] = attrs.field(factory=default_providers, converter=tuple)
    _session: Any = attrs.field(init=False, repr=False, default=attrs.Factory(
        lambda self: _new_session(self.model, threads=self.threads, providers=self.providers), takes_self=True))

    @threads.validator
    def _check_threads(self, attribute: Any, value: Any) -> None:
        check_threads("OnnxProgram", value)

    @providers.validator
    def _check_providers(self, attribute: Any, value: Any) -> None:
        check_providers("OnnxProgram", value)

    def __call__(self, **kwargs: Any) -> Any:
        """Run the model on ``kwargs`` (checked against ``io``); return the eager model's output structure."""
        return call(self.io, self._run, kwargs, program=f"OnnxProgram({self.name})")

    def flat_call(self) -> FlatCall:
        """The session on flat values, nothing checked (``hfx._contract.FlatCall``): what ``hfx.generate`` runs per step.

        It runs with IO binding: torch inputs are read from their memory, and the outputs
        stay ``OrtValue``s, which go back in as the next step's inputs without a copy.
        """
        import onnxruntime as ort

        device = ort.OrtDevice.make("cpu", 0)._get_c_device()  # noqa: SLF001 - what the binding's methods take
        return FlatCall(io=self.io, run=functools.partial(self._run_bound, self._session.io_binding(), device),
                        to_torch=_ort_to_torch)

    def _run(self, flat: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            if self.io.updates:
                return self._run_in_place(flat)
            feeds = {spec.name: tensor.numpy() for spec, tensor in zip(self.io.inputs, flat)}
            outputs = self._session.run(list(self.io.output_names), feeds)
        except Exception as exc:
            raise self._failed(exc) from exc
        return [torch.from_numpy(output) for output in outputs]

    def _failed(self, exc: Exception) -> LoweringError:
        return LoweringError(f"OnnxProgram({self.name}): ONNX Runtime failed: {first_line(exc)}")

    def _run_bound(self, binding: Any, device: Any, values: list[Any]) -> Any:
        """Run ``values`` (torch tensors or ``OrtValue``s, in ``io.inputs`` order) through ``binding``; the outputs,
        ``OrtValue``s in CPU memory.

        It calls the C++ binding and session that ONNX Runtime's Python wrappers hold, not the wrappers,
        whose checks and per-value device objects cost more than all of hfx's own work in a step
        (measured on the zoo's Llama with ONNX Runtime 1.32: 0.29 ms a step through them, 0.25 ms without).
        """
        bound = binding._iobinding  # noqa: SLF001
        try:
            for spec, value in zip(self.io.inputs, values, strict=True):
                if isinstance(value, torch.Tensor):
                    bound.bind_input(spec.name, device, _numpy_dtype(value), list(value.shape), value.data_ptr())
                else:
                    bound.bind_ortvalue_input(spec.name, value)
            for spec in self.io.outputs:
                # Unallocated for each run: ONNX Runtime writes into an output allocated by the run before, which
                # must then have this run's shape (a growing cache does not) and may be this run's input.
                bound.bind_output(spec.name, device)
            self._session._sess.run_with_iobinding(bound, None)  # noqa: SLF001
            return bound.get_outputs()
        except Exception as exc:
            raise self._failed(exc) from exc

    def _run_in_place(self, flat: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run with IO binding: inputs are read from the tensors' memory and the new values of
        in-place inputs (a static cache) are written straight into torch tensors, which then
        replace the caller's buffers without a copy (``hfx._contract`` swaps the storage).

        Binding an output to its own input's memory is not safe: ONNX Runtime may read the
        input after it wrote the output (measured: wrong tokens).
        """
        binding = self._session.io_binding()
        for spec, tensor in zip(self.io.inputs, flat):
            binding.bind_input(spec.name, "cpu", 0, _numpy_dtype(tensor), list(tensor.shape), tensor.data_ptr())
        where = dict(zip(self.io.input_names, flat))
        returned = len(self.io.outputs) - len(self.io.updates)
        for spec in self.io.outputs[:returned]:
            binding.bind_output(spec.name, "cpu")
        fresh = [torch.empty_like(where[name]) for name in self.io.updates]
        for spec, target in zip(self.io.outputs[returned:], fresh):
            binding.bind_output(spec.name, "cpu", 0, _numpy_dtype(target), list(target.shape), target.data_ptr())
        self._session.run_with_iobinding(binding)
        outputs = [torch.from_numpy(value) for value in binding.copy_outputs_to_cpu()[:returned]]
        return outputs + fresh


def _numpy_dtype(tensor: torch.Tensor) -> Any:
    return _numpy_dtype_of(tensor.dtype)


@functools.cache
def _numpy_dtype_of(dtype: torch.dtype) -> Any:
    import numpy as np

    return np.dtype(str(dtype).removeprefix("torch."))


def _ort_to_torch(value: Any) -> torch.Tensor:
    """An ``OrtValue`` in CPU memory as a torch tensor."""
    return torch.from_numpy(value.numpy())


@curry
@per_component
def lower_to_onnx(
    exported: Exported | Capture,
    /,
    *,
    opset: int = MIN_OPSET,
    optimize: bool = True,
    fixes: tuple[OnnxFix, ...] = ONNX_FIXES,
    fusions: tuple[OnnxFusion, ...] = ORT_FUSIONS,
    threads: int | None = None,
    providers: tuple[str, ...] | None = None,
) -> OnnxProgram:
    """Lower ``exported`` to an ONNX model and open an ONNX Runtime session on it.

    ``torch.onnx.export`` runs wrapped in ``fixes``, the workarounds of the
    exporter's and ONNX Runtime's bugs (``hfx.backends.ONNX_FIXES``); the program
    records their names in ``fixes``. ``fusions`` then rewrite the graph to ONNX
    Runtime's fused operators where their patterns match (decoder LLMs:
    ``GroupQueryAttention``, ``RotaryEmbedding``, ``SkipSimplifiedLayerNormalization``;
    other attention: ``MultiHeadAttention``; ``hfx.backends.ORT_FUSIONS``), keeping the graph's inputs and outputs; the program
    records how many each made in ``fusions``. The ``Exported`` is not changed; lower it
    again, or to another runtime, at will. ``torch.onnx``'s progress messages, log
    records and warnings are kept for the error message and never reach the console.

    Args:
        exported: an ``Exported`` (a ``Capture`` is exported first), or ``Components`` of them.
        opset: the default-domain ONNX opset, at least 18.
        optimize: run the onnxscript optimizer (constant folding, redundancy removal).
        fixes: functions ``fix(convert) -> onnx_ir.Model``, where ``convert()`` runs the export
            (and the fixes before this one) and returns the model with hfx's names; each
            wraps the ones before it. ``ONNX_FIXES`` extended
            (``(*hfx.backends.ONNX_FIXES, my_fix)``) or filtered, or your own.
        fusions: functions ``fusion(model) -> int`` that rewrite the ``onnx_ir.Model`` in place
            and return how many places they rewrote, run in order after the fixes;
            ``ORT_FUSIONS`` by default, ``()`` keeps the graph in standard ONNX ops.
        threads: the session's intra-op threads; ``None``: ``default_threads()``, the CPUs
            this process may use.
        providers: ONNX Runtime execution providers, in order of preference; ``None``:
            ``default_providers()``, CUDA when this ONNX Runtime has it, then CPU.

    Returns:
        An ``OnnxProgram`` callable like the model (``Components`` of them for ``Components``).

    Raises:
        ImportError: onnx, onnxscript or onnxruntime is missing (install ``hfx[onnx]``).
        ValueError: ``opset`` is out of range, ``threads`` is not a positive int or
            ``providers`` names one this ONNX Runtime does not have.
        TypeError: ``exported`` is neither ``Exported`` nor ``Capture``, or ``fixes`` or
            ``fusions`` is not a tuple of callables.
        LoweringError: torch.onnx or ONNX Runtime failed; names the component and model.

    Example:
        >>> import torch, hfx
        >>> linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
        >>> program = lower_to_onnx(linear)
        >>> program(input=torch.ones(5, 3)).shape
        torch.Size([5, 4])
        >>> def documented(convert):
        ...     model = convert()
        ...     model.doc_string = "a Linear"
        ...     return model
        >>> program = lower_to_onnx(linear, fixes=(*hfx.backends.ONNX_FIXES, documented))
        >>> program.model.doc_string, program.fixes[-1]
        ('a Linear', 'documented')
    """
    require("onnx", "onnxscript", "onnxruntime", extra="onnx", stage="lower_to_onnx")
    check_opset(opset)
    fixes = fixes_option(fixes, stage="lower_to_onnx", option="fixes", default="ONNX_FIXES")
    fusions = fixes_option(fusions, stage="lower_to_onnx", option="fusions", default="ORT_FUSIONS")
    threads = default_threads() if threads is None else check_threads("lower_to_onnx", threads)
    providers = default_providers() if providers is None else check_providers("lower_to_onnx", providers)
    exported = for_runtime(as_exported(exported, stage="lower_to_onnx"))
    with lowering_speedups(exported.io):
        model, fused = _to_onnx(exported, opset=opset, optimize=optimize, fixes=fixes, fusions=fusions)
    try:
        return OnnxProgram(model=model, io=exported.io, name=exported.name, opset=opset, fixes=fix_names(fixes),
                           fusions=fused, threads=threads, providers=providers)
    except Exception as exc:
        what = f"ONNX Runtime could not load the lowered model: {first_line(exc)}."
        todo = (
            "ONNX Runtime's CPU kernels do not cover every dtype and opset (bfloat16 has almost none): "
            "cast the model to float32, or lower with another opset, optimize=False or fusions=()."
        )
        raise _lowering_error(exported, what, todo) from exc


def check_opset(opset: int) -> None:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= newest:
        msg = f"lower_to_onnx: opset must be an int in [{MIN_OPSET}, {newest}], got {opset!r}"
        raise ValueError(msg)


def check_providers(stage: str, providers: Any) -> tuple[str, ...]:
    """``providers`` as a tuple if each is an execution provider this ONNX Runtime has, else a ``ValueError``."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if isinstance(providers, str) or not providers or any(p not in available for p in providers):
        msg = (f"{stage}: providers must be a non-empty tuple of ONNX Runtime execution providers among "
               f"{available}, got {providers!r}")
        raise ValueError(msg)
    return tuple(providers)


@one_at_a_time
def _to_onnx(exported: Exported, *, opset: int, optimize: bool, fixes: tuple[OnnxFix, ...],
             fusions: tuple[OnnxFusion, ...]) -> tuple[Any, dict[str, int]]:
    """Run ``torch.onnx.export`` on the ExportedProgram, give the graph hfx's names and wrap it all in ``fixes``;
    then run ``fusions`` on the model and return it with the counts of those that fired."""
    log = io.StringIO()

    def convert() -> Any:
        onnx_program = torch.onnx.export(
            exported.program,
            dynamo=True,
            opset_version=opset,
            optimize=optimize,
            verbose=False,
            input_names=list(exported.io.input_names),
            output_names=list(exported.io.output_names),
            custom_translation_table=onnx_translations() or None,  # ops torchlib lacks (erfinv)
        )
        onnx_program.rename_axes(_dim_names(onnx_program.model.graph.inputs, exported.io))
        _name_output_dims(onnx_program.model, exported.io)
        return onnx_program.model

    try:
        with _quietly(log):
            model = _wrapped(convert, fixes)()
    except Exception as exc:
        what = f"torch.onnx.export failed: {root_cause(exc)}."
        todo = (
            "If an operator has no ONNX translation, replace it with a patch at export "
            "(export(patches=...)) or lower exported.program with torch.onnx.export(custom_translation_table=...)."
        )
        raise _lowering_error(exported, what, todo, log.getvalue()) from exc
    fused = _fused(exported, model, fusions, log)
    _check_contract(exported, model, opset, log.getvalue())
    return model, fused


def _fused(exported: Exported, model: Any, fusions: tuple[OnnxFusion, ...], log: io.StringIO) -> dict[str, int]:
    """Run each of ``fusions`` on ``model`` in place; the names and counts of those that rewrote something."""
    counts = {}
    for name, fusion in zip(fix_names(fusions), fusions):
        try:
            with _quietly(log), exact_no_op_constants():  # the fusions run onnxscript's optimizer too
                counts[name] = fusion(model)
        except Exception as exc:
            what = f"the fusion {name!r} failed: {root_cause(exc)}."
            todo = "Lower with fusions=() (standard ONNX ops) or without that fusion, and report it to hfx."
            raise _lowering_error(exported, what, todo, log.getvalue()) from exc
    return {name: count for name, count in counts.items() if count}


def _wrapped(convert: Callable[[], Any], fixes: tuple[OnnxFix, ...]) -> Callable[[], Any]:
    """``convert`` wrapped in each of ``fixes`` in turn: the first fix is the innermost."""
    return functools.reduce(lambda inner, fix: functools.partial(fix, inner), fixes, convert)


def _quietly(buffer: io.StringIO) -> Any:
    """Keep torch.onnx's and onnxscript's prints, warnings and logs in ``buffer`` while lowering."""
    return captured_output(buffer, _QUIET_LOGGERS)


def _check_contract(exported: Exported, model: Any, opset: int, log: str) -> None:
    """Raise ``LoweringError`` unless the graph has the IoSpec's inputs and outputs and the asked opset."""
    got = ([v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs], model.opset_imports.get(""))
    want = (list(exported.io.input_names), list(exported.io.output_names), opset)
    if got != want:
        what = f"the ONNX graph has inputs {got[0]}, outputs {got[1]} and opset {got[2]}; expected {want}."
        todo = "Lower with opset=18 and report the mismatch to hfx."
        raise _lowering_error(exported, what, todo, log)


def _dim_names(graph_inputs: Any, io_spec: IoSpec) -> dict[str, str]:
    """Map the exporter's symbols (``s43``) to the IoSpec's dim names (``batch``), read off the graph inputs."""
    import onnx_ir as ir

    names: dict[str, str] = {}
    for value, spec in zip(graph_inputs, io_spec.inputs):
        for dim, want in zip(value.shape or (), spec.shape):
            if isinstance(dim, ir.SymbolicDim) and isinstance(dim.value, str) and isinstance(want, str):
                names.setdefault(dim.value, want)
    return names


def _name_output_dims(model: Any, io_spec: IoSpec) -> None:
    """Give each dynamic output axis the IoSpec's expression (``sequence - 1``), as torch.export wrote it."""
    import onnx_ir as ir

    for value, spec in zip(model.graph.outputs, io_spec.outputs):
        if value.shape is None or len(value.shape) != len(spec.shape):
            continue
        dims = [
            ir.SymbolicDim(want) if isinstance(want, str) and not isinstance(dim, int) else dim
            for dim, want in zip(value.shape, spec.shape)
        ]
        value.shape = ir.Shape(dims)


def _new_session(model: Any, *, threads: int, providers: tuple[str, ...]) -> Any:
    """An ``InferenceSession`` on ``model``: from bytes, or from a temporary file for large models."""
    import onnx_ir as ir
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT's C++ warnings would bypass Python's streams
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    tensors = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    folders = {str(t.base_dir) for t in tensors if isinstance(t, ir.ExternalTensor)}
    in_memory = sum(t.nbytes for t in tensors if not isinstance(t, ir.ExternalTensor))
    if in_memory <= _IN_MEMORY_LIMIT and len(folders) <= 1:
        if folders:
            options.add_session_config_entry(_EXTERNAL_FOLDER, next(iter(folders)))
        session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), options, providers=list(providers))
        _read_mapped_rows_page_by_page(tensors)
        return session
    # Linux keeps memory-mapped weights valid after the files are removed; elsewhere cleanup errors are ignored.
    with tempfile.TemporaryDirectory(prefix="hfx-onnx-", ignore_cleanup_errors=True) as tmp:
        path = Path(tmp) / "model.onnx"
        ir.save(model, path, external_data="model.onnx.data")
        return ort.InferenceSession(str(path), options, providers=list(providers))


def _read_mapped_rows_page_by_page(tensors: list[Any]) -> None:
    """Have the pages ONNX Runtime reads again from the data files of ``tensors`` come back one at a time
    (``hfx._mapped_pages.release_copied_pages``).

    ONNX Runtime copies most weights into its own memory (prepacked) and keeps the embedding in a private
    mapping of the file, from which its lookup reads rows: a 128-token prompt of a SmolLM-135M-shaped
    decoder, saved just before, mapped 92 MB of the 108 MB table (ONNX Runtime 1.32, 6.18 kernel, ext4).
    A no-op for weights in memory.
    """
    import onnx_ir as ir

    for path in sorted({str(Path(t.base_dir) / t.location) for t in tensors if isinstance(t, ir.ExternalTensor)}):
        release_copied_pages(path)


def _lowering_error(exported: Exported, what: str, todo: str, log: str = "") -> LoweringError:
    return lowering_error("lower_to_onnx", exported, what, todo, log, source="torch.onnx")


def save_files(program: OnnxProgram, directory: Path, *, filename: str = "", data: str = "") -> dict[str, Any]:
    """Write ``<name>.onnx`` and its weights, ``<name>.onnx.data``, into ``directory``; return the manifest entry.

    ``filename`` (a path under ``directory``) and ``data`` (the weights' file beside it) name them for a package's layout.
    """
    import onnx_ir as ir

    filename = filename or f"{program.name}.onnx"
    data = data or f"{Path(filename).name}.data"
    (directory / filename).parent.mkdir(parents=True, exist_ok=True)
    # Weights go to the data file, so models over 2 GB save; tensors under 256 bytes (axes, shapes) stay
    # inline because ONNX Runtime's shape inference cannot read external ones. 64 KiB alignment lets ORT mmap.
    ir.save(program.model, directory / filename, external_data=data, size_threshold_bytes=256, alignment=65536)
    files = [f for f in (filename, Path(filename).with_name(data).as_posix()) if (directory / f).is_file()]
    return {"files": files, "opset": program.opset, "fixes": list(program.fixes), "fusions": dict(program.fusions)}


def load_files(entry: Mapping[str, Any], directory: Path, *, name: str, io: IoSpec,
               threads: int | None = None) -> OnnxProgram:
    """Load a program written by ``save_files``; weights up to 256 MiB are read into memory.

    Such a program outlives its directory. Larger weights stay in the saved
    data file, which ONNX Runtime reads when it opens a session: keep the
    directory while the program runs (a program made with other ``threads``
    opens a new session).

    The session gets ``threads`` (``None``: this machine's ``default_threads()``) and
    ``default_providers()`` (``attrs.evolve(program, providers=...)`` for others).
    """
    require("onnx", "onnxscript", "onnxruntime", extra="onnx", stage="load")
    import onnx_ir as ir

    model = ir.load(Path(directory).resolve() / entry["files"][0])
    tensors = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    if sum(t.nbytes for t in tensors) <= min(_LOAD_IN_MEMORY_LIMIT, _IN_MEMORY_LIMIT):
        ir.external_data.load_to_model(model)  # the program then outlives its directory
    opset = int(entry.get("opset", MIN_OPSET))
    return OnnxProgram(model=model, io=io, name=name, opset=opset, fixes=entry.get("fixes", ()),
                       fusions=entry.get("fusions", {}), **given_options(threads=threads))
