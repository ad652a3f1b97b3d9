"""``hfx export``: load a model, export it once, lower it to each runtime, verify against eager, save."""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

import attrs

from hfx._cli.common import (
    CAPTURE_SHAPE,
    EXIT_FAILED,
    EXIT_OK,
    RUNTIMES,
    UsageError,
    component_sizes,
    eager_tokens,
    megabytes,
    quiet_step,
    require_runtimes,
    table,
    token_difference,
)

CHECK_SHAPE = (3, 11)  # another batch and sequence, so that the checks exercise the dynamic shapes
GENERATE_TOKENS = 8

#: ``--atol`` when not given: low-precision dtypes round to ~3 significant digits.
DEFAULT_ATOL = MappingProxyType({"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2})

#: ``--quantize`` -> runtime -> (the hfx stage, its keyword arguments). A runtime not listed has no such scheme.
QUANTIZATIONS = MappingProxyType({
    "int8": MappingProxyType({"pte": ("quantize_pt2e", {"scheme": "8da8w"}), "onnx": ("quantize_onnx", {"mode": "dynamic"}),
                              "ov": ("quantize_ov", {"mode": "int8"})}),
    "int4": MappingProxyType({"pte": ("quantize_pt2e", {"scheme": "8da4w"}), "onnx": ("quantize_onnx", {"mode": "int4"}),
                              "ov": ("quantize_ov", {"mode": "int4"})}),
})


@attrs.frozen(kw_only=True)
class Row:
    """One line of the verification table: a component on a runtime, or the generation check."""

    runtime: str
    component: str
    passed: bool
    difference: str
    size: int | None = None
    seconds: float = 0.0


@attrs.frozen(kw_only=True, eq=False)
class _Subject:
    """What ``export`` works on: the captures, each component's check (module, new inputs) and a check prompt."""

    captures: Any  # Components of Capture
    checks: Mapping[str, tuple[Any, dict[str, Any]]]
    prompt: Mapping[str, Any]


def run_export(args: argparse.Namespace, stream: IO[str]) -> int:
    """Run ``hfx export``; return the exit code (1 when a check failed)."""
    from hfx._cli.package import check_package_options, parse_consumers, run_packages

    chosen = parse_consumers(args.for_) if args.for_ is not None else []
    runtimes = [] if args.to is None and chosen else parse_runtimes(args.to or ",".join(RUNTIMES))
    if runtimes:
        check_options(args, runtimes)
    if chosen:
        check_package_options(args, chosen, with_runtimes=bool(runtimes))
    loaded = quiet_step(stream, args, f"load {args.model or 'the built-in default model'}", lambda: _load(args))
    if not runtimes:
        return run_packages(args, loaded, stream)
    code = _export_to_runtimes(args, runtimes, loaded, stream)
    return max(code, run_packages(args, loaded, stream)) if chosen else code


def _export_to_runtimes(args: argparse.Namespace, runtimes: list[str], loaded: Any, stream: IO[str]) -> int:
    """Export ``loaded`` once, lower, verify and save it on each of ``runtimes``; the exit code."""
    import hfx

    atol = args.atol if args.atol is not None else DEFAULT_ATOL[args.dtype]
    decomposing = " and decompose generate()" if args.generation else ""
    subject = quiet_step(stream, args, f"capture the example inputs{decomposing}", lambda: _subject(loaded, args))
    exported, export_seconds = {}, {}
    for name, capture in subject.captures.items():
        exported[name], export_seconds[name] = _timed(
            lambda c=capture, n=name: quiet_step(stream, args, f"torch.export {n}", lambda: hfx.export(c)))
    rows = []
    for runtime in runtimes:
        lowered = {name: (ex, export_seconds[name]) if runtime == "pt2" else
                   _timed(lambda e=ex, n=name: quiet_step(stream, args, f"{runtime}: lower {n}", lambda: lower(runtime, e, args)))
                   for name, ex in exported.items()}
        programs, seconds = {n: p for n, (p, _) in lowered.items()}, {n: s for n, (_, s) in lowered.items()}
        rows += _runtime_rows(runtime, programs, seconds, subject, loaded, args, atol, stream)
    failed = [f"{r.runtime} {r.component}" for r in rows if not r.passed]
    _print_report(rows, failed, _summary(loaded.model, atol, args), args.out, runtimes)
    return EXIT_FAILED if failed else EXIT_OK


def _print_report(rows: list[Row], failed: list[str], summary: str, out: str, runtimes: list[str]) -> None:
    """The verification table on stdout, between a summary of what was checked and where it was saved."""
    print(summary)
    print(table(["runtime", "component", "check", "max abs diff", "size", "seconds"],
                [[r.runtime, r.component, "pass" if r.passed else "FAIL", r.difference, megabytes(r.size), f"{r.seconds:.1f}"]
                 for r in rows]))
    print(f"\nsaved to {Path(out)}/{{{','.join(runtimes)}}}; inspect with `hfx inspect {out}`")
    if failed:
        print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}. Raise --atol if the difference is expected "
              f"(low precision, quantization), else report the model to hfx.")


def _load(args: argparse.Namespace) -> Any:
    """The model of ``args.model``; a model that cannot be found is a usage error (exit 2)."""
    from hfx._cli.load_model import load_model

    try:
        return load_model(args.model, task=args.task, dtype=args.dtype)
    except OSError as exc:
        raise UsageError(str(exc)) from exc


def parse_runtimes(value: str) -> list[str]:
    """The runtimes of ``--to`` in order; ``UsageError`` for an unknown or empty list."""
    runtimes = list(dict.fromkeys(r.strip() for r in value.split(",") if r.strip()))
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown or not runtimes:
        msg = f"--to: unknown runtime(s) {unknown or value!r}; choose among {','.join(RUNTIMES)} (comma-separated)."
        raise UsageError(msg)
    return runtimes


def check_options(args: argparse.Namespace, runtimes: list[str]) -> None:
    """Raise ``UsageError`` (or ``ImportError`` naming the pip extra) before any work when options cannot apply."""
    require_runtimes(runtimes)
    if (args.multi_token_decode is not None or args.static_cache is not None) and not args.generation:
        raise UsageError("--multi-token-decode and --static-cache shape the generation graphs: add --generation.")
    needed = CHECK_SHAPE[1] + GENERATE_TOKENS
    if args.static_cache is not None and args.static_cache < needed:
        msg = f"--static-cache {args.static_cache}: the checks run a {CHECK_SHAPE[1]}-token prompt plus {GENERATE_TOKENS} new tokens; pass at least {needed}."
        raise UsageError(msg)
    if args.opset is not None:
        _check_opset(args.opset, runtimes)
    if args.quantize is not None:
        for runtime in runtimes:
            quantizer(args.quantize, runtime)


def _check_opset(opset: int, runtimes: list[str]) -> None:
    if "onnx" not in runtimes:
        raise UsageError(f"--opset {opset} applies to ONNX only: add onnx to --to or drop --opset.")
    from hfx.backends._onnx import check_opset as check

    try:
        check(opset)
    except ValueError as exc:
        raise UsageError(f"--opset: {str(exc).split(': ', 1)[-1]}.") from exc


def quantizer(scheme: str, runtime: str) -> Callable[[Any], Any]:
    """The hfx quantization stage that ``--quantize scheme`` means on ``runtime``, with its options bound.

    Raises:
        UsageError: ``runtime`` has no such scheme, or this build of hfx has no quantization stage for it.
    """
    import hfx

    per_runtime = QUANTIZATIONS[scheme]
    if runtime not in per_runtime:
        where = ", ".join(per_runtime)
        msg = f"--quantize {scheme} is not available for {runtime}: it exists for {where}. Drop {runtime} from --to or pick another scheme."
        raise UsageError(msg)
    name, options = per_runtime[runtime]
    stage = getattr(hfx, name, None)
    if stage is None:
        msg = f"--quantize {scheme} needs hfx.{name}, which is not available in this build of hfx; export without --quantize."
        raise UsageError(msg)
    return lambda subject: stage(subject, **options)


def lower(runtime: str, exported: Any, args: argparse.Namespace) -> Any:
    """``exported`` on ``runtime``: quantized before (ExecuTorch, PT2E) or after (ONNX, OpenVINO) lowering."""
    import hfx

    if runtime == "pt2":
        return exported
    quantize = quantizer(args.quantize, runtime) if args.quantize else None
    if runtime == "pte":
        return hfx.lower_to_pte(quantize(exported) if quantize else exported)
    if runtime == "onnx":
        program = hfx.lower_to_onnx(exported, **({"opset": args.opset} if args.opset is not None else {}))
    else:
        program = hfx.lower_to_ov(exported)
    return quantize(program) if quantize else program


def _runtime_rows(runtime: str, programs: dict[str, Any], seconds: dict[str, float], subject: _Subject, loaded: Any,
                  args: argparse.Namespace, atol: float, stream: IO[str]) -> list[Row]:
    """Verify each component on ``runtime``, save them, and (with ``--generation``) check generated tokens."""
    import hfx
    from hfx._records import Components

    reports = {name: quiet_step(stream, args, f"{runtime}: verify {name}",
                           lambda p=program, n=name: hfx.verify(*subject.checks[n], p, atol=atol, rtol=args.rtol))
               for name, program in programs.items()}
    bundle = Components(items=programs, meta=subject.captures.meta) if args.generation else programs["model"]
    path = quiet_step(stream, args, f"{runtime}: save to {Path(args.out) / runtime}",
                 lambda: hfx.save(Path(args.out) / runtime, bundle, overwrite=True, processor=loaded.processor))
    sizes = component_sizes(path)
    rows = [Row(runtime=runtime, component=name, passed=report.passed, difference=f"{report.max_abs:.2e}",
                size=sizes.get(name), seconds=seconds[name]) for name, report in reports.items()]
    if args.generation:
        rows.append(quiet_step(stream, args, f"{runtime}: generate {GENERATE_TOKENS} tokens, compare with eager",
                          lambda: _token_row(runtime, bundle, loaded.model, subject.prompt, args)))
    return rows


def _token_row(runtime: str, programs: Any, model: Any, prompt: Mapping[str, Any], args: argparse.Namespace) -> Row:
    """Greedy ``hfx.generate`` on the exported programs against eager ``model.generate`` on the same prompt."""
    import hfx

    started = time.perf_counter()
    tokens = hfx.generate(prompt, programs, max_new_tokens=GENERATE_TOKENS)
    seconds = time.perf_counter() - started
    differ = token_difference(tokens, eager_tokens(model, prompt, GENERATE_TOKENS, _generation_config(model, args)))
    return Row(runtime=runtime, component="generate", passed=differ is None, difference=differ or "tokens equal",
               seconds=seconds)


def _subject(loaded: Any, args: argparse.Namespace) -> _Subject:
    """The captures to export and, per component, the module and new-shape inputs to check it with."""
    import hfx
    from hfx._capture.decompose import can_generate
    from hfx._cli.load_model import example_inputs
    from hfx._records import Components

    model = loaded.model
    (batch, sequence), (check_batch, check_sequence) = CAPTURE_SHAPE, CHECK_SHAPE
    inputs = example_inputs(loaded, batch=batch, sequence=sequence, generation=args.generation)
    new = example_inputs(loaded, batch=check_batch, sequence=check_sequence, generation=args.generation)
    if not args.generation:
        return _Subject(captures=Components(items={"model": hfx.capture(inputs, model)}), checks={"model": (model, new)},
                        prompt={})
    if not can_generate(model):
        msg = f"--generation: {type(model).__name__} does not generate (no language-model head); export it without --generation."
        raise UsageError(msg)
    decompose = hfx.decompose(multi_token_decode=args.multi_token_decode, generation_config=_generation_config(model, args))
    at_new_shape = decompose(hfx.capture(new, model))
    checks = {name: (capture.module, dict(capture.kwargs)) for name, capture in at_new_shape.items()}
    return _Subject(captures=decompose(hfx.capture(inputs, model)), checks=checks, prompt=new)


def _generation_config(model: Any, args: argparse.Namespace) -> Any:
    """The model's generation config with a static cache of ``--static-cache`` slots, or ``None``."""
    if args.static_cache is None:
        return None
    config = copy.deepcopy(model.generation_config)
    config.cache_implementation = "static"
    config.max_cache_len = args.static_cache
    return config


def _summary(model: Any, atol: float, args: argparse.Namespace) -> str:
    batch, sequence = CHECK_SHAPE
    quantized = f", quantized {args.quantize}" if args.quantize else ""
    return (f"\n{type(model).__name__} ({args.dtype}{quantized}) checked against eager on new inputs "
            f"(batch {batch}, sequence {sequence}), atol {atol:g} + rtol {args.rtol:g} x |eager|. seconds: torch.export for pt2, lowering for the others.\n")


def _timed(work: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    return work(), time.perf_counter() - started
