"""The OpenVINO runtime: an ``Exported`` converted to an ``openvino.Model`` and compiled for a device.

``lower_to_ov`` decomposes a private copy of the exported program with the
table ``openvino.convert_model`` uses, applies the graph fixes
(``OV_GRAPH_FIXES``, in ``_openvino_fixes``) to that copy,
converts it with OpenVINO's PyTorch frontend, gives the model the ``IoSpec``'s
input and output names and input shapes, and compiles it with f32 inference
precision. The ``OvProgram`` owns its weights: nothing in it aliases the eager
model's parameters.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np
import torch
from toolz import curry

from hfx._contract import FlatCall, call
from hfx._cpu import onednn_capped_below_vnni
from hfx._errors import LoweringError, describe
from hfx._lift import per_component
from hfx._mapped_pages import release_copied_pages
from hfx._records import Capture, Exported, IoSpec, TensorSpec
from hfx._export.updates import for_runtime
from hfx.backends._lowering_speed import lowering_speedups
from hfx.backends._common import (
    as_exported,
    check_threads,
    default_threads,
    fix_names,
    fixes_option,
    given_options,
    require,
)
from hfx.backends._openvino_fixes import OV_GRAPH_FIXES, OvGraphFix
from hfx.backends._openvino_probes import snippets_miscompute_zeroed_attention
from hfx.backends._openvino_stateful import CACHE_INPUT, stateful_io, stateful_model
from hfx._serial import one_at_a_time

RUNTIME = "openvino"

# The CPU plugin picks bf16 inference on processors with AVX512-BF16 or AMX; hfx programs must match eager.
COMPILE_OPTIONS: Mapping[str, str] = MappingProxyType({"INFERENCE_PRECISION_HINT": "f32"})
# A stateful model's KV cache is u8 by default on the CPU plugin (the first decode step's logits 1.5e-3 off
# eager on the zoo's Llama); f32 keeps it exact.
STATEFUL_COMPILE_OPTIONS: Mapping[str, str] = MappingProxyType({**COMPILE_OPTIONS, "KV_CACHE_PRECISION": "f32"})


@functools.cache
def _core() -> Any:
    """The process's one ``openvino.Core``, made on first use (never at import)."""
    import openvino

    return openvino.Core()


@attrs.frozen(kw_only=True, eq=False)
class OvProgram:
    """An OpenVINO model, its calling contract and the model compiled for ``device``.

    ``model``'s inputs and outputs carry the names of ``io``; ``graph_fixes``
    names the graph fixes it was lowered with (``lower_to_ov(graph_fixes=...)``).
    Calling the program checks the keyword arguments against ``io``, runs one inference
    request and returns the model's output structure with torch tensors. Each
    thread calls through a request of its own, so a program can be called from several threads.
    To compile for another device, ``attrs.evolve(program, device="GPU")``; it computes
    on ``threads`` CPU threads (``INFERENCE_NUM_THREADS``) with OpenVINO's latency hint
    (one request at a time, as generation runs), and ``attrs.evolve(program, threads=1)``
    compiles it again for one.

    ``state`` names the cache inputs a stateful model keeps inside OpenVINO
    (``lower_to_ov(stateful=True)``): it takes no cache and returns none, and a
    ``beam_idx`` input reorders the cache rows. A call starts from an empty cache;
    ``session()`` gives a callable whose calls share one request, so the cache
    grows from call to call (what ``hfx.generate`` uses).
    """

    model: Any = attrs.field(repr=False)  # openvino.Model
    io: IoSpec
    name: str = "model"
    device: str = "CPU"
    source_class: str = ""
    graph_fixes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    state: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    threads: int = attrs.field(factory=default_threads)
    _compiled: Any = attrs.field(
        init=False, repr=False, default=attrs.Factory(lambda self: _compile(self), takes_self=True)
    )

    _requests: threading.local = attrs.field(init=False, repr=False, factory=threading.local)
    # The positions in ``io.inputs`` of the model's inputs: OpenVINO drops an input the graph never reads.
    _fed: tuple[int, ...] = attrs.field(
        init=False, repr=False, default=attrs.Factory(lambda self: _fed_inputs(self.model, self.io), takes_self=True)
    )

    @threads.validator
    def _check_threads(self, attribute: Any, value: Any) -> None:
        check_threads("OvProgram", value)

    def __call__(self, **kwargs: Any) -> Any:
        """Run the compiled model on ``kwargs`` (checked against ``io``)."""
        return call(self.io, self._run, kwargs, program=f"OvProgram({self.name})")

    def _request(self) -> Any:
        """This thread's inference request (made once per thread: making one costs about as much as a tiny
        model's decode step); a stateful model gets a new one, so that a plain call starts from an empty cache."""
        if self.state:
            return self._compiled.create_infer_request()
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self._compiled.create_infer_request()
        return request

    def session(self) -> OvSession:
        """A callable like the program whose calls share one inference request (and a stateful model's cache)."""
        return OvSession(program=self, request=self._compiled.create_infer_request())

    def flat_call(self) -> FlatCall:
        """The compiled model on flat OpenVINO tensors, nothing checked (``hfx._contract.FlatCall``): what
        ``hfx.generate`` runs per step.

        Two inference requests take turns, so that a step's outputs, fed back as the next
        step's inputs without a copy, are never the memory that step writes its own to.
        A stateful model's flat call is its new session's (``session().flat_call()``).
        """
        if self.state:
            return self.session().flat_call()
        turns = itertools.cycle([self._compiled.create_infer_request() for _ in range(2)])
        return FlatCall(io=self.io, run=lambda values: self._infer(next(turns), values), to_runtime=_to_ov,
                        to_torch=_to_torch)

    def _run(self, flat: list[Any], request: Any = None) -> list[Any]:
        request = self._request() if request is None else request
        # The outputs are the request's memory, which its next run overwrites: _to_torch makes the one copy.
        return [_to_torch(output) for output in self._infer(request, [_to_ov(tensor) for tensor in flat])]

    def _infer(self, request: Any, values: list[Any]) -> list[Any]:
        """Run ``request`` on ``values`` (OpenVINO tensors in ``io.inputs`` order); its output tensors."""
        try:
            for index, position in enumerate(self._fed):
                request.set_input_tensor(index, values[position])
            run_in_this_thread(request)
        except Exception as exc:  # OpenVINO's errors derive from Exception, not RuntimeError
            what = f"OpenVINO failed while running the compiled model: {_gist(exc)}."
            todo = "The inputs passed hfx's checks; please report this with the model and the input shapes."
            model = self.source_class or "model"
            raise LoweringError(describe(f"OvProgram({self.name})", model, self.name, what, todo)) from exc
        return [request.get_output_tensor(index) for index in range(len(self.io.outputs))]


@attrs.frozen(kw_only=True, eq=False)
class OvSession:
    """Calls of an ``OvProgram`` that share one inference request, and with it a stateful model's cache.

    ``program.session()`` makes one. Called like the program (``session(**kwargs)``, checked
    against its ``io``); ``flat_call()`` runs on the same request, so a loop may check its
    first calls and then go on flat with the cache the request holds.
    """

    program: OvProgram
    request: Any = attrs.field(repr=False)

    def __call__(self, **kwargs: Any) -> Any:
        """Run the program on ``kwargs`` (checked against its ``io``) with the session's request."""
        program = self.program
        return call(program.io, functools.partial(program._run, request=self.request), kwargs,  # noqa: SLF001
                    program=f"OvProgram({program.name}) session")

    def flat_call(self) -> FlatCall:
        """``OvProgram.flat_call`` on the session's request (a stateful model's cache stays in it).

        A model without state takes turns between two requests of its own, as the program's does.
        """
        program = self.program
        if not program.state:
            return program.flat_call()
        # Nothing is fed back: a stateful model's cache is state, and its logits are copied before the next run.
        return FlatCall(io=program.io, run=functools.partial(program._infer, self.request),  # noqa: SLF001
                        to_runtime=_to_ov, to_torch=_to_torch)


def run_in_this_thread(request: Any) -> None:
    """Run ``request`` on the inputs set on it, in the calling thread.

    OpenVINO's synchronous ``infer`` runs the request in the calling thread; ``start_async`` + ``wait`` hands it
    to OpenVINO's stream thread and wakes this one when it is done, which on an idle machine cost more than the
    run (the zoo Llama's decode step, 3000 alternated calls: 238 us this way, 419 us that way). It is called on
    the binding's own class: the Python wrapper's ``infer()`` also dispatches inputs and builds a dict of numpy
    copies of the outputs (35 us of a 390 us call).
    """
    from openvino import _pyopenvino

    _pyopenvino.InferRequest.infer(request, {}, True, False)  # no inputs to set, outputs shared, no strings


def _fed_inputs(model: Any, io: IoSpec) -> tuple[int, ...]:
    """The positions in ``io.inputs`` of ``model``'s inputs, by the names ``_name_ports`` gave them."""
    position = {name: index for index, name in enumerate(io.input_names)}
    return tuple(position[port.get_any_name()] for port in model.inputs)


def compile_options(*, stateful: bool, threads: int | None = None, device: str = "CPU") -> dict[str, str]:
    """``COMPILE_OPTIONS`` (``STATEFUL_COMPILE_OPTIONS`` for a stateful model) on ``threads`` threads with the
    latency hint, and the workarounds below where the CPU needs them."""
    options = dict(STATEFUL_COMPILE_OPTIONS if stateful else COMPILE_OPTIONS)
    if threads is not None:
        options |= {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
    if device == "CPU" and not stateful and snippets_miscompute_zeroed_attention():
        # Workaround (OpenVINO 2026.4.1, probed on this CPU): the plugin's snippets compute hfx's zeroed-row
        # attention wrong from a head size of 128 (_openvino_probes). A stateful model's attention runs in the
        # plugin's own cache-fused node (a 128-wide Llama gave eager's tokens), so it keeps its snippets.
        options["SNIPPETS_MODE"] = "DISABLE"
    if onednn_capped_below_vnni():
        # Workaround (OpenVINO 2026.4.1, measured): with ONEDNN_MAX_CPU_ISA capped below VNNI on a VNNI CPU the
        # plugin still picks its int8 dynamic-quantization kernels for compressed weights from the CPU, and the
        # capped oneDNN cannot build them ("FullyConnectedCompressed ... could not create a primitive
        # descriptor"). Off, compressed weights are decompressed to f32. Only runs with that variable set.
        options["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0"
    return options


def _compile(program: OvProgram) -> Any:
    """``program.model`` compiled for ``program.device`` with ``compile_options``."""
    try:
        # Thread count and hint are CPU plugin properties; other devices (GPU, NPU) keep their own.
        threads = program.threads if program.device == "CPU" else None
        options = compile_options(stateful=bool(program.state), threads=threads, device=program.device)
        return _core().compile_model(program.model, program.device, options)
    except Exception as exc:  # OpenVINO's errors derive from Exception, not RuntimeError
        what = f"OpenVINO could not compile the model for device {program.device!r}: {_gist(exc)}."
        todo = f"Available devices: {_core().available_devices}."
        model = program.source_class or "model"
        raise LoweringError(describe("lower_to_ov", model, program.name, what, todo)) from exc


@curry
@per_component
def lower_to_ov(
    exported: Exported | Capture,
    /,
    *,
    device: str = "CPU",
    graph_fixes: tuple[OvGraphFix, ...] = OV_GRAPH_FIXES,
    stateful: bool = False,
    threads: int | None = None,
) -> OvProgram:
    """Convert an exported program to an OpenVINO model and compile it for ``device``.

    The model's inputs and outputs carry the ``IoSpec``'s names, its dynamic
    axes are dynamic in OpenVINO with the export's bounds, and it computes in f32
    (``COMPILE_OPTIONS``) so that it matches eager. The graph's runtime asserts
    are dropped and inputs it writes in place (a static cache) become trailing
    ``updated.*`` outputs that each call copies back (``for_runtime``). Before
    conversion, ``graph_fixes`` rewrite the decomposed graph around the gaps of
    OpenVINO's frontend (``hfx.backends.OV_GRAPH_FIXES``); the program records
    their names in ``graph_fixes``. ``exported`` is not changed: OpenVINO's
    decompositions and the fixes run on a copy, and the OpenVINO constants are
    copies of the weights. Python warnings raised during conversion are kept from
    the caller and attached to the error if conversion fails.

    Args:
        exported: an ``Exported`` or a ``Capture`` (exported first), or ``Components`` of them.
        device: the OpenVINO device to compile for (``"CPU"``, ``"GPU"``, ``"AUTO"`` …).
        graph_fixes: functions ``fix(graph) -> None`` that rewrite the decomposed
            ``torch.fx.Graph`` in place, applied in order: ``OV_GRAPH_FIXES`` extended
            (``(*hfx.backends.OV_GRAPH_FIXES, my_fix)``) or filtered, or your own.
        stateful: keep the KV cache inside OpenVINO (``OvProgram.state``): the model
            takes no ``past_key_values`` and returns none, a ``beam_idx`` input reorders
            the cache, and one graph serves the prompt and every step. For a decode graph
            of ``decompose(multi_token_decode=True)``; the form OpenVINO GenAI runs.
        threads: the threads the compiled model computes on (``INFERENCE_NUM_THREADS``);
            ``None``: ``default_threads()``, the CPUs this process may use.

    Returns:
        An ``OvProgram``, callable like the model.

    Raises:
        ImportError: openvino is not installed (``pip install 'hfx[openvino]'``).
        TypeError: ``exported`` is neither an ``Exported`` nor a ``Capture``, ``device`` is not a
            string, or ``graph_fixes`` is not a tuple of callables.
        LoweringError: OpenVINO could not convert or compile the program.
        ValueError: ``stateful`` for a graph that takes no dynamic ``past_key_values`` cache, or
            ``threads`` is not a positive int.

    Example:
        >>> import torch, hfx
        >>> linear = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> ov = lower_to_ov(linear)
        >>> ov(input=torch.ones(5, 3)).shape
        torch.Size([5, 4])
        >>> seen = []
        >>> ov = lower_to_ov(linear, graph_fixes=(*hfx.backends.OV_GRAPH_FIXES, seen.append))
        >>> len(seen), ov.graph_fixes[-2:]
        (1, ('separate_outputs', 'append'))
    """
    require("openvino", extra="openvino", stage="lower_to_ov")
    if not isinstance(device, str):
        msg = f"lower_to_ov: device must be an OpenVINO device name such as 'CPU', got {device!r}"
        raise TypeError(msg)
    graph_fixes = fixes_option(graph_fixes, stage="lower_to_ov", option="graph_fixes", default="OV_GRAPH_FIXES")
    threads = default_threads() if threads is None else check_threads("lower_to_ov", threads)
    exported = as_exported(exported, stage="lower_to_ov")
    where = f"lower_to_ov(stateful=True) on component {exported.name!r} of {exported.source_class or 'the model'}"
    if stateful:  # the contract first: a graph that cannot keep its cache is refused before the slow conversion
        _stateful_io(exported.io, where=where)
    with _quiet() as caught, lowering_speedups(exported.io):
        try:
            exported = for_runtime(exported)  # asserts dropped; in-place writes (a static cache) become outputs
            model = _convert(exported, graph_fixes)
        except Exception as exc:
            raise _conversion_error(exported, exc, caught) from exc
    io, state = exported.io, ()
    if stateful:  # made stateful before the program is built, so the model is compiled once
        model, io, state = _stateful(model, io, where=where)
    return OvProgram(
        model=model, io=io, name=exported.name, device=device, source_class=exported.source_class,
        graph_fixes=fix_names(graph_fixes), state=state, threads=threads,
    )


def as_stateful(program: OvProgram, /, *, stage: str, name: str | None = None) -> OvProgram:
    """``program`` with its KV cache kept inside OpenVINO (see ``lower_to_ov(stateful=True)``), named ``name``.

    A stateful program keeps its model; either way the result is compiled once.

    Raises:
        ValueError: the program takes no dynamic ``past_key_values`` cache (named with ``stage``).
    """
    name = program.name if name is None else name
    if program.state:
        return program if name == program.name else attrs.evolve(program, name=name)
    where = f"{stage} on component {program.name!r} of {program.source_class or 'the model'}"
    model, io, state = _stateful(program.model, program.io, where=where)
    return attrs.evolve(program, model=model, io=io, state=state, name=name)


def _stateful(model: Any, io: IoSpec, *, where: str) -> tuple[Any, IoSpec, tuple[str, ...]]:
    """The stateful form of ``model`` and ``io`` and the cache inputs it keeps as state; errors say ``where``."""
    kept_io = _stateful_io(io, where=where)
    try:
        kept_model = stateful_model(model)
    except ValueError as exc:
        raise ValueError(_stateful_refusal(where, exc)) from exc
    return kept_model, kept_io, tuple(name for name in io.input_names
                                      if name not in kept_io.input_names and name.startswith(f"{CACHE_INPUT}."))


def _stateful_io(io: IoSpec, *, where: str) -> IoSpec:
    """``stateful_io(io)``, its refusal explained with ``where``."""
    try:
        return stateful_io(io)
    except ValueError as exc:
        raise ValueError(_stateful_refusal(where, exc)) from exc


def _stateful_refusal(where: str, exc: ValueError) -> str:
    return f"{where}: {exc}. Decompose with multi_token_decode=True and lower its decode component."


def _conversion_error(exported: Exported, exc: BaseException, caught: list[warnings.WarningMessage]) -> LoweringError:
    what = f"OpenVINO could not convert the exported program: {_gist(exc)}."
    todo = (
        "If an operation has no conversion rule, rewrite it with a patch (hfx.export(patches=...)) "
        "and lower the new export."
    )
    error = LoweringError(describe("lower_to_ov", exported.source_class or "model", exported.name, what, todo))
    # Deprecations are about torch's and OpenVINO's own code, not the model; other warnings may name the cause.
    relevant = [w for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    for message in dict.fromkeys(str(w.message) for w in relevant):
        error.add_note(f"warning during conversion: {message}")
    return error


@contextlib.contextmanager
def _quiet() -> Iterator[list[warnings.WarningMessage]]:
    """Record the Python warnings torch and OpenVINO raise during conversion instead of showing them.

    ``warnings.catch_warnings`` is process-global while active, like every hfx patch: do not lower in threads.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


@one_at_a_time
def _convert(exported: Exported, graph_fixes: tuple[OvGraphFix, ...]) -> Any:
    """The ``openvino.Model`` of ``exported``, rewritten by ``graph_fixes``, with the IoSpec's names and shapes."""
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    # run_decompositions returns a new program and module() a new GraphModule; exported.program is not touched.
    # Without torch's input-guard call (torch 2.14 adds one that reads every input): OpenVINO drops it and an input
    # only it read, which then counted as read (Qwen2.5-VL's grid_thw); hfx._contract checks the inputs instead.
    module = exported.program.run_decompositions(_decompositions(exported.program)).module(check_guards=False)
    for fix in graph_fixes:
        fix(module.graph)
    module.recompile()
    model = openvino.convert_model(TorchFXPythonDecoder(module, dynamic_shapes=True))
    _own_constants(model)
    inputs = _kept_input_specs(model, exported.io, _placeholders(module))
    _name_ports(model, exported.io, inputs)
    model.reshape({port: _partial_shape(spec, exported.io) for port, spec in zip(model.inputs, inputs)})
    return model


def _placeholders(module: Any) -> list[Any]:
    return [node for node in module.graph.nodes if node.op == "placeholder"]


def _decompositions(program: torch.export.ExportedProgram) -> Any:
    """torch's default decompositions minus the ops OpenVINO converts whole, as ``convert_model`` builds them,
    plus hfx's decompositions of the ops in ``program`` its frontend cannot convert (``scatter_reduce.two``,
    ``cummax`` …, ``hfx.backends._decompositions.openvino_decompositions``).

    ``convert_model(ExportedProgram)`` builds the same table in
    ``TorchFXPythonDecoder.from_exported_program`` (openvino 2026.4), but it logs a
    warning with a traceback through the root logger, which also configures the
    root logger, for each op torch 2.13 no longer decomposes (``upsample_*.vec``).
    """
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose

    from hfx.backends._decompositions import openvino_decompositions

    table = torch.export.default_decompositions()
    for op in ops_to_not_decompose():
        table.pop(op, None)
    targets = {node.target for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes}
    table.update(openvino_decompositions(targets))
    return table


def _own_constants(model: Any) -> None:
    """Replace every constant with a copy that owns its memory.

    The frontend makes constants that share memory with the torch tensors
    (``shared_memory=True``), and the compiled CPU model reads them in place:
    without the copy, training the eager model after lowering changes the
    OpenVINO program's outputs.
    """
    from openvino import op

    for node in model.get_ordered_ops():
        if node.get_type_name() != "Constant":
            continue
        copy = op.Constant(node.get_tensor_view(), shared_memory=False)
        copy.set_friendly_name(node.get_friendly_name())
        for key, value in node.get_rt_info().items():
            copy.set_rt_info(value, key)
        node.output(0).replace(copy.output(0))


def _kept_input_specs(model: Any, io: IoSpec, placeholders: list[Any]) -> list[TensorSpec]:
    """The specs of the inputs the converted ``model`` kept, in its order.

    OpenVINO drops inputs no operation reads, but not always the ones the FX graph leaves unread
    (PP-FormulaNet's unused ``attention_mask`` stayed and its unused ``input_ids`` went): the model's
    inputs are matched by the placeholder names the frontend gives them, or else taken to be the
    graph's read inputs (or every input) in order.
    """
    by_name = {node.name: spec for spec, node in zip(io.inputs, placeholders, strict=True)}
    named = [next((by_name[name] for name in port.get_names() if name in by_name), None) for port in model.inputs]
    if all(spec is not None for spec in named) and len({id(spec) for spec in named}) == len(named):
        return named
    read = [spec for spec, node in zip(io.inputs, placeholders, strict=True) if node.users]
    return read if len(read) == len(model.inputs) else list(io.inputs)


def _name_ports(model: Any, io: IoSpec, inputs: list[TensorSpec]) -> None:
    """Name the model's inputs and outputs after ``io`` (``logits``, not ``linear_14:0``).

    ``inputs``: the specs of the inputs the model kept (OpenVINO drops an input no operation reads).
    """
    if len(model.inputs) != len(inputs) or len(model.outputs) != len(io.outputs):
        msg = (
            f"the converted model has {len(model.inputs)} inputs and {len(model.outputs)} outputs, "
            f"the exported program {len(inputs)} and {len(io.outputs)}"
        )
        raise ValueError(msg)
    for port, spec in zip(model.inputs, inputs):
        port.get_tensor().set_names({spec.name})
    for port, name in zip(model.outputs, io.output_names):  # export names outputs apart from inputs (present.*)
        port.get_tensor().set_names({name})


def _partial_shape(spec: TensorSpec, io: IoSpec) -> Any:
    """``spec``'s shape for OpenVINO: static sizes, and each named dim bounded by ``io.bounds``."""
    import openvino

    dims = []
    for size in spec.shape:
        if isinstance(size, int):
            dims.append(openvino.Dimension(size))
        elif size in io.bounds:
            lower, upper = io.bounds[size]
            dims.append(openvino.Dimension(lower, -1 if upper is None else upper))
        else:
            dims.append(openvino.Dimension())
    return openvino.PartialShape(dims)


# Inputs smaller than this are copied into a tensor of OpenVINO's own rather than wrapped: the copy is cheaper
# (measured on a decode step of the zoo's Llama, three such inputs: 15 us less per step).
_COPIED_BELOW = 16 * 1024


def _to_ov(tensor: Any) -> Any:
    """A contiguous CPU torch tensor as an OpenVINO tensor: on its memory, or a copy if small (numpy cannot hold bf16)."""
    import openvino

    if tensor.dtype != torch.bfloat16:
        array = tensor.numpy()
        return openvino.Tensor(array, shared_memory=array.nbytes >= _COPIED_BELOW)
    return openvino.Tensor(tensor.view(torch.float16).numpy(), list(tensor.shape), openvino.Type.bf16)


def _to_torch(tensor: Any) -> Any:
    """An OpenVINO output tensor as a torch tensor that owns its memory."""
    data = tensor.data
    if data.dtype == np.float16:  # a bf16 tensor's numpy view is float16 too
        import openvino

        if tensor.get_element_type() == openvino.Type.bf16:
            return torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(data))


def _gist(exc: BaseException) -> str:
    """The cause in ``exc``'s message: the frontend's summary of failed ops, else the last line."""
    text = str(exc).strip()
    if "Summary:" in text:
        return "; ".join(line.strip().lstrip("- ") for line in text.split("Summary:")[-1].splitlines() if line.strip())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def save_files(program: OvProgram, directory: Path) -> dict[str, Any]:
    """Write ``openvino_<name>.xml`` and ``.bin`` (f32 weights, no fp16 compression); return the manifest entry."""
    import openvino

    xml = f"openvino_{program.name}.xml"
    openvino.save_model(program.model, directory / xml, compress_to_fp16=False)
    files = [xml, xml.removesuffix(".xml") + ".bin"]
    return {"files": files, "device": program.device, "source_class": program.source_class,
            "graph_fixes": list(program.graph_fixes), "state": list(program.state)}


def load_files(entry: Mapping[str, Any], directory: Path, *, name: str, io: IoSpec,
               threads: int | None = None) -> OvProgram:
    """Read a model written by ``save_files`` and compile it for the device it was saved with, on ``threads``
    (``None``: ``default_threads()``)."""
    require("openvino", extra="openvino", stage="load")
    model = _core().read_model(directory / entry["files"][0])
    program = OvProgram(
        model=model, io=io, name=name, device=entry.get("device", "CPU"), source_class=entry.get("source_class", ""),
        graph_fixes=entry.get("graph_fixes", ()), state=entry.get("state", ()), **given_options(threads=threads),
    )
    # Workaround (OpenVINO 2026.4.1, measured on a SmolLM-135M-shaped decoder): read_model maps the .bin and
    # the CPU plugin keeps the model it compiled, so every weight page it read while repacking the weights
    # into its own memory stays resident (513 MB of a 1.6 GB peak); dropping them keeps the mapping, and
    # generating reads back the few it uses (the embedding rows a prompt looks up), a page each
    # (read_back_page_by_page: 96 MB -> under 1 MB there). A no-op where nothing is mapped.
    for weights in entry["files"][1:]:
        release_copied_pages(directory / weights)
    return program

