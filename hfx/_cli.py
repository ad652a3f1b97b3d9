"""The ``hfx`` command line: ``hfx export [MODEL] --to pt2,onnx,pte,ov --out DIR``."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

RUNTIMES = ("pt2", "onnx", "pte", "ov")
_EXIT_FAILED_CHECK = 1
_EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfx", description="Export Hugging Face models to torch.export, ONNX, ExecuTorch and OpenVINO.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show upstream warnings and full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", parents=[common], help="export a model, verify each runtime against eager, save")
    export.add_argument("model", nargs="?", default=None, help="hfx.zoo name, save_pretrained directory or hub id (default: the built-in tiny Llama)")
    export.add_argument("--to", default=",".join(RUNTIMES), help=f"comma-separated runtimes among {','.join(RUNTIMES)} (default: all)")
    export.add_argument("--out", default="hfx-export", help="directory to save into, one subdirectory per runtime (default: ./hfx-export)")
    export.add_argument("--atol", type=float, default=1e-4, help="largest max-abs difference from eager that passes (default: 1e-4)")
    commands.add_parser("zoo", parents=[common], help="list the built-in architectures")
    return parser


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """Keep upstream warnings, logs and prints away from the user unless ``--verbose``."""
    if verbose:
        yield
        return
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def _lowering(runtime: str) -> Any:
    import hfx

    if runtime == "pt2":
        return lambda exported: exported
    return getattr(hfx, {"onnx": "lower_to_onnx", "pte": "lower_to_pte", "ov": "lower_to_ov"}[runtime])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _export(args: argparse.Namespace) -> int:
    import hfx
    from hfx._load_model import example_inputs, load_model

    runtimes = [r.strip() for r in args.to.split(",") if r.strip()]
    unknown = sorted(set(runtimes) - set(RUNTIMES))
    if unknown:
        print(f"hfx export: unknown runtime(s) {unknown}; choose among {', '.join(RUNTIMES)}.", file=sys.stderr)
        return _EXIT_ERROR
    out = Path(args.out)
    _say(f"loading {args.model or 'the built-in tiny Llama (random weights)'}")
    with _quiet(args.verbose):
        model, zoo_name = load_model(args.model)
        capture_inputs = example_inputs(model, zoo_name, batch=2, sequence=7)
        check_inputs = example_inputs(model, zoo_name, batch=3, sequence=11)
    _say(f"exporting {type(model).__name__} with torch.export")
    started = time.perf_counter()
    with _quiet(args.verbose):
        exported = hfx.export(hfx.capture(capture_inputs, model))
    export_seconds = time.perf_counter() - started
    rows = []
    for runtime in runtimes:
        _say(f"lowering to {runtime}")
        started = time.perf_counter()
        with _quiet(args.verbose):
            program = _lowering(runtime)(exported)
            seconds = time.perf_counter() - started + (export_seconds if runtime == "pt2" else 0.0)
            report = hfx.verify(program, model, check_inputs, atol=args.atol)
            path = hfx.save(program, out / runtime, overwrite=True)
        rows.append((runtime, report, _size(path), seconds, path))
    _print_table(rows, export_seconds, args.atol)
    return 0 if all(r[1].passed for r in rows) else _EXIT_FAILED_CHECK


def _say(message: str) -> None:
    print(f"hfx: {message} ...", file=sys.stderr, flush=True)


def _print_table(rows: Sequence[tuple[str, Any, int, float, Path]], export_seconds: float, atol: float) -> None:
    print(f"\ntorch.export: {export_seconds:.1f} s; verified on new inputs (batch 3, sequence 11) against eager, atol {atol:g}\n")
    header = f"{'runtime':<8} {'check':<5} {'max abs diff':>12} {'size':>10} {'seconds':>8}  saved to"
    print(header)
    print("-" * len(header))
    for runtime, report, size, seconds, path in rows:
        status = "pass" if report.passed else "FAIL"
        print(f"{runtime:<8} {status:<5} {report.max_abs:>12.2e} {size / 1e6:>8.2f}MB {seconds:>8.1f}  {path}")


def _zoo(args: argparse.Namespace) -> int:
    del args
    from hfx import zoo

    for name, entry in zoo.ENTRIES.items():
        print(f"{name:<12} {entry.family:<10} {entry.auto_class}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 a check failed, 2 an error)."""
    args = _parser().parse_args(argv)
    command = {"export": _export, "zoo": _zoo}[args.command]
    try:
        return command(args)
    except Exception as exc:
        if args.verbose:
            raise
        print(f"hfx {args.command}: {exc}\n(run with --verbose for the full traceback)", file=sys.stderr)
        return _EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
