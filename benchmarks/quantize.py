"""Quantized vs fp32 on each runtime, side by side: file size, closeness to eager fp32, latency.

Builds a small Llama from a config (random weights, seeded), exports it once,
lowers it to ExecuTorch, ONNX Runtime and OpenVINO, quantizes it with each
runtime's stage, and measures every form on the same new inputs:

    python benchmarks/quantize.py [--out table.md]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/quantize.py   # torch and oneDNN held to AVX2

The table starts with the machine: the CPU, its ISA flags and how its int8 products accumulate
(``hfx._cpu``), which decides the int8 forms' ``reduce_range`` and so their accuracy.

Random weights give flat logits, so top-1 agreement (and int4 in general) is
lower than on a trained model; cosine similarity is the steadier figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import hfx
from benchmarks._forms import QUANTIZED_FORMS
from benchmarks._machine import machine


def build_model(*, hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    """A Llama with random weights (seed 0) from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                         max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def token_inputs(vocab: int, batch: int, sequence: int, seed: int) -> dict[str, torch.Tensor]:
    """Random token ids and an all-ones mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, sequence), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def file_mb(program: Any) -> float:
    """Size in MB of what ``hfx.save`` writes for ``program``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = hfx.save(Path(tmp) / "p", program)
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6


def latency_ms(run: Callable[[], Any], *, repeats: int) -> float:
    """Median wall time of ``run`` in ms, after two warm-up calls."""
    for _ in range(2):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(name: str, form: str, program: Any, inputs: dict[str, torch.Tensor], reference: torch.Tensor,
            repeats: int) -> dict[str, Any]:
    """One table row: size, cosine and top-1 agreement with eager fp32 logits, latency."""
    logits = program(**inputs).logits
    cosine = torch.nn.functional.cosine_similarity(reference.flatten().double(), logits.flatten().double(), dim=0).item()
    top1 = (reference.argmax(-1) == logits.argmax(-1)).double().mean().item()
    row = {"runtime": name, "form": form, "mb": file_mb(program), "cosine": cosine, "top1": top1,
           "ms": latency_ms(lambda: program(**inputs), repeats=repeats)}
    print(f"{name:12s} {form:12s} {row['mb']:8.2f} MB  cos {cosine:.5f}  top1 {top1:.3f}  {row['ms']:8.2f} ms", flush=True)
    return row


# The tables' runtime names, and each runtime's fp32 program from the one export.
_RUNTIMES = {"pte": "executorch", "onnx": "onnxruntime", "ov": "openvino"}


def forms(exported: hfx.Exported, calibration: list[dict[str, torch.Tensor]]) -> list[tuple[str, str, Callable[[], Any]]]:
    """(runtime, form, build) for fp32 and each quantized form of every runtime (``QUANTIZED_FORMS``)."""
    lower = {"pte": hfx.lower_to_pte, "onnx": hfx.lower_to_onnx, "ov": hfx.lower_to_ov}
    fp32 = {"onnx": lower["onnx"](exported), "ov": lower["ov"](exported)}  # quantized after lowering: lower once
    rows = [("torch.export", "fp32", lambda: exported)]
    for runtime, name in _RUNTIMES.items():
        rows.append((name, "fp32", lambda runtime=runtime: fp32[runtime] if runtime in fp32 else lower[runtime](exported)))
        for form in QUANTIZED_FORMS:
            if form.runtime != runtime:
                continue
            if form.before_lowering:
                rows.append((name, form.label, lambda form=form: lower[form.runtime](form.call(exported, calibration))))
            else:
                rows.append((name, form.label, lambda form=form: form.call(fp32[form.runtime], calibration)))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, each latency also as a ratio to its runtime's fp32."""
    fp32 = {row["runtime"]: row for row in rows if row["form"] == "fp32"}
    lines = ["| runtime | form | file MB | size vs fp32 | cosine vs eager | top-1 agreement | ms / forward | time vs fp32 |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        base = fp32[row["runtime"]]
        lines.append(f"| {row['runtime']} | {row['form']} | {row['mb']:.2f} | {row['mb'] / base['mb']:.2f} | "
                     f"{row['cosine']:.5f} | {row['top1']:.3f} | {row['ms']:.2f} | {row['ms'] / base['ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    model = build_model(hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    exported = hfx.export(hfx.capture(token_inputs(args.vocab, 2, 16, seed=1), model))
    calibration = [token_inputs(args.vocab, 1, length, seed=10 + length) for length in (24, 48, 96, 128)]
    inputs = token_inputs(args.vocab, args.batch, args.sequence, seed=2)
    with torch.no_grad():
        reference = model(**inputs).logits
    rows = [measure(name, form, build(), inputs, reference, args.repeats) for name, form, build in forms(exported, calibration)]
    info = machine()
    text = (f"- machine: {info['cpu']}, {info['cores']} cores; ISA: {info['isa']}\n- int8 products: {info['int8']}\n"
            f"- versions: {info['versions']}\n- command: `{' '.join(sys.argv)}`\n\n{table(rows)}")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
