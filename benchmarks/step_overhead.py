"""hfx's own time per decode step outside the runtime call, on every runtime (issue 13: at most 0.1 ms).

For the zoo's tiny Llama (2 layers, hidden 64: the runtime call itself is short, so hfx's share shows), one decode
step after a ``--past``-token cache, at batch 1, two ways, alternated call by call so that drift hits both alike:

- ``hfx``: the program called as ``hfx.generate`` calls it, ``program(**kwargs)``: hfx checks the inputs against
  the program's ``IoSpec``, flattens the cache, converts to the runtime's form, runs, and rebuilds the model's
  output structure;
- ``runtime``: the runtime's own call on inputs already in its form: ONNX Runtime's ``session.run`` on numpy feeds,
  OpenVINO's ``infer`` on one reused request, ExecuTorch's ``method.execute``, the ExportedProgram's graph module on
  its weights and the flat inputs.

The overhead is the median of ``hfx`` minus the median of ``runtime``. Run it with::

    python benchmarks/step_overhead.py [--runtimes pt2,onnx,ov,pte] [--calls 2000] [--past 16] [--threads 1]

It prints a Markdown table (and ``--out FILE.json`` writes every figure) with the machine, the command and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

RUNTIMES = ("pt2", "onnx", "ov", "pte")


def decode_step(past: int) -> tuple[Any, Any, dict[str, Any]]:
    """``(eager model, its decomposed Exported decode, the keyword arguments of one step after past tokens)``."""
    import torch

    import hfx
    from hfx import zoo
    from hfx._contract import input_keys

    model = zoo.build("llama")
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama", batch=1, sequence=8), model)))
    decode = parts["decode"]
    prompt = zoo.inputs("llama", batch=1, sequence=past)
    with torch.no_grad():
        cache = model(**prompt, use_cache=True).past_key_values
    keys = input_keys(decode.io)
    values = {"input_ids": torch.tensor([[5]]), "attention_mask": torch.ones(1, past + 1, dtype=torch.long),
              "position_ids": torch.tensor([[past]])}
    kwargs = {key: values.get(key, cache) for key in keys}  # the one key left is the cache, under either name
    return model, decode, kwargs


def program_for(runtime: str, decode: Any, threads: int) -> Any:
    import hfx

    lower = {"pt2": lambda e: e, "onnx": lambda e: hfx.lower_to_onnx(e, threads=threads),
             "ov": lambda e: hfx.lower_to_ov(e, threads=threads), "pte": hfx.lower_to_pte}
    return lower[runtime](decode)


def runtime_call(runtime: str, program: Any, flat: list[Any]) -> Any:
    """A zero-argument call of the runtime's own API on ``flat`` (hfx's flat inputs), converted once here."""
    if runtime == "onnx":
        feeds = {spec.name: tensor.numpy() for spec, tensor in zip(program.io.inputs, flat, strict=True)}
        names = list(program.io.output_names)
        return lambda: program._session.run(names, feeds)  # noqa: SLF001
    if runtime == "ov":
        from hfx.backends._openvino import _to_ov

        request = program._compiled.create_infer_request()  # noqa: SLF001
        tensors = [_to_ov(flat[index]) for index in program._fed]  # noqa: SLF001
        return lambda: request.infer(tensors, share_inputs=True, share_outputs=True)
    if runtime == "pte":
        return lambda: program._method.execute(flat)  # noqa: SLF001
    return graph_call(program.program, flat)


def graph_call(program: Any, flat: list[Any]) -> Any:
    """The ExportedProgram's graph module on its weights and ``flat``, in its placeholders' order (no pytree)."""
    import torch
    from torch.export.graph_signature import InputKind

    tensors = {**program.state_dict, **program.constants}
    user = iter(flat)
    args = [next(user) if spec.kind == InputKind.USER_INPUT else tensors[spec.target]
            for spec in program.graph_signature.input_specs]
    module = program.graph_module

    def run_graph() -> Any:
        with torch.no_grad():
            return module(*args)

    return run_graph


def measure(runtime: str, program: Any, kwargs: dict[str, Any], calls: int) -> dict[str, float]:
    """Median ms of ``program(**kwargs)`` and of the runtime's own call, alternated ``calls`` times after a warm-up."""
    from hfx._contract import flat_inputs
    from hfx._pytree import spec_caches

    with spec_caches(program.io):
        flat = flat_inputs(program.io, kwargs, program=runtime)
    raw = runtime_call(runtime, program, flat)
    for _ in range(20):
        program(**kwargs)
        raw()
    hfx_ms, raw_ms = [], []
    for _ in range(calls):
        start = time.perf_counter()
        program(**kwargs)
        middle = time.perf_counter()
        raw()
        end = time.perf_counter()
        hfx_ms.append((middle - start) * 1e3)
        raw_ms.append((end - middle) * 1e3)
    hfx_median, raw_median = statistics.median(hfx_ms), statistics.median(raw_ms)
    return {"hfx_ms": hfx_median, "runtime_ms": raw_median, "overhead_ms": hfx_median - raw_median,
            "inputs": len(flat)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--past", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import torch

    from _machine import machine

    torch.set_num_threads(args.threads)
    _, decode, kwargs = decode_step(args.past)
    rows = {}
    for runtime in args.runtimes.split(","):
        rows[runtime] = measure(runtime, program_for(runtime, decode, args.threads), kwargs, args.calls)
        print(f"{runtime}: {rows[runtime]}", file=sys.stderr)
    info = machine()
    lines = [
        f"- command: `python benchmarks/step_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {info['cpu']}, {info['cores']} cores; ISA: {info['isa']}",
        f"- versions: {info['versions']}",
        f"- model: the zoo's Llama (2 layers, hidden 64), one decode step at batch 1 after {args.past} cached tokens, "
        f"{args.threads} thread(s), medians of {args.calls} alternated calls",
        "",
        "| runtime | flat inputs | hfx call ms | runtime call ms | hfx overhead ms |",
        "|---|---:|---:|---:|---:|",
        *(f"| {name} | {row['inputs']} | {row['hfx_ms']:.3f} | {row['runtime_ms']:.3f} | {row['overhead_ms']:.3f} |"
          for name, row in rows.items()),
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"machine": info, "rows": rows, "args": vars(args) | {"out": str(args.out)}},
                                       indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
