"""``hfx export --for CONSUMERS``: one decompose + export, written as the package each deployment pipeline loads."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import IO, Any

from hfx._cli.common import (
    CAPTURE_SHAPE,
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    eager_tokens,
    quiet_step,
    table,
    token_difference,
)

CHECK_PROMPT = (1, 11)  # batch, sequence of the prompt each package is checked with (the runners take batch 1)
CHECK_TOKENS = 8
#: The cache length of ExecuTorch's runner program without ``--static-cache``: the model's context, at most this.
RUNNER_CACHE_LENGTH = 2048


def consumers() -> tuple[str, ...]:
    """The consumer names ``--for`` takes, in the order hfx writes them."""
    from hfx._package.package import CONSUMERS

    return tuple(CONSUMERS)


def parse_consumers(value: str) -> list[str]:
    """The consumers of ``--for`` in order; ``UsageError`` for an unknown or empty list."""
    chosen = list(dict.fromkeys(c.strip() for c in value.split(",") if c.strip()))
    unknown = [c for c in chosen if c not in consumers()]
    if unknown or not chosen:
        msg = f"--for: unknown consumer(s) {unknown or value!r}; choose among {','.join(consumers())} (comma-separated)."
        raise UsageError(msg)
    return chosen


def check_package_options(args: argparse.Namespace, chosen: list[str], *, with_runtimes: bool) -> None:
    """Raise ``UsageError`` (or ``ImportError`` naming the pip extra) before any work when ``--for`` cannot apply.

    Options that shape ``--to``'s programs apply to those only; without ``--to`` they are an error.
    """
    from hfx._package.package import require_consumer

    options = {"--quantize": args.quantize, "--opset": args.opset,
               "--generation": args.generation or None, "--multi-token-decode": args.multi_token_decode}
    given = [option for option, value in options.items() if value is not None]
    if given and not with_runtimes:
        msg = (f"{', '.join(given)} shape(s) the programs of --to, not the packages of --for (one float32 graph for "
               "prompt and steps): add --to RUNTIMES or drop them.")
        raise UsageError(msg)
    if args.static_cache is not None and not with_runtimes and "executorch-runner" not in chosen:
        raise UsageError("--static-cache with --for sets the cache length of executorch-runner: add it or drop --static-cache.")
    needed = CHECK_PROMPT[1] + CHECK_TOKENS
    if args.static_cache is not None and args.static_cache < needed:
        msg = (f"--static-cache {args.static_cache}: the package check runs a {CHECK_PROMPT[1]}-token prompt plus "
               f"{CHECK_TOKENS} new tokens; pass at least {needed}.")
        raise UsageError(msg)
    for consumer in chosen:
        try:
            require_consumer(consumer)
        except ImportError as exc:
            raise ImportError(f"--for {consumer}: {exc}") from exc


def run_packages(args: argparse.Namespace, loaded: Any, stream: IO[str]) -> int:
    """Write ``loaded`` as each package of ``--for`` under ``--out``; check each with ``hfx.load`` + ``hfx.generate``.

    Returns the exit code: 1 when a package's tokens differ from eager's.
    """
    import hfx
    from hfx._capture.decompose import can_generate
    from hfx._cli.load_model import example_inputs

    chosen = parse_consumers(args.for_)
    if not can_generate(loaded.model):
        msg = f"--for: {type(loaded.model).__name__} does not generate; the deployment pipelines run text decoders."
        raise UsageError(msg)
    tokenizer = _tokenizer(loaded)
    (batch, sequence), (check_batch, check_sequence) = CAPTURE_SHAPE, CHECK_PROMPT
    inputs = example_inputs(loaded, batch=batch, sequence=sequence, generation=True)
    capture = hfx.capture(inputs, loaded.model)
    exports: dict[str, Any] = {}  # decomposition label -> its exported Components, each made once
    prompt = example_inputs(loaded, batch=check_batch, sequence=check_sequence, generation=True)
    rows = []
    for consumer in chosen:
        label, options = _decomposition(consumer, loaded.model, args)
        if label not in exports:
            parts = quiet_step(stream, args, f"capture and decompose generate() into {label}",
                               lambda o=options: hfx.decompose(capture, **o))
            exports[label] = quiet_step(stream, args, "torch.export decode", lambda p=parts: hfx.export(p))
        started = time.perf_counter()
        path = quiet_step(stream, args, f"{consumer}: write the package to {Path(args.out) / consumer}",
                          lambda c=consumer, e=exports[label]: hfx.package(Path(args.out) / c, e, consumer=c,
                                                                           tokenizer=tokenizer, overwrite=True))
        seconds = time.perf_counter() - started
        same, detail = quiet_step(stream, args, f"{consumer}: hfx.load + generate {CHECK_TOKENS} tokens, compare with eager",
                                  lambda p=path: _tokens_check(p, loaded.model, prompt))
        rows.append([consumer, "pass" if same else "FAIL", detail, f"{_size(path) / 1e6:.2f} MB", f"{seconds:.1f}"])
    print(f"\n{type(loaded.model).__name__}: {' and '.join(exports)}, written for {', '.join(chosen)}; "
          f"each package loaded back with hfx.load and its greedy tokens compared with eager's "
          f"(batch {check_batch}, prompt {check_sequence}, {CHECK_TOKENS} new tokens).\n")
    print(table(["package", "check", "tokens", "size", "seconds"], rows))
    print(f"\nwritten to {Path(args.out)}/{{{','.join(chosen)}}}; each loads in its pipeline as it is (docs: Deploy)")
    failed = [row[0] for row in rows if row[1] != "pass"]
    if failed:
        print(f"\n{len(failed)} package(s) generate other tokens than eager: {', '.join(failed)}. Report the model to hfx.")
    return EXIT_FAILED if failed else EXIT_OK


def _decomposition(consumer: str, model: Any, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """What ``consumer``'s pipeline runs, as a label and ``decompose``'s options.

    ExecuTorch's runner keeps the KV cache inside its one graph, of ``--static-cache``
    positions (default: the model's context, at most ``RUNNER_CACHE_LENGTH``); the
    others take one graph for prompt and steps with the cache passed in and out.
    """
    if consumer != "executorch-runner":
        return "one graph for prompt and steps", {"multi_token_decode": True}
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None) or RUNNER_CACHE_LENGTH
    length = args.static_cache if args.static_cache is not None else min(context, RUNNER_CACHE_LENGTH)
    return f"one graph with a {length}-position cache inside", {"internal_cache_length": length}


def _tokenizer(loaded: Any) -> Any:
    """The tokenizer saved with the model; the zoo's tiny BPE for a zoo text model; else a ``UsageError``."""
    from hfx import zoo

    if loaded.processor is not None:
        return loaded.processor
    vocab = getattr(loaded.model.config.get_text_config(), "vocab_size", 0) or 0
    if loaded.zoo_name and vocab >= len(zoo.tokenizer()):
        return zoo.tokenizer()
    msg = (f"--for: {loaded.label} has no tokenizer, and the pipelines tokenize prompts themselves; "
           "pass a save_pretrained directory that holds one.")
    raise UsageError(msg)


def _tokens_check(path: Path, model: Any, prompt: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``hfx.generate`` over the package at ``path`` gives eager's greedy tokens, and how many differ."""
    import hfx

    tokens = hfx.generate(prompt, hfx.load(path), max_new_tokens=CHECK_TOKENS)
    differ = token_difference(tokens, eager_tokens(model, prompt, CHECK_TOKENS))
    return differ is None, differ or "equal"


def _size(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
