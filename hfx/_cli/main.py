"""The ``hfx`` command line: argument parsing and dispatch (``export``, ``inspect``, ``run``, ``zoo``).

Exit codes: 0 success; 1 the command ran and something failed (a check, an
export, a run); 2 it could not run as asked (a bad argument, a missing model,
directory or runtime package).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import IO

from hfx._cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, RUNTIMES, UsageError

_EXAMPLES = """examples:
  hfx export --to onnx --out llama-export          # the built-in tiny Llama, verified and saved
  hfx export t5 --to onnx,ov --generation          # encoder, prefill and decode graphs, tokens checked
  hfx export ./my-model --task text-generation --generation --static-cache 64
  hfx export ./my-llm --for openvino-genai --out llm-packages   # loads in openvino_genai.LLMPipeline as it is
  hfx inspect llama-export
  hfx run llama-export --runtime onnx --input-ids 1,2,3 --max-new-tokens 5
  hfx zoo
"""


def _parser() -> argparse.ArgumentParser:
    from hfx._cli.export import CAPTURE_SHAPE, CHECK_SHAPE, DEFAULT_ATOL, QUANTIZATIONS
    from hfx._cli.load_model import DTYPES, TASKS
    from hfx._cli.package import consumers

    parser = argparse.ArgumentParser(
        prog="hfx", description="Export Hugging Face models to torch.export, ONNX, ExecuTorch and OpenVINO.",
        epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show upstream output and warnings, and full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{export,inspect,run,zoo}")

    export = commands.add_parser("export", parents=[common], help="export a model, verify each runtime against eager, save",
                                 description="Export MODEL once with torch.export, lower it to each runtime, verify every "
                                 f"graph against eager PyTorch on inputs of a new shape (batch {CHECK_SHAPE[0]}, sequence "
                                 f"{CHECK_SHAPE[1]}; captured at batch {CAPTURE_SHAPE[0]}, sequence {CAPTURE_SHAPE[1]}), "
                                 "save, and print a table. Exits 1 when a check fails.")
    export.add_argument("model", nargs="?", default=None,
                        help="a hfx.zoo name (see `hfx zoo`), a save_pretrained directory or a hub id (default: the tiny Llama)")
    export.add_argument("--to", metavar="RUNTIMES",
                        help=f"comma-separated runtimes among {','.join(RUNTIMES)} (default: all, or none with --for)")
    export.add_argument("--for", dest="for_", metavar="CONSUMERS",
                        help=f"write packages the deployment pipelines load as they are, one subdirectory each, among "
                        f"{','.join(consumers())} (comma-separated; a text decoder, float32)")
    export.add_argument("--out", default="hfx-export", metavar="DIR",
                        help="directory to save into, one subdirectory per runtime (default: ./hfx-export)")
    export.add_argument("--task", choices=sorted(TASKS), metavar="TASK",
                        help=f"which Auto class loads MODEL: {', '.join(TASKS)} (default: from its config or zoo entry)")
    export.add_argument("--generation", action="store_true",
                        help="decompose into the graphs generate() runs (encoder, prefill, decode; a full-attention "
                        "text decoder: one decode graph), verify each, and check greedy hfx.generate against eager "
                        "model.generate")
    export.add_argument("--multi-token-decode", action=argparse.BooleanOptionalAction, default=None,
                        help="with --generation: one decode graph that takes 1..N new tokens (no separate prefill); "
                        "--no-multi-token-decode keeps a prefill graph (default: one graph for a full-attention "
                        "text decoder)")
    export.add_argument("--static-cache", type=int, metavar="N",
                        help="with --generation: a static KV cache of N positions; with --for executorch-runner: the "
                        "runner's cache length (default: the model's context, at most 2048)")
    export.add_argument("--opset", type=int, help="ONNX opset (default: 18)")
    export.add_argument("--dtype", choices=list(DTYPES), default="float32", help="load the model in this dtype (default: float32)")
    atols = ", ".join(f"{k} {v:g}" for k, v in DEFAULT_ATOL.items())
    export.add_argument("--atol", type=float, help=f"largest max-abs difference from eager that passes (default by dtype: {atols})")
    export.add_argument("--rtol", type=float, default=1e-4,
                        help="plus rtol x the output's largest eager magnitude (default: 1e-4; 0 for --atol alone)")
    export.add_argument("--quantize", choices=list(QUANTIZATIONS),
                        help="int8: pte 8da8w, onnx dynamic, ov int8; int4: pte 8da4w, onnx int4 (MatMulNBits), ov int4. Compare with a larger --atol")

    inspect = commands.add_parser("inspect", parents=[common], help="show what a saved export holds",
                                  description="Show a saved export's components, runtimes, files and sizes, inputs and "
                                  "outputs with their named dynamic axes and bounds, and the versions it was made with.")
    inspect.add_argument("dir", help="a directory written by `hfx export --out DIR` (or one runtime's subdirectory, or hfx.save)")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of tables")

    run = commands.add_parser("run", parents=[common], help="generate with saved programs",
                              description="Generate with the programs of `hfx export --generation` on one runtime.")
    run.add_argument("dir", help="a directory written by `hfx export --generation --out DIR`")
    run.add_argument("--runtime", choices=list(RUNTIMES), help="which saved runtime to run (default: the first saved)")
    prompt = run.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text, tokenized with the tokenizer saved with the export")
    prompt.add_argument("--input-ids", metavar="IDS", help="comma-separated token ids, e.g. 1,2,3")
    run.add_argument("--max-new-tokens", type=int, default=20, help="how many tokens to generate (default: 20)")
    run.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    run.add_argument("--seed", type=int, help="seed for --do-sample (same seed, same tokens)")
    run.add_argument("--num-beams", type=int, default=1,
                     help="beam search with N beams, run by transformers' generate over the programs (hfx.as_model)")
    run.add_argument("--temperature", type=float, help="divide the logits before sampling")
    run.add_argument("--top-k", type=int, help="sample among the K most likely tokens")
    run.add_argument("--top-p", type=float, help="sample among the most likely tokens whose probabilities add up to P")
    run.add_argument("--repetition-penalty", type=float, help="penalise tokens already in the sequence (1.0: none)")
    run.add_argument("--no-repeat-ngram-size", type=int, help="never repeat an n-gram of this size")
    run.add_argument("--min-new-tokens", type=int, help="generate at least this many tokens before EOS")
    run.add_argument("--trust", action="store_true",
                     help="load a .pt2 that holds pickled parts (hfx never writes them; unpickling can run code) or a "
                          "compiled AOTInductor package (loading runs its native code)")

    commands.add_parser("zoo", parents=[common], help="list the built-in architectures")
    return parser


def _commands() -> dict[str, Callable[[argparse.Namespace, IO[str]], int]]:
    from hfx._cli.export import run_export
    from hfx._cli.inspect import run_inspect
    from hfx._cli.run import run_generate, run_zoo

    return {"export": run_export, "inspect": run_inspect, "run": run_generate, "zoo": run_zoo}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code.

    Args:
        argv: the arguments after ``hfx`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 when a check or an export failed, 2 for a bad argument or a missing model or package.

    Example:
        >>> main(["zoo"])  # doctest: +ELLIPSIS
        name ... generates
        ...
        llama ... AutoModelForCausalLM ... yes
        ...
        0
    """
    from hfx._cli.progress import progress_stream

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the error (or the help)
        return int(exc.code or 0)
    stream = progress_stream()
    try:
        return _commands()[args.command](args, stream)
    except BrokenPipeError:  # `hfx zoo | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the final flush at exit does not fail again
        return EXIT_OK
    except KeyboardInterrupt:
        print(f"\nhfx {args.command}: interrupted.", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001  every failure becomes one paragraph (the traceback with --verbose)
        return _report(exc, args)
    finally:
        if stream is not sys.stderr:
            stream.close()


def _report(exc: Exception, args: argparse.Namespace) -> int:
    """Print ``exc`` as one paragraph (and its traceback with ``--verbose``); return the exit code.

    The paragraph ends with the exception's notes, which ``str(exc)`` leaves out:
    the component and stage a lifted stage failed in, a runtime's advice.
    """
    usage = isinstance(exc, (UsageError, ImportError, FileNotFoundError))
    if args.verbose:
        traceback.print_exc()
    message = str(exc).strip() or type(exc).__name__
    notes = [str(note).strip() for note in getattr(exc, "__notes__", ())]
    if not args.verbose:
        message, notes = message.split("\n")[0], [note.split("\n")[0] for note in notes]
    paragraph = "; ".join([message, *(note for note in notes if note)])
    kind = "" if usage or isinstance(exc, OSError) else f"{type(exc).__name__}: "
    hint = "" if args.verbose or usage else " (run with --verbose for the upstream output and the traceback)"
    print(f"hfx {args.command}: {kind}{paragraph}{hint}", file=sys.stderr)
    return EXIT_USAGE if usage else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
