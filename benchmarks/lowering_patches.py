"""What one lowering-speed patch of ExecuTorch saves: the same program lowered with and without it, interleaved.

    python benchmarks/lowering_patches.py [--patch patch_decompositions_skipped_when_nothing_decomposes]
                                          [--layers 10] [--repeats 2]

Builds ExecuTorch's LLM-runner program (``decompose(internal_cache_length=256)``) of a Llama of SmolLM-135M's
shape with ``--layers`` layers (random weights, seeded), exports it once, and lowers it ``--repeats`` times
without the patch and with it, alternating, after a warm-up lowering, so that both sides see the same machine.
Prints each lowering's seconds and whether the programs are the same bytes. Timings are noisy on shared cores:
read the spread, not one pair.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patch", default="patch_decompositions_skipped_when_nothing_decomposes",
                        help="the name of one of hfx.backends.PTE_PATCHES")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch
    import transformers
    from toolz import pipe

    import hfx
    from hfx.backends import PTE_PATCHES
    from benchmarks._machine import machine

    names = [patch.__name__ for patch in PTE_PATCHES]
    if args.patch not in names:
        parser.error(f"--patch must name one of hfx.backends.PTE_PATCHES: {names}")
    without = tuple(patch for patch in PTE_PATCHES if patch.__name__ != args.patch)
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=args.layers, num_attention_heads=9, num_key_value_heads=3,
                                      tie_word_embeddings=True, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = {"input_ids": torch.randint(3, config.vocab_size, (1, 16))}
    decode = pipe(model, hfx.capture(prompt), hfx.decompose(internal_cache_length=256), hfx.export)["decode"]
    hfx.lower_to_pte(hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4))))  # warm-up
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores; {info['isa']}; {info['versions']}")
    print(f"{args.layers} layers, patch {args.patch}")
    buffers = {}
    for _ in range(args.repeats):
        for label, patches in (("without", without), ("with", PTE_PATCHES)):
            start = time.perf_counter()
            program = hfx.lower_to_pte(decode, max_sizes={"sequence": 256}, patches=patches)
            print(f"{label:8s} {time.perf_counter() - start:6.1f} s", flush=True)
            buffers[label] = program.buffer
    print("same bytes:", buffers["with"] == buffers["without"])


if __name__ == "__main__":
    main()
