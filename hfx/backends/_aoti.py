"""The compiled torch runtime: ``lower_to_aoti`` and ``AotiProgram``, an AOTInductor package.

``torch._inductor.aoti_compile_and_package`` compiles an exported program to C++
(Inductor's fused kernels plus calls into ATen for matmuls and attention),
builds it into a shared library, and packs that library with its calling spec
into a ``.pt2`` archive: another format than ``torch.export.save``'s ``.pt2``,
holding compiled code and no graph. The weights stay out of the library
(``aot_inductor.package_constants_in_so=False``): the runner reads the
program's own tensors as user-managed constants, so the weights are held once
(AOTInductor's loader copied every constant out of the library's weight
section into memory it owns, a second copy of the weights). In memory they are
the exported program's tensors; ``hfx.save`` writes them to a ``.safetensors``
file beside the package, and a loaded program reads them mapped from it. The
program keeps the package in a private temporary file, mapped read-only, and
runs it through torch's package loader, which extracts it to a temporary folder
and loads it into the process. The named dims and their bounds of the
``Exported`` carry into the package as its symbolic sizes: one compile serves
every batch and sequence length hfx's call admits.

Loading a package runs its native code, so ``hfx.load`` refuses one unless
``trust=True``, as it refuses a ``.pt2`` with pickled parts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import mmap
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import attrs
from toolz import curry

from hfx._contract import FlatCall, call
from hfx._cpu import isa_flags
from hfx._errors import InputError, LoweringError
from hfx._export.example_inputs import example_kwargs
from hfx._export.updates import for_runtime
from hfx._lift import per_component
from hfx.backends._lowering_speed import lowering_speedups
from hfx._records import Capture, Exported, IoSpec, readonly
from hfx._serial import one_at_a_time
from hfx.backends._aoti_constants import library_constants, opaque_constants, recording_library_constants
from hfx.backends._aoti_fixes import contiguous_inputs, convolves_a_data_dependent_batch, unbacked_sizes_within_int64
from hfx.backends._aoti_one_row import (
    aten_one_row_slowdown,
    check_choice,
    chosen_kernel,
    one_row_matmuls_pass,
    probe_weights,
)
from hfx.backends._common import (
    as_exported,
    captured_output,
    check_threads,
    default_threads,
    first_line,
    lowering_error,
    root_cause,
)

RUNTIME = "aoti"

# The name aoti_compile_and_package gives the one model of its package (data/aotinductor/model/).
_MODEL = "model"
_NATIVE_FOLDER = "data/aotinductor/"
# Package metadata (aot_inductor.metadata) holding the thread count the kernels were generated for, and which
# kernel a matmul of one row runs (hfx.backends._aoti_one_row).
_THREADS_KEY = "hfx.threads"
_ONE_ROW_KEY = "hfx.one_row_matmuls"
# Inductor settings lower_to_aoti makes itself, and what to do instead.
_OWN_SETTINGS = {
    "cpp.threads": "pass threads=n instead",
    "aot_inductor.package": "leave it out: the package is always made",
    "aot_inductor.output_path": "leave it out: hfx.save writes the package where you say",
    "aot_inductor.metadata": "leave it out: it holds the threads the kernels are made for",
    "aot_inductor.package_constants_in_so": "leave it out: the weights are the program's constants, held once",
}
# Logger namespaces whose records a lowering keeps for its error message instead of printing them.
_QUIET_LOGGERS = ("torch",)


@attrs.frozen(kw_only=True, eq=False)
class AotiProgram:
    """An AOTInductor package (compiled native code), its weights, its calling contract and its loaded runner.

    ``package`` is the ``.pt2`` archive ``torch._inductor.aoti_compile_and_package``
    wrote: bytes, or (in the programs hfx makes) a read-only map of an unlinked
    temporary file, so the program outlives the files it was loaded from.
    ``constants`` are the weights by name, which the runner uses as they are
    (user-managed, not copied): the exported program's tensors and any the compile
    made (``max_autotune``'s packed weights, ``hfx.backends._aoti_constants``), or
    tensors mapped from the saved ``.safetensors`` file; empty for a package that
    holds its own weights in its library. Making the record loads the package
    (``torch._inductor.aoti_load_package``'s loader), which runs its native code:
    make one only from a package you trust.
    ``inductor_configs`` are the Inductor settings it was compiled with.

    ``threads`` is read from the package: Inductor generated its kernels for that
    many OpenMP threads (``cpp.threads``), and AOTInductor has no per-program
    thread setting for the ATen kernels it calls (matmuls, attention), which run on
    torch's process-wide intra-op pool. So each call sets that pool to ``threads``
    (``torch.set_num_threads``) and puts the caller's count back after: calls from
    several Python threads at once share the pool. Another count needs another
    compile, ``lower_to_aoti(exported, threads=n)``; it is not a field to ``evolve``.

    ``one_row_matmuls`` is read from the package too: ``"inductor"`` when a matmul of
    a weight by one row (a batch-1 decode step) runs a reduction Inductor generated,
    ``"aten"`` when every matmul calls ATen (``lower_to_aoti``'s option of that name).

    ``cpu_flags`` are the instruction-set extensions its native code may use: Inductor
    builds with ``-march=native``, so those of the CPU that compiled it
    (``hfx._cpu.isa_flags``), or none recorded where ``inductor_configs`` chose the
    architecture (``cpp.march``). ``hfx.load`` refuses a package on a CPU without them,
    where its code would stop the process with an illegal instruction.

    Calling the program checks the keyword arguments against ``io`` (names,
    dtypes, dims, bounds) and returns the model's output structure.
    """

    package: bytes | mmap.mmap = attrs.field(repr=False)
    io: IoSpec
    name: str = "model"
    inductor_configs: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly)
    constants: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly, repr=False)
    cpu_flags: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset, repr=False)
    _runner: Any = attrs.field(init=False, repr=False, default=attrs.Factory(
        lambda self: _loaded(self.package, self.constants), takes_self=True))
    threads: int = attrs.field(init=False, default=attrs.Factory(
        lambda self: int(self._runner.get_metadata().get(_THREADS_KEY, default_threads())), takes_self=True))
    one_row_matmuls: str = attrs.field(init=False, default=attrs.Factory(
        lambda self: self._runner.get_metadata().get(_ONE_ROW_KEY, "aten"), takes_self=True))

    def __call__(self, **kwargs: Any) -> Any:
        """Run the package on ``kwargs`` (checked against ``io``); return the eager model's output structure."""
        return call(self.io, self._run, kwargs, program=f"AotiProgram({self.name})")

    def flat_call(self) -> FlatCall:
        """The compiled model on flat torch tensors, nothing checked (``hfx._contract.FlatCall``): what
        ``hfx.generate`` runs per step."""
        return FlatCall(io=self.io, run=self._run)

    def _run(self, flat: list[Any]) -> list[Any]:
        try:
            with _intra_op_threads(self.threads):
                return self._runner.run(contiguous(flat))
        except Exception as exc:
            msg = f"AotiProgram({self.name}): the compiled package failed: {first_line(exc)}"
            raise LoweringError(msg) from exc


def contiguous(flat: list[Any]) -> list[Any]:
    """``flat`` with each tensor contiguous (a copy where it is not): the compiled code reads its inputs with the
    contiguous strides it was compiled for (``_aoti_fixes.contiguous_inputs``) and does not check them.

    >>> import torch
    >>> rows = torch.arange(12.0).reshape(3, 4)[:, 1:]
    >>> [t.is_contiguous() for t in contiguous([rows, torch.ones(2), 3])[:2]]
    [True, True]
    """
    import torch

    return [t.contiguous() if isinstance(t, torch.Tensor) and not t.is_contiguous() else t for t in flat]


def _loaded(package: bytes | mmap.mmap, constants: Mapping[str, Any]) -> Any:
    """The loader of ``package``'s model, which extracts its shared library and loads it into the process, with
    ``constants`` as its weights (used as they are, not copied; none for a library that holds its own).

    ``aoti_load_package`` would also deserialise any exported programs and extra files the
    archive holds; this loader (the one it uses) reads the compiled model alone.
    """
    import torch

    with tempfile.TemporaryDirectory(prefix="hfx-aoti-") as folder:
        path = Path(folder) / "package.pt2"
        _write(package, path)
        runner = torch._C._aoti.AOTIModelPackageLoader(str(path), _MODEL, False, 1, -1)  # noqa: SLF001
    if constants:
        wanted = runner.get_constant_fqns()
        missing = sorted(set(wanted) - set(constants))
        if missing:
            msg = f"the package's library wants weights the program does not hold: {missing[:5]}"
            raise ValueError(msg)
        # user_managed: the runner reads these tensors, no copy of its own
        runner.load_constants({name: constants[name] for name in wanted}, False, True, True)
    return runner


def held_constants(constants: Mapping[str, Any], read: Mapping[str, bool]) -> dict[str, Any]:
    """``constants`` with an empty tensor of its dtype for each the library declares and never reads (``read``
    False): the original of a weight the C++ GEMM template packed. The runner wants every name, and the program
    then holds and saves the packed copy alone.

    >>> import torch
    >>> held = held_constants({"w": torch.ones(2, 3), "packed": torch.ones(1, 3, 2)}, {"w": False, "packed": True})
    >>> {name: tuple(tensor.shape) for name, tensor in held.items()}
    {'w': (0,), 'packed': (1, 3, 2)}
    """
    import torch

    return {name: tensor if read.get(name, True) else torch.empty(0, dtype=tensor.dtype)
            for name, tensor in constants.items()}


def program_constants(exported: Exported) -> dict[str, Any]:
    """The weights of ``exported``'s program by name (parameters, buffers, lifted constants): its own tensors."""
    program = exported.program
    return {**program.state_dict, **program.constants}


def _write(package: bytes | mmap.mmap, path: Path) -> None:
    """Write ``package`` to ``path``; the pages of a mapped one that this read stay in its file, out of this process."""
    path.write_bytes(package)
    if isinstance(package, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        package.madvise(mmap.MADV_DONTNEED)


def _mapped(write: Callable[[BinaryIO], Any]) -> mmap.mmap:
    """What ``write`` writes to a private, already unlinked temporary file, mapped read-only."""
    with tempfile.TemporaryFile(prefix="hfx-aoti-") as file:
        write(file)
        file.flush()
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


@contextlib.contextmanager
def _intra_op_threads(threads: int) -> Iterator[None]:
    """torch's intra-op pool at ``threads`` while the block runs (process-wide), then the caller's count again."""
    import torch

    before = torch.get_num_threads()
    if before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@curry
@per_component
def lower_to_aoti(
    exported: Exported | Capture,
    /,
    *,
    threads: int | None = None,
    inductor_configs: Mapping[str, Any] | None = None,
    one_row_matmuls: str = "auto",
) -> AotiProgram:
    """Compile ``exported`` with AOTInductor into a native package and load it.

    The graph the other runtimes lower (runtime asserts dropped, in-place writes
    of a static cache returned as outputs) goes through
    ``torch._inductor.aoti_compile_and_package``: C++ code generated for this
    machine's CPU, built with its C++ compiler. That takes tens of seconds per
    graph (20 to 45 s for a one-layer decode step on 2 cores; Inductor's cache
    under ``/tmp/torchinductor_<user>`` makes a repeat faster) and makes calls
    faster than the plain ``Exported``. The ``Exported`` is not changed.

    Args:
        exported: an ``Exported`` (a ``Capture`` is exported first), or ``Components`` of them.
        threads: the threads the kernels are generated for and the program computes on; ``None``:
            ``default_threads()``, the CPUs this process may use.
        inductor_configs: more ``torch._inductor.config`` settings, JSON values
            (``{"max_autotune": True}``); the program records them.
        one_row_matmuls: what a matmul of a weight by one row (a batch-1 decode step) runs:
            ``"inductor"``, a reduction Inductor generates, which reads the weight once at memory
            speed; ``"aten"``, ATen's BLAS call, as every other matmul; ``"auto"``, ``"inductor"``
            where ATen's call is slow on this CPU (measured on the program's weights, ``threads``
            threads, about a second: ``hfx.backends._aoti_one_row``) and ``max_autotune`` is not set.

    Returns:
        An ``AotiProgram`` callable like the model (``Components`` of them for ``Components``).

    Raises:
        ValueError: ``threads`` is not a positive int, ``inductor_configs`` sets what
            ``lower_to_aoti`` sets itself (``cpp.threads``: use ``threads``), or ``one_row_matmuls``
            is not ``"auto"``, ``"inductor"`` or ``"aten"``.
        TypeError: ``exported`` is neither ``Exported`` nor ``Capture``, or ``inductor_configs``
            is not a mapping of setting names to JSON values.
        LoweringError: Inductor or the C++ compiler failed, or the package did not load;
            names the component and model.

    Example:
        >>> import torch, hfx
        >>> linear = hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))
        >>> program = lower_to_aoti(linear, threads=1)  # doctest: +SKIP
        >>> program(input=torch.ones(5, 3)).shape  # doctest: +SKIP
        torch.Size([5, 4])
    """
    threads = default_threads() if threads is None else check_threads("lower_to_aoti", threads)
    configs = check_inductor_configs(inductor_configs)
    choice = check_choice(one_row_matmuls)
    exported = for_runtime(as_exported(exported, stage="lower_to_aoti"))
    own = program_constants(exported)
    kernel = one_row_kernel(choice, own.values(), threads=threads, configs=configs)
    package, record, read = _compiled(exported, threads=threads, configs=configs, one_row=kernel)
    made = library_constants(record, own)
    opaque = opaque_constants(made)
    if opaque:
        what = (f"the compile made constants in oneDNN's opaque layout ({', '.join(opaque[:3])}; `freezing` packs "
                f"fp32 linears that way), which hfx cannot hold beside a package whose weights it keeps.")
        todo = ("Leave `freezing` out of inductor_configs; `max_autotune`'s C++ GEMM template packs weights into "
                "tensors hfx keeps.")
        raise _lowering_error(exported, what, todo)
    try:
        return AotiProgram(package=package, io=exported.io, name=exported.name, inductor_configs=configs,
                           constants=held_constants(own | made, read), cpu_flags=built_for(configs))
    except Exception as exc:
        what = f"the compiled package did not load: {root_cause(exc)}."
        todo = "Lower again (a package loads on the machine that built it) and report it to hfx if it persists."
        raise _lowering_error(exported, what, todo) from exc


def one_row_kernel(choice: str, constants: Iterable[Any], *, threads: int, configs: Mapping[str, Any]) -> str:
    """What a matmul of one row runs, ``"inductor"`` or ``"aten"``: ``choice`` unless ``"auto"``, which measures
    ATen's call on ``constants`` (on ``threads`` threads) and keeps ATen under ``max_autotune`` (whose C++ GEMM
    template packs the weights the reduction would read)."""
    if choice != "auto":
        return choice
    if configs.get("max_autotune"):
        return "aten"
    weights = probe_weights(constants)
    with _intra_op_threads(threads):
        return chosen_kernel(choice, aten_one_row_slowdown(weights) if weights else None)


def built_for(configs: Mapping[str, Any]) -> frozenset[str]:
    """The instruction-set extensions a package compiled here with ``configs`` may use: this CPU's, as Inductor
    builds with ``-march=native``, unless ``cpp.march`` names another architecture (then hfx cannot tell: none)."""
    return isa_flags() if configs.get("cpp.march") in (None, "native") else frozenset()


def check_inductor_configs(configs: Any) -> dict[str, Any]:
    """``configs`` as a dict when it maps setting names to JSON values and leaves hfx's own settings alone."""
    import json

    configs = {} if configs is None else configs
    try:
        plain = dict(json.loads(json.dumps(dict(configs))))
    except (TypeError, ValueError) as exc:
        msg = (f"lower_to_aoti: inductor_configs must map torch._inductor.config setting names to JSON values "
               f"(it is saved in hfx.json), got {configs!r}")
        raise TypeError(msg) from exc
    taken = sorted(set(plain) & set(_OWN_SETTINGS))
    if taken:
        msg = (f"lower_to_aoti: inductor_configs must not set {taken[0]!r}, which lower_to_aoti sets; "
               f"{_OWN_SETTINGS[taken[0]]}")
        raise ValueError(msg)
    return plain


@one_at_a_time
def _compiled(exported: Exported, *, threads: int, configs: Mapping[str, Any],
              one_row: str) -> tuple[mmap.mmap, dict[str, Any], dict[str, bool]]:
    """The package AOTInductor makes of ``exported``'s program, compiled for ``threads`` threads with ``one_row``'s
    kernel for one-row matmuls, the constants its library wants by name (``hfx.backends._aoti_constants``: the
    program's own and any the compile made), and whether its code reads each."""
    import torch

    program = copy.copy(exported.program)  # the example inputs go on a copy; the graph is unlifted, not changed
    log = io.StringIO()
    settings = {**configs, "cpp.threads": threads,
                "aot_inductor.metadata": {_THREADS_KEY: str(threads), _ONE_ROW_KEY: one_row},
                "aot_inductor.package_constants_in_so": False}
    if one_row == "inductor":
        settings["post_grad_custom_post_pass"] = one_row_matmuls_pass()
    if convolves_a_data_dependent_batch(program) and "layout_optimization" not in configs:
        settings["layout_optimization"] = False

    def compile_into(file: BinaryIO) -> None:
        # AOTInductor takes the inputs' structure from example inputs; the sizes come from the graph's symbols.
        program._example_inputs = ((), example_kwargs(exported, exported.io.bounds))  # noqa: SLF001
        torch._inductor.aoti_compile_and_package(program, package_path=file, inductor_configs=settings)  # noqa: SLF001

    record: dict[str, Any] = {}
    read: dict[str, bool] = {}
    try:
        with (lowering_speedups(exported.io), captured_output(log, _QUIET_LOGGERS),
              recording_library_constants(record, read), contiguous_inputs(program),
              unbacked_sizes_within_int64(program)):
            return _mapped(compile_into), record, read
    except Exception as exc:
        what = f"AOTInductor failed: {root_cause(exc)}."
        todo = ("It needs a C++ compiler (g++ or clang++ on PATH, or CXX) and the Python headers; if an operator "
                "has no Inductor lowering, lower to another runtime or report it to PyTorch.")
        raise _lowering_error(exported, what, todo, log.getvalue()) from exc


def _lowering_error(exported: Exported, what: str, todo: str, log: str = "") -> LoweringError:
    return lowering_error("lower_to_aoti", exported, what, todo, log, source="torch._inductor")


def save_files(program: AotiProgram, directory: Path, *, filename: str = "") -> dict[str, Any]:
    """Write the package, ``<name>.pt2``, and its weights, ``<name>.safetensors``, into ``directory``; return the
    manifest entry (``aliases``: weights stored once under another name, as tied embeddings share one tensor)."""
    filename = filename or f"{program.name}.pt2"
    (directory / filename).parent.mkdir(parents=True, exist_ok=True)
    _write(program.package, directory / filename)
    entry = {"files": [filename], "threads": program.threads, "inductor_configs": dict(program.inductor_configs),
             "cpu_flags": sorted(program.cpu_flags)}
    if program.constants:
        import safetensors.torch

        stored, aliases = _stored_once(program.constants)
        weights = filename.removesuffix(".pt2") + ".safetensors"
        safetensors.torch.save_file(stored, str(directory / weights))
        entry |= {"files": [filename, weights], "aliases": aliases}
    return entry


def _stored_once(constants: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``constants`` with each tensor once (contiguous), and the names that alias a stored one: ``{alias: name}``.

    >>> import torch
    >>> weight = torch.ones(2, 3)
    >>> stored, aliases = _stored_once({"embed.weight": weight, "head.weight": weight, "bias": torch.zeros(2)})
    >>> sorted(stored), aliases
    (['bias', 'embed.weight'], {'head.weight': 'embed.weight'})
    """
    stored: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in constants.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        stored[name] = tensor.detach().contiguous()
    return stored, aliases


def _mapped_weights(path: Path, aliases: Mapping[str, str]) -> dict[str, Any]:
    """The tensors of the ``.safetensors`` file at ``path``, mapped from it (not read into memory), with ``aliases``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as weights:
        tensors = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118 - safe_open has no iter
    return tensors | {alias: tensors[name] for alias, name in aliases.items()}


def load_files(entry: Mapping[str, Any], directory: Path, *, name: str, io: IoSpec,
               threads: int | None = None) -> AotiProgram:
    """Load a package written by ``save_files``, running its native code (``hfx.load`` asks for ``trust=True``).

    The program maps a private copy of the package, and its weights from the ``.safetensors`` file (read as
    they are used, held once; a mapping outlives the file's removal, and ``hfx.save`` replaces files rather
    than writing into them). Its kernels were generated for the threads it records: ``threads`` must be
    ``None`` or that number.
    """
    compiled = entry.get("threads")
    if threads is not None and compiled is not None and threads != compiled:
        msg = (f"load: component {name!r} is an AOTInductor package compiled for {compiled} threads, not "
               f"{threads}; load it with threads={compiled} (or None), or compile it again with "
               f"lower_to_aoti(exported, threads={threads})")
        raise InputError(msg)  # an HfxError: hfx.load passes it on as it is, not as an unreadable file
    check_cpu(entry.get("cpu_flags", ()), name=name)
    with (Path(directory) / entry["files"][0]).open("rb") as saved:
        package = _mapped(functools.partial(shutil.copyfileobj, saved))
    files = entry["files"]
    constants = _mapped_weights(Path(directory) / files[1], entry.get("aliases", {})) if len(files) > 1 else {}
    return AotiProgram(package=package, io=io, name=name, inductor_configs=entry.get("inductor_configs", {}),
                       constants=constants, cpu_flags=entry.get("cpu_flags", ()))


def check_cpu(needed: Iterable[str], *, name: str, have: frozenset[str] | None = None) -> None:
    """Refuse (``InputError``) a package whose code may use instruction-set extensions this CPU (or ``have``) lacks,
    before any of its code is loaded; nothing is checked where the CPU's flags cannot be read.

    >>> check_cpu(["avx2", "fma"], name="decode", have=frozenset({"avx2", "fma", "sse2"}))
    >>> check_cpu(["avx2", "avx512f", "avx512bw"], name="decode", have=frozenset({"avx2", "fma"}))
    Traceback (most recent call last):
    ...
    hfx._errors.InputError: load: component 'decode' is an AOTInductor package built for a CPU with avx512bw, avx512f, ...
    """
    have = isa_flags() if have is None else have
    missing = sorted(set(needed) - have)
    if missing and have:
        msg = (f"load: component {name!r} is an AOTInductor package built for a CPU with {', '.join(missing[:8])}, "
               f"which this CPU lacks: its native code would stop the process with an illegal instruction. Lower "
               f"it again on this machine (hfx.lower_to_aoti), build it for a baseline such as x86-64-v3 "
               f"(inductor_configs={{'cpp.march': 'x86-64-v3', 'cpp.simdlen': 256}}), or export to ONNX, "
               f"OpenVINO or ExecuTorch, which run on any CPU")
        raise InputError(msg)


def native_members(entry: Mapping[str, Any], directory: Path) -> list[str]:
    """The members of the component's package that loading it runs or builds as native code (all its model's files)."""
    import zipfile

    with zipfile.ZipFile(Path(directory) / entry["files"][0]) as archive:
        names = [info.filename for info in archive.infolist() if not info.is_dir()]
    native = [name for name in names if _NATIVE_FOLDER in PurePosixPath(name).as_posix()] or names
    return sorted(native, key=lambda name: not name.endswith(".so"))  # the shared libraries first
