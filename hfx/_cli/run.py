"""``hfx run DIR``: generate with saved programs; ``hfx zoo``: the built-in architectures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO, Any

from hfx._cli.common import (
    EXIT_OK,
    UsageError,
    quiet_step,
    require_runtimes,
    saved_exports,
    table,
)


def run_generate(args: argparse.Namespace, stream: IO[str]) -> int:
    """Generate from ``--prompt`` or ``--input-ids`` with the programs saved in ``args.dir``; print text or ids."""
    import hfx
    from hfx._capture.decompose import step_component

    runtime, path = _chosen_export(Path(args.dir), args.runtime)
    require_runtimes([runtime])
    programs = quiet_step(stream, args, f"load the {runtime} programs from {path}", lambda: hfx.load(path, trust=args.trust))
    if not isinstance(programs, hfx.Components) or step_component(programs) is None:
        msg = f"{path} holds a single graph, not the generation graphs: export with `hfx export MODEL --generation`."
        raise UsageError(msg)
    tokenizer = getattr(programs.processor, "tokenizer", programs.processor)
    inputs = prompt_inputs(args, tokenizer)
    settings = generation_settings(args)
    if args.num_beams > 1:
        how = f"search {args.num_beams} beams for {args.max_new_tokens} tokens on {runtime} (transformers' generate)"
        tokens = quiet_step(stream, args, how, lambda: _transformers_generate(programs, inputs, args, settings))
    else:
        options = {"max_new_tokens": args.max_new_tokens, "do_sample": args.do_sample, "seed": args.seed}
        tokens = quiet_step(stream, args, f"generate {args.max_new_tokens} tokens on {runtime}",
                            lambda: hfx.generate(inputs, programs, **options, settings=settings))
    if args.prompt is not None:
        print(tokenizer.decode(tokens[0], skip_special_tokens=True))
    else:
        print(",".join(str(int(token)) for token in tokens[0]))
    return EXIT_OK


# CLI option -> the generation setting it sets (given ones only, over the saved generation config).
_SETTINGS = ("temperature", "top_k", "top_p", "repetition_penalty", "no_repeat_ngram_size", "min_new_tokens")


def generation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings given on the command line."""
    return {name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None}


def _transformers_generate(programs: Any, inputs: dict[str, Any], args: argparse.Namespace,
                           settings: dict[str, Any]) -> Any:
    """transformers' own generate over ``programs`` (beam search and everything else it does)."""
    import torch

    import hfx

    if args.seed is not None:
        torch.manual_seed(args.seed)
    with torch.no_grad():
        return hfx.as_model(programs).generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                                               num_beams=args.num_beams, **settings)


def _chosen_export(directory: Path, runtime: str | None) -> tuple[str, Path]:
    """The runtime to run and its directory: ``runtime`` if given, else the first one saved."""
    saved = saved_exports(directory)
    if runtime is None:
        return next(iter(saved.items()))
    if runtime not in saved:
        msg = f"--runtime {runtime}: {directory} holds no {runtime} export; it holds {', '.join(saved)}."
        raise UsageError(msg)
    return runtime, saved[runtime]


def prompt_inputs(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """``input_ids`` and ``attention_mask`` (batch 1) from ``--prompt`` (tokenized) or ``--input-ids``."""
    import torch

    if args.prompt is not None:
        if tokenizer is None:
            msg = "--prompt: no tokenizer was saved with this export (the model had none); pass --input-ids 1,2,3 instead."
            raise UsageError(msg)
        encoded = tokenizer(args.prompt, return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    try:
        ids = [int(token) for token in args.input_ids.split(",") if token.strip()]
    except ValueError as exc:
        raise UsageError(f"--input-ids {args.input_ids!r}: pass comma-separated integers, e.g. 1,2,3.") from exc
    if not ids:
        raise UsageError("--input-ids: pass at least one token id, e.g. 1,2,3.")
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}


def run_zoo(args: argparse.Namespace, stream: IO[str]) -> int:
    """Print the built-in architectures: name, family, the class that builds it, whether it generates."""
    del args, stream
    from hfx import zoo

    rows = [[name, entry.family, entry.auto_class, "yes" if entry.generative else "no"] for name, entry in zoo.ENTRIES.items()]
    print(table(["name", "family", "class", "generates"], rows))
    return EXIT_OK
