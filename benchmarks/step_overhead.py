"""hfx's own time per decode step outside the runtime call, on every runtime (issue 13: at most 0.1 ms).

For the zoo's tiny Llama (2 layers, hidden 64: the runtime call itself is short, so hfx's share shows), one decode
step after a ``--past``-token cache, at batch 1, four ways, in two pairs, each alternated call by call so that drift
hits both alike:

- ``public``: the program's own call, ``program(**kwargs)``: hfx checks the inputs against the program's
  ``IoSpec``, flattens the cache, converts to the runtime's form, runs, and rebuilds the model's output structure;
- ``runtime``: the runtime's own call that ``public`` makes, on inputs already in its form: ONNX Runtime's
  ``session.run`` on numpy feeds, OpenVINO's request with each input set, then run in the calling thread,
  ExecuTorch's ``method.execute``, the ExportedProgram's graph module on its weights and the flat inputs;
- ``step``: the step as ``hfx.generate`` runs it once its first steps are checked (``hfx._flat_steps.flat_step`` on
  the program's ``flat_call()``): the step's new tensors converted, the cache carried in the runtime's form from the
  step before, the run, the logits as a torch tensor;
- ``step runtime``: the runtime's own call that ``step`` makes, on the values the step hands it (its new tensors
  converted once, the carried cache): ONNX Runtime's IO binding (each value and output bound, then
  ``run_with_iobinding``, the outputs taken), OpenVINO's call as ``runtime`` makes it but on two requests taking
  turns and its outputs taken, as the step runs it, the same call as ``runtime`` for the others; the logits copied
  out, as the step and ``runtime``'s ``session.run`` copy them.

Each overhead is a median minus its runtime's median: ``public`` - ``runtime`` is the public call's, ``step`` -
``step runtime`` the overhead per step of ``hfx.generate`` (the issue's number). Run it with::

    python benchmarks/step_overhead.py [--runtimes pt2,onnx,ov,pte] [--calls 2000] [--past 16] [--threads 1]

It prints a Markdown table (and ``--out FILE.json`` writes every figure) with the machine, the command and the date.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

RUNTIMES = ("pt2", "onnx", "ov", "pte")


def decode_step(past: int) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """``(eager model, its decomposed Exported decode, the keyword arguments of one step after past tokens, those of
    the step after it)``; the second's cache is the runtime's output of the first, so it is given by the caller."""
    import torch

    import hfx
    from hfx import zoo
    from hfx._contract import input_keys
    from hfx._kept_positions import KEPT_INPUT

    model = zoo.build("llama")
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama", batch=1, sequence=8), model)))
    decode = parts["decode"]
    prompt = zoo.inputs("llama", batch=1, sequence=past)
    with torch.no_grad():
        cache = model(**prompt, use_cache=True).past_key_values
    keys = input_keys(decode.io)

    def step(length: int) -> dict[str, Any]:
        values = {"input_ids": torch.tensor([[5]]), "attention_mask": torch.ones(1, length + 1, dtype=torch.long),
                  "position_ids": torch.tensor([[length]]), KEPT_INPUT: torch.tensor([0])}  # as hfx.generate's step
        return {key: values.get(key, cache) for key in keys}  # the one key left is the cache, under either name

    return model, decode, step(past), step(past + 1)


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
        return _ov_infer(request, [_to_ov(flat[position]) for position in program._fed])  # noqa: SLF001
    if runtime == "pte":
        return lambda: program._method.execute(flat)  # noqa: SLF001
    return graph_call(program.program, flat)


def _ov_infer(request: Any, tensors: list[Any], read: int = 0) -> Any:
    """``request`` run on ``tensors`` (OpenVINO's) as ``OvProgram`` runs it: each set as an input, the request run in
    this thread (``hfx.backends._openvino.run_in_this_thread``), then its first ``read`` output tensors taken and
    the logits among them copied out."""
    import numpy as np

    from hfx.backends._openvino import run_in_this_thread

    def infer() -> list[Any]:
        for index, tensor in enumerate(tensors):
            request.set_input_tensor(index, tensor)
        run_in_this_thread(request)
        outputs = [request.get_output_tensor(index) for index in range(read)]
        if outputs:
            np.array(outputs[0].data)  # the logits read, as the step reads them (the first read costs most)
        return outputs

    return infer


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


def step_call(runtime: str, program: Any, values: list[Any]) -> Any:
    """A zero-argument call of the runtime's own API that ``program.flat_call()`` makes, on the ``values`` a step
    hands it (torch tensors, or the runtime's outputs of the step before), converted once here.

    Each call gives the runtime its inputs, as ``session.run`` takes its feeds: ONNX Runtime's IO binding binds each
    input (a torch tensor by its memory) and each output, unallocated (the run allocates them, which it must for a
    cache that grows), through the C++ binding's own methods; OpenVINO's request sets each input.
    """
    if runtime == "onnx":
        import onnxruntime as ort
        import torch

        from hfx.backends._onnx import _numpy_dtype

        device = ort.OrtDevice.make("cpu", 0)._get_c_device()  # noqa: SLF001
        binding = program._session.io_binding()._iobinding  # noqa: SLF001
        tensors = [(spec.name, value, _numpy_dtype(value), list(value.shape), value.data_ptr())
                   for spec, value in zip(program.io.inputs, values, strict=True) if isinstance(value, torch.Tensor)]
        ortvalues = [(spec.name, value) for spec, value in zip(program.io.inputs, values, strict=True)
                     if not isinstance(value, torch.Tensor)]
        names = program.io.output_names
        session = program._session._sess  # noqa: SLF001

        def run_bound() -> Any:
            for name, _, dtype, shape, pointer in tensors:
                binding.bind_input(name, device, dtype, shape, pointer)
            for name, value in ortvalues:
                binding.bind_ortvalue_input(name, value)
            for name in names:
                binding.bind_output(name, device)
            session.run_with_iobinding(binding, None)
            outputs = binding.get_outputs()
            outputs[0].numpy()  # the logits read, as the step reads them
            return outputs

        return run_bound
    if runtime == "ov":
        # Two requests taking turns, each read back, as the step's flat call runs them.
        fed = [values[position] for position in program._fed]  # noqa: SLF001
        turns = itertools.cycle([_ov_infer(program._compiled.create_infer_request(), fed, read=len(program.io.outputs))  # noqa: SLF001
                                 for _ in range(2)])
        return lambda: next(turns)()
    return runtime_call(runtime, program, values)


def generate_step(program: Any, kwargs: dict[str, Any], flat: list[Any], following: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``(step, values)``: a zero-argument call of one decode step as ``hfx.generate`` runs it flat, on ``following``
    (the step after ``kwargs``), and the values that step hands the runtime.

    The cache it carries is what the runtime returned for ``kwargs``, in the runtime's own form, as in the loop.
    Each call converts the step's new tensors again, as the loop's are new at every step, and runs on the same
    carried cache (the cache it returns is dropped, so that every call is the same step).
    """
    import attrs

    from hfx._flat_steps import _as_input, flat_step, step_plan

    plan = step_plan(program.io)
    first = program.flat_call()  # its own buffers, which no later call overwrites (OpenVINO's requests)
    checked = [first.to_runtime(_as_input(flat[i], plan.dtypes[i])) for i, _ in plan.carried]
    _, carried = flat_step(plan, first, kwargs, checked, {})
    call = program.flat_call()
    seen: list[Any] = []
    flat_step(plan, attrs.evolve(call, run=lambda values: seen.extend(values) or call.run(values)), following, carried, {})
    converted: dict[str, Any] = {}

    def run_step() -> Any:
        converted.clear()
        return flat_step(plan, call, following, carried, converted)

    return run_step, seen


def measure(runtime: str, program: Any, kwargs: dict[str, Any], following: dict[str, Any], calls: int) -> dict[str, float]:
    """Median ms of the public call and its runtime call, alternated ``calls`` times after a warm-up, then of
    generate's step and its runtime call, alternated as well (apart: with public calls in between, every OpenVINO
    call measured slower than in a loop of steps)."""
    from hfx._contract import flat_inputs
    from hfx._pytree import spec_caches

    with spec_caches(program.io):
        flat = flat_inputs(program.io, kwargs, program=runtime)
        step, values = generate_step(program, kwargs, flat, following)
        ms = alternated({"public": lambda: program(**kwargs), "runtime": runtime_call(runtime, program, flat)}, calls)
        ms |= alternated({"step": step, "step_runtime": step_call(runtime, program, values)}, calls)
    return {"public_ms": ms["public"], "runtime_ms": ms["runtime"], "overhead_ms": ms["public"] - ms["runtime"],
            "step_ms": ms["step"], "step_runtime_ms": ms["step_runtime"],
            "step_overhead_ms": ms["step"] - ms["step_runtime"], "inputs": len(flat)}


def alternated(timed: dict[str, Any], calls: int) -> dict[str, float]:
    """Median ms of each zero-argument call in ``timed``, called in turn ``calls`` times after 20 rounds of warm-up."""
    for _ in range(20):
        for run in timed.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(calls):
        for name, run in timed.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


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
    _, decode, kwargs, following = decode_step(args.past)
    rows = {}
    for runtime in args.runtimes.split(","):
        rows[runtime] = measure(runtime, program_for(runtime, decode, args.threads), kwargs, following, args.calls)
        print(f"{runtime}: {rows[runtime]}", file=sys.stderr)
    info = machine()
    lines = [
        f"- command: `python benchmarks/step_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {info['cpu']}, {info['cores']} cores; ISA: {info['isa']}",
        f"- versions: {info['versions']}",
        f"- model: the zoo's Llama (2 layers, hidden 64), one decode step at batch 1 after {args.past} cached tokens "
        f"(generate's step: {args.past + 1}, its cache the runtime's output of the step before), "
        f"{args.threads} thread(s), medians of {args.calls} alternated calls",
        "",
        "| runtime | flat inputs | public call ms | its runtime call ms | public overhead ms "
        "| generate step ms | its runtime call ms | generate step overhead ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {name} | {row['inputs']} | {row['public_ms']:.3f} | {row['runtime_ms']:.3f} | {row['overhead_ms']:.3f} "
          f"| {row['step_ms']:.3f} | {row['step_runtime_ms']:.3f} | {row['step_overhead_ms']:.3f} |"
          for name, row in rows.items()),
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"machine": info, "rows": rows, "args": vars(args) | {"out": str(args.out)}},
                                       indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
