"""Decode speed of hfx.generate on each runtime against eager transformers generate(), side by side in one run.

    python benchmarks/decode_speed.py [--model llama] [--tokens 32] [--batch 1] [--runtimes pt2,onnx,pte,ov]

Prints one row per runtime: seconds per new token (median of 3 runs after a warm-up) and the ratio to eager
(below 1.0 is faster than eager). The tokens are checked to be the eager ones.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from toolz import pipe

import hfx
from hfx import zoo

LOWERINGS = {"pt2": lambda parts: parts, "onnx": hfx.lower_to_onnx, "pte": hfx.lower_to_pte, "ov": hfx.lower_to_ov}


def _seconds(run, repeats: int = 3) -> float:
    run()  # warm-up: first-call allocations and kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", type=int, default=16)
    parser.add_argument("--runtimes", default="pt2,onnx,pte,ov")
    args = parser.parse_args()

    model = zoo.build(args.model)
    prompt = zoo.inputs(args.model, batch=args.batch, sequence=args.sequence)
    parts = pipe(model, hfx.capture(zoo.inputs(args.model)), hfx.decompose, hfx.export)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=args.tokens, do_sample=False)

    def eager() -> None:
        with torch.no_grad():
            model.generate(**prompt, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False)

    base = _seconds(eager) / args.tokens
    print(f"{args.model}, batch {args.batch}, prompt {args.sequence}, {args.tokens} new tokens, torch threads {torch.get_num_threads()}")
    print(f"{'runtime':<8} {'ms/token':>9} {'vs eager':>9}  same tokens")
    print(f"{'eager':<8} {base * 1e3:>9.2f} {1.0:>9.2f}  -")
    for runtime in args.runtimes.split(","):
        programs = LOWERINGS[runtime](parts)
        tokens = hfx.generate(prompt, programs, max_new_tokens=args.tokens)
        per_token = _seconds(lambda: hfx.generate(prompt, programs, max_new_tokens=args.tokens, eos_token_id=None)) / args.tokens
        print(f"{runtime:<8} {per_token * 1e3:>9.2f} {per_token / base:>9.2f}  {torch.equal(tokens, expected)}")


if __name__ == "__main__":
    main()
