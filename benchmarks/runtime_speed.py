"""Speed of every runtime at a shipped size: export stages, prefill, decode, memory and disk, side by side in one run.

    python benchmarks/runtime_speed.py [--shape smollm-135m|qwen2.5-0.5b|tiny] [--layers N] [--threads 1]
                                       [--contenders eager,hfx-onnx,...] [--out results/runtime_speed]

A Llama (or Qwen2) with random weights (seed 0) is built from the shape's config and saved once with
``save_pretrained`` (with a tokenizer, which ONNX Runtime GenAI's builder needs), so every contender
loads the same weights. Each contender then runs in two fresh processes of this script: ``build`` makes
its files from the checkpoint (hfx: capture, decompose, export, quantize, lower, save, each timed) and
``run`` opens them and generates greedily: batch 1 with a 128-token prompt and batch 4 left-padded, 32
new tokens each. Prefill is the time to the first token; decode ms/token is (time for 32 tokens - time
for 1) / 31, medians of ``--repeats`` runs after a warm-up. Peak RSS is each process's own high-water
mark (``peak_rss_mb``), of the build and of the run. Every process uses ``--threads`` threads, set through each runtime's own option
(``pin_threads``). The floor is the checkpoint's weight bytes over the read bandwidth measured in the
same run (the best of a fresh process before and after the contenders), the time a decode step takes
to read every weight once.

Writes ``<out>.json`` (every figure) and ``<out>.md`` (the table with the machine, command and date,
ratios against eager and against ONNX Runtime GenAI) after each contender, and prints the table. A new
contender is one line: an fp32 variant in ``FP32_VARIANTS``, a quantized form in ``benchmarks/_forms.py``
(shared with ``benchmarks/quantize.py``), another runtime in ``contenders``.

The tiny shape (``--shape tiny``, the zoo's Llama) shows hfx's own per-step overhead, where the runtime's
work per token is small.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import resource
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._child import run_json
from benchmarks._forms import QUANTIZED_FORMS, Form
from benchmarks._machine import machine

# Config keyword arguments of each shape; "tiny" is the zoo's Llama (hfx.zoo), where hfx's own per-step overhead shows.
SHAPES: Mapping[str, dict[str, Any]] = {
    "smollm-135m": {
        "architecture": "LlamaForCausalLM", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "tie_word_embeddings": True, "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    },
    "qwen2.5-0.5b": {
        "architecture": "Qwen2ForCausalLM", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    },
    "tiny": {"architecture": "LlamaForCausalLM", "zoo": "llama"},
}
PAD, EOS, BOS = 2, 2, 1  # the zoo tokenizer's </s> and <s>; prompts draw ids >= 3, so padding is never a token
CAPTURE_BATCH, CAPTURE_SEQUENCE = 2, 16


# --- prompts and measurement: pure helpers ---------------------------------------------------------------


def prompts(vocab: int, *, prompt: int, batches: tuple[int, ...] = (1, 4)) -> dict[str, dict[str, list[list[int]]]]:
    """Seeded prompts per batch size: batch 1 full length, larger batches left-padded to 1, 7/8, 6/8 ... of it.

    >>> p = prompts(100, prompt=8)["4"]
    >>> [sum(row) for row in p["attention_mask"]], p["input_ids"][3][:2]
    ([8, 7, 6, 5], [2, 2])
    """
    import random

    rng = random.Random(0)
    out = {}
    for batch in batches:
        lengths = [max(1, prompt - (prompt * row) // 8) for row in range(batch)]
        ids = [[PAD] * (prompt - n) + [rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
        mask = [[0] * (prompt - n) + [1] * n for n in lengths]
        out[str(batch)] = {"input_ids": ids, "attention_mask": mask}
    return out


def timings(generate: Callable[[int], Any], *, tokens: int, repeats: int) -> dict[str, Any]:
    """Prefill ms (1 new token) and decode ms/token ((``tokens`` - 1) more), medians after a warm-up; the tokens.

    >>> sorted(timings(lambda n: [[n]], tokens=4, repeats=1))
    ['decode_ms', 'prefill_ms', 'tokens']
    """
    out = generate(tokens)  # warm-up: first-call allocations, kernel selection, lazy compilation
    first, whole = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        generate(1)
        first.append(time.perf_counter() - start)
        start = time.perf_counter()
        generate(tokens)
        whole.append(time.perf_counter() - start)
    prefill = statistics.median(first)
    decode = (statistics.median(whole) - prefill) / max(1, tokens - 1)
    return {"prefill_ms": prefill * 1e3, "decode_ms": decode * 1e3, "tokens": out}


def timed_stages(value: Any, stages: tuple[tuple[str, Callable[[Any], Any]], ...]) -> tuple[Any, dict[str, float]]:
    """Pipe ``value`` through named stages; the result and each stage's seconds (a repeated name adds up).

    >>> timed_stages(2, (("double", lambda x: 2 * x), ("inc", lambda x: x + 1)))[0]
    5
    """
    seconds: dict[str, float] = {}
    for name, stage in stages:
        start = time.perf_counter()
        value = stage(value)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
    return value, seconds


def peak_rss_mb() -> float:
    """This process's peak resident set in MB: ``VmHWM``, where Linux has it, else ``getrusage``.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` carries the parent's peak across fork and exec (Linux keeps the
    maximum at exec), so every child would report at least the parent's size; ``VmHWM`` is the new image's own.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def reset_peak_rss() -> None:
    """Start this process's ``VmHWM`` again from its current RSS (Linux's ``clear_refs`` 5; a no-op elsewhere)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def status_mb(field: str) -> float | None:
    """One memory figure of ``/proc/self/status`` in MB (``VmRSS``, ``RssFile``, ...), None off Linux."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    line = next((line for line in status.read_text().splitlines() if line.startswith(f"{field}:")), None)
    return None if line is None else int(line.split()[1]) / 1024


def size_mb(path: Path) -> float:
    """Bytes under ``path`` (a file or a directory), in MB."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6


def pin_threads(threads: int, runtimes: tuple[str, ...]) -> dict[str, int]:
    """Give each of ``runtimes`` ``threads`` compute threads through its own option, before any session exists.

    The runtimes' own defaults are set here: torch's intra-op threads, ONNX Runtime's
    ``intra_op_num_threads`` on every ``SessionOptions``, OpenVINO's ``INFERENCE_NUM_THREADS`` on every
    ``Core``, ExecuTorch's threadpool (process-wide). hfx's ONNX and OpenVINO programs set their own
    session's threads (every CPU unless told), so ``open_hfx`` also loads them on ``threads``
    (``hfx.load(threads=)``: set as each loads, so no second session holds a second copy of the weights).
    ONNX Runtime GenAI reads its own from ``genai_config.json`` (``open_genai``). Only the named runtimes
    are imported, so a process's peak RSS holds the libraries it uses. Returns what was set.
    """
    set_to = {}
    if "torch" in runtimes:
        import torch

        torch.set_num_threads(threads)
        set_to["torch"] = torch.get_num_threads()
    if "onnxruntime" in runtimes:
        import onnxruntime

        class SessionOptions(onnxruntime.SessionOptions):
            def __init__(self) -> None:
                super().__init__()
                self.intra_op_num_threads = threads
                self.inter_op_num_threads = 1

        onnxruntime.SessionOptions = SessionOptions
        set_to["onnxruntime"] = threads
    if "openvino" in runtimes:
        import openvino

        class Core(openvino.Core):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.set_property("CPU", {"INFERENCE_NUM_THREADS": threads})

        openvino.Core = Core
        set_to["openvino"] = threads
    if "executorch" in runtimes:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(threads)  # ExecuTorch's only thread setting in Python
        set_to["executorch"] = portable_lib._threadpool_get_thread_count()
    if "openvino_genai" in runtimes:
        import openvino_genai  # noqa: F401 - its threads are LLMPipeline's properties (open_ov_genai); imported for the footprint
    if "onnxruntime_genai" in runtimes:
        import onnxruntime_genai  # noqa: F401 - its threads are set in genai_config.json (open_genai); imported for the footprint
    return set_to


# --- the checkpoint ---------------------------------------------------------------------------------------


def shape_config(shape: str, layers: int | None) -> Any:
    """The transformers config of ``shape``, with ``layers`` layers when given."""
    import transformers

    from hfx import zoo

    kwargs = dict(SHAPES[shape])
    architecture = kwargs.pop("architecture")
    config = zoo.entry(kwargs.pop("zoo")).config() if "zoo" in kwargs else getattr(transformers, architecture).config_class(**kwargs)
    if layers is not None:
        config.num_hidden_layers = layers
    config.update({"architectures": [architecture], "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
                   "dtype": "float32"})
    return config


def write_checkpoint(directory: Path, config: Any) -> dict[str, Any]:
    """Random weights (seed 0) saved with ``save_pretrained``, with a tokenizer; the parameter count and bytes."""
    import torch
    import transformers

    from hfx import zoo

    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config).eval()
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(directory)
    # The builder copies a tokenizer into its output; ids are fed directly, so the tiny zoo vocabulary serves.
    zoo.tokenizer().save_pretrained(directory)
    parameters = {id(p): p for p in model.parameters()}.values()  # tied embeddings once
    return {"parameters": sum(p.numel() for p in parameters),
            "weight_bytes": sum(p.numel() * p.element_size() for p in parameters)}


# --- contenders -------------------------------------------------------------------------------------------

Generate = Callable[[dict[str, list[list[int]]], int], list[list[int]]]  # (prompt, new tokens) -> new token rows


@attrs.frozen(kw_only=True)
class Contender:
    """One row of the table: how to make its files from the checkpoint, and how to generate with them."""

    name: str
    runtimes: tuple[str, ...]  # whose threads ``pin_threads`` sets (and imports)
    build: Callable[[Path, Path], dict[str, float]] | None  # (checkpoint, out) -> seconds per stage; None: none
    open: Callable[[Path, Path], Generate]  # (checkpoint, out) -> generate
    batches: tuple[str, ...] | None = None  # the prompt sets it runs (None: all); the LLM runner's program takes batch 1


def _tensors(prompt: dict[str, list[list[int]]]) -> dict[str, Any]:
    import torch

    return {key: torch.tensor(value) for key, value in prompt.items()}


def _new_rows(ids: Any, prompt: dict[str, list[list[int]]], tokens: int) -> list[list[int]]:
    """The new tokens of each row of ``ids`` (prompt + new), checked to be ``tokens`` long."""
    start = len(prompt["input_ids"][0])
    rows = [row[start:] for row in ids.tolist()]
    if any(len(row) != tokens for row in rows):
        msg = f"asked for {tokens} new tokens, got {[len(row) for row in rows]}"
        raise RuntimeError(msg)
    return rows


def open_eager(checkpoint: Path, out: Path) -> Generate:
    """Transformers' own ``generate`` on the checkpoint (SDPA attention)."""
    import transformers

    del out
    return _transformers_generate(transformers.AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa").eval())


def open_as_model(checkpoint: Path, out: Path, *, threads: int) -> Generate:
    """Transformers' own ``generate`` over the saved programs: ``hfx.as_model(hfx.load(out))`` (no torch weights)."""
    import hfx

    del checkpoint
    return _transformers_generate(hfx.as_model(hfx.load(out, trust=True, threads=threads)))


def _transformers_generate(model: Any) -> Generate:
    """Greedy ``model.generate`` with no end token (as ``hfx.generate(eos_token_id=None)``)."""
    import torch

    # No end token: min_new_tokens would suppress it and change the argmax.
    model.generation_config.eos_token_id = None

    def generate(prompt: dict[str, list[list[int]]], tokens: int) -> list[list[int]]:
        with torch.no_grad():
            ids = model.generate(**_tensors(prompt), max_new_tokens=tokens, do_sample=False)
        return _new_rows(ids, prompt, tokens)

    return generate


Step = tuple[str, Callable[..., Any]]  # (stage name in the table, ``f(value, *, model) -> value``)


def build_hfx(checkpoint: Path, out: Path, *, steps: tuple[Step, ...], decomposition: Mapping[str, Any],
              consumer: str | None = None) -> dict[str, float]:
    """hfx as a user runs it: capture, decompose, export, then ``steps`` (quantize, lower), then save (or
    ``hfx.package`` for ``consumer``, with the checkpoint's tokenizer)."""
    import torch
    import transformers

    import hfx

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (CAPTURE_BATCH, CAPTURE_SEQUENCE), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    stages = (
        ("capture", hfx.capture(inputs)),
        ("decompose", hfx.decompose(**decomposition)),
        ("export", hfx.export),
        *((name, functools.partial(step, model=model)) for name, step in steps),
        ("save", hfx.save(out)) if consumer is None else
        ("package", functools.partial(hfx.package, out, consumer=consumer,
                                      tokenizer=transformers.AutoTokenizer.from_pretrained(checkpoint))),
    )
    _, seconds = timed_stages(model, stages)
    return seconds


def open_hfx(checkpoint: Path, out: Path, *, threads: int) -> Generate:
    """``hfx.load`` of the saved programs on ``threads`` threads, run by ``hfx.generate``."""
    import hfx

    programs = hfx.load(out, trust=True, threads=threads)  # trust: a compiled package is this build's own

    def generate(prompt: dict[str, list[list[int]]], tokens: int) -> list[list[int]]:
        ids = hfx.generate(_tensors(prompt), programs, max_new_tokens=tokens, eos_token_id=None)
        return _new_rows(ids, prompt, tokens)

    return generate


def build_genai(checkpoint: Path, out: Path, *, precision: str) -> dict[str, float]:
    """ONNX Runtime GenAI's model builder on the checkpoint, as its command line runs it (in this process)."""
    import runpy

    import onnxruntime_genai.models.builder  # noqa: F401 - imported before the clock, like hfx

    argv = sys.argv
    sys.argv = ["builder", "-i", str(checkpoint), "-o", str(out), "-p", precision, "-e", "cpu",
                "-c", str(out.parent / f"{out.name}-cache")]
    start = time.perf_counter()
    try:
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
    finally:
        sys.argv = argv
    return {"build": time.perf_counter() - start}


def open_genai(checkpoint: Path, out: Path, *, threads: int) -> Generate:
    """``onnxruntime_genai.Model`` on the builder's output, ``threads`` set in its ``genai_config.json``."""
    import numpy as np
    import onnxruntime_genai as og

    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    path.write_text(json.dumps(config, indent=2))
    model = og.Model(str(out))

    def generate(prompt: dict[str, list[list[int]]], tokens: int) -> list[list[int]]:
        ids = np.asarray(prompt["input_ids"], dtype=np.int32)
        params = og.GeneratorParams(model)
        # GenAI's end token must be a vocabulary id; min_length keeps it generating (and suppresses that id).
        params.set_search_options(max_length=ids.shape[1] + tokens, min_length=ids.shape[1] + tokens,
                                  do_sample=False, batch_size=ids.shape[0])
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        for _ in range(tokens):
            generator.generate_next_token()
        return [[int(t) for t in generator.get_sequence(row)[ids.shape[1]:ids.shape[1] + tokens]] for row in range(ids.shape[0])]

    return generate


def open_ov_genai(checkpoint: Path, out: Path, *, threads: int) -> Generate:
    """``openvino_genai.LLMPipeline`` on hfx's OpenVINO GenAI package, on ``threads`` threads, f32 as hfx's own."""
    import numpy as np
    import openvino
    import openvino_genai

    from hfx._package.openvino_genai import EXACT_PROPERTIES

    # GenAI 2026.4 takes the thread count as a string (an int stops the process with SIGFPE).
    pipeline = openvino_genai.LLMPipeline(str(out), "CPU", **EXACT_PROPERTIES, INFERENCE_NUM_THREADS=str(threads),
                                          PERFORMANCE_HINT="LATENCY")

    def generate(prompt: dict[str, list[list[int]]], tokens: int) -> list[list[int]]:
        config = openvino_genai.GenerationConfig()
        # ignore_eos keeps it generating; min_new_tokens would suppress the end token and change the argmax.
        config.max_new_tokens, config.ignore_eos = tokens, True
        ids = np.asarray(prompt["input_ids"], dtype=np.int64)
        mask = np.asarray(prompt["attention_mask"], dtype=np.int64)
        result = pipeline.generate(openvino_genai.TokenizedInputs(openvino.Tensor(ids), openvino.Tensor(mask)), config)
        return [[int(t) for t in row[:tokens]] for row in result.tokens]

    return generate


def read_bandwidth(weight_bytes: int) -> float:
    """Bytes per second that torch's ``sum`` reads from a tensor as large as the weights (at least 256 MB).

    The best of ten reads: on a shared machine the others are slowed by other work, and the floor is a bound.
    """
    import torch

    data = torch.ones(max(weight_bytes, 1 << 28) // 4)
    data.sum()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / min(times)


def _calibration(programs: Any, model: Any) -> Any:
    """Per-component calibration from the model's own ``generate`` on three prompts."""
    import torch

    import hfx

    generator = torch.Generator().manual_seed(2)
    samples = []
    for length in (24, 64, 128):
        ids = torch.randint(3, model.config.vocab_size, (1, length), generator=generator)
        samples.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return hfx.calibration_inputs(model, samples, programs)


LOWERINGS: Mapping[str, str | None] = {"pt2": None, "aoti": "lower_to_aoti", "onnx": "lower_to_onnx",
                                       "pte": "lower_to_pte", "ov": "lower_to_ov"}
_LIBRARY = {"pt2": (), "aoti": (), "onnx": ("onnxruntime",), "pte": ("executorch",), "ov": ("openvino",)}

# The fp32 variants of each runtime: (name suffix, lowering options, decompose options). Everything else is
# the public API's defaults, so what a lowering does by default is what is measured; a variant is one line.
# "-llm" is ExecuTorch's LLM-runner program: the KV cache in the program's buffers, its custom SDPA and
# cache-update kernels (decompose's custom_ops default), batch 1; the cache holds the prompt and the new tokens.
ONE_GRAPH: Mapping[str, Any] = {"multi_token_decode": True}
CPP_GEMM: Mapping[str, Any] = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}
FP32_VARIANTS: Mapping[str, tuple[tuple[str, Mapping[str, Any], Mapping[str, Any]], ...]] = {
    "pt2": (("", {}, {}), ("-1graph", {}, ONE_GRAPH)),
    # the pt2 program compiled by AOTInductor (lower_to_aoti); "-aten": every matmul through ATen's BLAS call, a
    # one-row matmul too (the default measures that call and may take Inductor's reduction for one row);
    # "-cpp-gemm": every matmul through Inductor's C++ GEMM template (its own kernels on weights it packs)
    "aoti": (("", {}, {}), ("-aten", {"one_row_matmuls": "aten"}, {}), ("-cpp-gemm", {"inductor_configs": CPP_GEMM}, {})),
    "onnx": (("", {}, {}), ("-1graph", {}, ONE_GRAPH)),
    "pte": (("", {}, {}), ("-1graph", {}, ONE_GRAPH), ("-llm", {}, {"internal_cache_length": 256})),
    "ov": (("", {}, {}), ("-1graph", {}, ONE_GRAPH), ("-stateful", {"stateful": True}, ONE_GRAPH)),
}
BATCH_ONE = ("1",)


def _lower(function: str, options: Mapping[str, Any], value: Any, *, model: Any) -> Any:
    """``hfx.<function>(value, **options)``, on the build's threads where the lowering takes them.

    A compiled program (``lower_to_aoti``) generates its kernels for its ``threads``, every CPU by default;
    ``pin_threads`` set torch's to ``--threads``.
    """
    import inspect

    import torch

    import hfx

    stage = getattr(hfx, function)
    if "threads" in inspect.signature(stage.func).parameters and "threads" not in options:
        options = {**options, "threads": torch.get_num_threads()}
    return stage(value, **options)


def _quantize(form: Form, value: Any, *, model: Any) -> Any:
    return form.call(value, _calibration(value, model) if form.options.get("calibration") else None)


def hfx_steps(runtime: str, lowering: Mapping[str, Any], form: Form | None = None) -> tuple[Step, ...]:
    """The steps after export: the runtime's lowering with ``lowering`` options, and ``form``'s quantization."""
    function = LOWERINGS[runtime]
    lower = () if function is None else (("lower", functools.partial(_lower, function, lowering)),)
    if form is None:
        return lower
    quantize = (("quantize", functools.partial(_quantize, form)),)
    return (*quantize, *lower) if form.before_lowering else (*lower, *quantize)


def _hfx(name: str, runtime: str, steps: tuple[Step, ...], *, decomposition: Mapping[str, Any]) -> Contender:
    build = functools.partial(build_hfx, steps=steps, decomposition=decomposition)
    batches = BATCH_ONE if "internal_cache_length" in decomposition else None
    return Contender(name=name, runtimes=("torch", *_LIBRARY[runtime]), build=build, open=open_hfx, batches=batches)


def hfx_contenders() -> list[Contender]:
    """Per runtime: its fp32 variants, then each quantized form hfx offers for it (``QUANTIZED_FORMS``)."""
    rows = []
    for runtime, variants in FP32_VARIANTS.items():
        rows += [_hfx(f"hfx-{runtime}{suffix}", runtime, hfx_steps(runtime, options), decomposition=decomposition)
                 for suffix, options, decomposition in variants]
        rows += [_hfx(f"hfx-{runtime}-{form.slug}", runtime, hfx_steps(runtime, {}, form), decomposition={})
                 for form in QUANTIZED_FORMS if form.runtime == runtime]
    # The same programs driven by transformers' generate (hfx.as_model): its memory is the runtime's.
    rows += [attrs.evolve(_hfx(f"hfx-{runtime}-1graph-as-model", runtime, hfx_steps(runtime, {}), decomposition=ONE_GRAPH),
                          open=open_as_model) for runtime in ("onnx", "ov")]
    return rows


def contenders(threads: int) -> dict[str, Contender]:
    """Every contender, by name, in table order: eager, hfx per runtime and form, ONNX Runtime GenAI."""
    genai = functools.partial(open_genai, threads=threads)
    rows = [
        Contender(name="eager", runtimes=("torch",), build=None, open=open_eager),
        *(attrs.evolve(row, open=functools.partial(row.open, threads=threads)) for row in hfx_contenders()),
        # OpenVINO's own LLM pipeline on hfx's stateful model (hfx.package): the runtime's pipeline, same graph.
        Contender(name="ov-genai", runtimes=("torch", "openvino", "openvino_genai"),
                  build=functools.partial(build_hfx, steps=hfx_steps("ov", {"stateful": True}), decomposition=ONE_GRAPH,
                                          consumer="openvino-genai"),
                  open=functools.partial(open_ov_genai, threads=threads)),
        Contender(name="ort-genai", runtimes=("onnxruntime_genai",), build=functools.partial(build_genai, precision="fp32"),
                  open=genai),
        Contender(name="ort-genai-int4", runtimes=("onnxruntime_genai",),
                  build=functools.partial(build_genai, precision="int4"), open=genai),
    ]
    return {row.name: row for row in rows}


# --- the child processes ----------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One contender's ``build`` or ``run`` in this fresh process; what it measured."""
    import warnings

    warnings.filterwarnings("ignore")
    checkpoint, out = Path(args.checkpoint), Path(args.files)
    if args.child == "floor":
        threads = pin_threads(args.threads, ("torch",))
        return {"bandwidth": read_bandwidth(args.weight_bytes), "threads": threads, "peak_rss_mb": peak_rss_mb()}
    row = contenders(args.threads)[args.contender]
    # The builds all read the checkpoint with torch (ONNX Runtime GenAI's builder too), so torch is pinned there.
    threads = pin_threads(args.threads, ("torch", *row.runtimes) if args.child == "build" else row.runtimes)
    if args.child == "build":
        seconds = row.build(checkpoint, out)
        return {"stages": seconds, "threads": threads, "peak_rss_mb": peak_rss_mb(), "size_mb": size_mb(out)}
    # The libraries are imported (pin_threads) and nothing is loaded: the runtime's own footprint.
    footprint = status_mb("VmRSS")
    generate = row.open(checkpoint, out)
    load_peak = peak_rss_mb()
    reset_peak_rss()  # from here the peak is the generation's (the load's is load_peak)
    prompt_sets = json.loads(Path(args.prompts).read_text())
    runs = {}
    for batch, prompt in prompt_sets.items():  # batch 1 first, so its peak is its own
        if row.batches is None or batch in row.batches:
            runs[batch] = {**timings(functools.partial(generate, prompt), tokens=args.tokens, repeats=args.repeats),
                           "peak_rss_mb": peak_rss_mb()}
    return {"runs": runs, "threads": threads, "peak_rss_mb": max(load_peak, peak_rss_mb()), "footprint_mb": footprint,
            "load_peak_rss_mb": load_peak, "file_rss_mb": status_mb("RssFile")}


# --- the report -------------------------------------------------------------------------------------------


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


STAGES = ("capture", "decompose", "export", "quantize", "lower", "save", "build")  # the table's column order


def _figure(rows: Mapping[str, Any], batch: str, name: str, key: str) -> float | None:
    return rows.get(name, {}).get("runs", {}).get(batch, {}).get(key)


def _export_seconds(row: Mapping[str, Any]) -> float | None:
    """A built contender's export time, every stage summed."""
    return sum(row["stages"].values()) if row.get("stages") else None


def _over_weights(peak: float | None, footprint: float | None, weights_mb: float) -> float | None:
    """The issue's memory measure: ``(peak - footprint) / weights``."""
    return None if peak is None or footprint is None or not weights_mb else (peak - footprint) / weights_mb


def table(results: Mapping[str, Any]) -> str:
    """The results as markdown: per contender the export stages, and per batch prefill, decode, RSS, size, tokens."""
    rows = results["contenders"]
    batches = list(results["prompts"])
    lines = []
    for batch in batches:
        figure = functools.partial(_figure, rows, batch)
        eager_decode, genai_decode = figure("eager", "decode_ms"), figure("ort-genai", "decode_ms")
        eager_prefill, genai_prefill = figure("eager", "prefill_ms"), figure("ort-genai", "prefill_ms")
        padded = ", left-padded" if batch != "1" else ""
        lines += [f"\nBatch {batch} ({results['prompt']}-token prompt{padded}, {results['tokens']} greedy new tokens):\n",
                  ("| contender | export s | prefill ms | vs eager | vs genai | decode ms/token | vs eager | vs genai "
                   "| peak RSS MB | size MB | eager's tokens |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        floor = results.get("floor", {}).get("decode_ms")
        lines.append(f"| floor (weight bytes / read bandwidth) | - | - | - | - | {_cell(floor, 2)} | "
                     f"{_ratio(floor, eager_decode)} | {_ratio(floor, genai_decode)} | - | - | - |")
        for name, row in rows.items():
            if "error" in row:
                lines.append(f"| {name} | {row['error'][:120]} |")
                continue
            prefill, decode = figure(name, "prefill_ms"), figure(name, "decode_ms")
            same = row.get("same_tokens", {}).get(batch)
            export = _export_seconds(row)
            lines.append(
                f"| {name} | {_cell(export)} | {_cell(prefill)} | {_ratio(prefill, eager_prefill)} | "
                f"{_ratio(prefill, genai_prefill)} | {_cell(decode, 2)} | {_ratio(decode, eager_decode)} | "
                f"{_ratio(decode, genai_decode)} | {_cell(figure(name, 'peak_rss_mb') or row.get('peak_rss_mb'), 0)} | "
                f"{_cell(row.get('size_mb'), 0)} | "
                f"{'-' if same is None else 'yes' if same else 'no'} |")
    lines += memory_table(results)
    if any(name in rows for name in FAST_PATHS):
        lines += goals_table(results)
    seen = dict.fromkeys(stage for row in rows.values() for stage in row.get("stages") or {})
    stage_names = sorted(seen, key=lambda stage: STAGES.index(stage) if stage in STAGES else len(STAGES))
    lines += ["\nExport seconds per stage, and the peak RSS of the export process:\n",
              f"| contender | {' | '.join(stage_names)} | total | export peak RSS MB |",
              "|---|" + "---:|" * (len(stage_names) + 2)]
    for name, row in rows.items():
        if row.get("stages"):
            cells = " | ".join(_cell(row["stages"].get(stage)) for stage in stage_names)
            lines.append(f"| {name} | {cells} | {_cell(sum(row['stages'].values()))} | "
                         f"{_cell(row.get('build_peak_rss_mb'), 0)} |")
    return "\n".join(lines).lstrip("\n")


@attrs.frozen
class Goal:
    """An issue-13 speed goal at batch 1: ``contender``'s ``key`` at most ``bound`` times ``base``'s."""

    what: str
    contender: str
    base: str
    key: str
    bound: float


# The fast path of each runtime against what the issue measures it by; "goals" names them as contenders.
GOALS = (
    Goal("ONNX decode vs ONNX Runtime GenAI", "hfx-onnx", "ort-genai", "decode_ms", 1.1),
    Goal("ONNX prefill vs ONNX Runtime GenAI", "hfx-onnx", "ort-genai", "prefill_ms", 1.2),
    Goal("OpenVINO decode vs ONNX Runtime GenAI", "hfx-ov-stateful", "ort-genai", "decode_ms", 1.0),
    Goal("ExecuTorch decode vs eager", "hfx-pte-llm", "eager", "decode_ms", 0.6),
    Goal("torch.export decode vs eager", "hfx-aoti", "eager", "decode_ms", 0.7),
)
FAST_PATHS = tuple(dict.fromkeys(goal.contender for goal in GOALS))
GOAL_CONTENDERS = ("eager", "ort-genai", *FAST_PATHS)
SIZE_BOUND, MEMORY_BOUND, EXPORT_BOUND = 1.1, 1.5, 120.0  # x checkpoint, x weights over the footprint, seconds


def _verdict(holds: bool | None) -> str:
    return "-" if holds is None else "holds" if holds else "**misses**"


def goals_table(results: Mapping[str, Any]) -> list[str]:
    """Markdown lines: each of issue 13's goals measured in this run (batch 1), whether it holds, and whether the
    floor leaves room for it (a goal under the time needed to read the weights once cannot hold in fp32 here);
    then each goal contender's size, memory, export time and tokens against their bounds."""
    rows = results["contenders"]
    figure = functools.partial(_figure, rows, "1")
    floor = results.get("floor", {}).get("decode_ms")
    lines = ["\nIssue 13's goals at batch 1, as measured in this run (the goal in ms against the floor: under it, "
             "no fp32 program can meet the goal on this machine):\n",
             "| goal | contender | measured | bound | verdict | goal ms | floor ms |",
             "|---|---|---:|---:|---|---:|---:|"]
    for goal in GOALS:
        value, base = figure(goal.contender, goal.key), figure(goal.base, goal.key)
        ratio = None if value is None or not base else value / base
        goal_ms = None if not base else goal.bound * base
        against = floor if goal.key == "decode_ms" else None
        verdict = _verdict(None if ratio is None else ratio <= goal.bound)
        if against is not None and goal_ms is not None and goal_ms < against:
            verdict += " (under the floor)"
        lines.append(f"| {goal.what} | {goal.contender} | {_cell(ratio, 2)} | {goal.bound:.1f} | {verdict} | "
                     f"{_cell(goal_ms, 2)} | {_cell(against, 2)} |")
    weights_mb = results.get("model", {}).get("weight_bytes", 0) / 2**20
    checkpoint = results.get("model", {}).get("checkpoint_mb")
    lines += ["", f"| contender | size / checkpoint (<= {SIZE_BOUND}) | (peak - footprint) / weights, batch 1 "
              f"(<= {MEMORY_BOUND}) | export s (<= {EXPORT_BOUND:.0f}) | eager's tokens, batch 1 |",
              "|---|---:|---:|---:|---|"]
    for name in FAST_PATHS:
        row = rows.get(name)
        if row is None or "error" in row:
            continue
        size = None if not checkpoint or row.get("size_mb") is None else row["size_mb"] / checkpoint
        peak, footprint = figure(name, "peak_rss_mb"), row.get("footprint_mb")
        memory = _over_weights(peak, footprint, weights_mb)
        export = _export_seconds(row)
        same = row.get("same_tokens", {}).get("1")
        lines.append(f"| {name} | {_cell(size, 2)} {_verdict(None if size is None else size <= SIZE_BOUND)} | "
                     f"{_cell(memory, 2)} {_verdict(None if memory is None else memory <= MEMORY_BOUND)} | "
                     f"{_cell(export)} {_verdict(None if export is None else export <= EXPORT_BOUND)} | "
                     f"{'-' if same is None else 'yes' if same else '**no**'} |")
    return lines


def memory_table(results: Mapping[str, Any]) -> list[str]:
    """Markdown lines: per contender its footprint, each batch's peak RSS over it as a multiple of the weight bytes."""
    rows, batches = results["contenders"], list(results["prompts"])
    if not any(row.get("footprint_mb") is not None for row in rows.values()):
        return []  # a run from before footprints were measured
    weights_mb = results["model"]["weight_bytes"] / 2**20
    lines = ["\nMemory while generating: the footprint is the run process's RSS with its libraries imported and "
             "nothing loaded; the load's peak is the high-water mark after opening the program, which is then "
             "reset, so each batch's peak is its generation's; (peak - footprint) / weights is the issue's "
             "measure (target 1.5); mapped is the file-backed RSS at the end (weight files the runtime maps):\n",
             "| contender | footprint MB | load peak MB | " + " | ".join(f"batch {b} peak MB | x weights" for b in batches)
             + " | mapped MB |",
             "|---|---:|---:|" + "---:|---:|" * len(batches) + "---:|"]
    for name, row in rows.items():
        footprint = row.get("footprint_mb")
        if footprint is None:
            continue
        peaks = [_figure(rows, batch, name, "peak_rss_mb") for batch in batches]
        cells = [f"{_cell(peak, 0)} | {_cell(_over_weights(peak, footprint, weights_mb), 2)}"
                 for peak in peaks]
        lines.append(f"| {name} | {_cell(footprint, 0)} | {_cell(row.get('load_peak_rss_mb'), 0)} | {' | '.join(cells)} | "
                     f"{_cell(row.get('file_rss_mb'), 0)} |")
    return lines


def header(results: Mapping[str, Any]) -> str:
    """The run's machine, command, date, model and floor, as markdown lines."""
    info, model = results["machine"], results["model"]
    floor = results.get("floor", {})
    floor_text = (f"{floor['bandwidth'] / 1e9:.1f} GB/s read, so a decode step that reads every weight once takes "
                  f"at least {floor['decode_ms']:.2f} ms" if "bandwidth" in floor else f"not measured ({floor.get('error')})")
    return "\n".join([
        f"- command: `{results['command']}`",
        f"- date: {results['date']}",
        f"- machine: {info['cpu']}, {info['cores']} cores; ISA: {info['isa']}",
        f"- versions: {info['versions']}",
        (f"- model: {model['shape']} shape, {model['layers']} layers, {model['parameters'] / 1e6:.1f}M parameters, "
         f"{model['weight_bytes'] / 1e6:.3g} MB of fp32 weights (checkpoint {model['checkpoint_mb']:.3g} MB), random weights"),
        (f"- threads: {results['threads']} per process, every runtime; figures are the best of "
         f"{results.get('rounds', 1)} round(s) of runs"),
        f"- floor: {floor_text}",
    ])


def compare_tokens(rows: dict[str, Any]) -> None:
    """Mark each contender's runs with whether its new tokens are eager's (no eager run: no mark)."""
    eager = rows.get("eager", {}).get("runs", {})
    for row in rows.values():
        runs = row.get("runs", {})
        row["same_tokens"] = {batch: run["tokens"] == eager[batch]["tokens"] for batch, run in runs.items() if batch in eager}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm-135m")
    parser.add_argument("--layers", type=int, help="override the shape's layer count (e.g. 2 for a quick run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="run every contender this many times, round-robin; best of")
    parser.add_argument("--reuse-builds", action="store_true", help="keep builds that --workdir already holds")
    parser.add_argument("--contenders", help="comma-separated names (default: all; goals: issue 13's); see --list")
    parser.add_argument("--list", action="store_true", help="print the contenders' names and exit")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "runtime_speed")
    parser.add_argument("--workdir", type=Path, help="keep the checkpoint and every contender's files here")
    parser.add_argument("--child", choices=("build", "run", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--weight-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    names = list(contenders(args.threads))
    if args.list:
        print("\n".join(names))
        return
    chosen = chosen_contenders(args.contenders, names)
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; known: {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="hfx-runtime-speed-") as tmp:
        results = measure(args, chosen, args.workdir or Path(tmp), functools.partial(write_results, args.out))
    print(header(results) + "\n\n" + table(results))


def chosen_contenders(given: str | None, names: list[str]) -> list[str]:
    """The contenders ``--contenders`` names, in its order; ``goals`` stands for issue 13's (``GOAL_CONTENDERS``).

    >>> chosen_contenders("eager,goals,hfx-onnx-int4", ["eager", "x"])
    ['eager', 'ort-genai', 'hfx-onnx', 'hfx-ov-stateful', 'hfx-pte-llm', 'hfx-aoti', 'hfx-onnx-int4']
    >>> chosen_contenders(None, ["eager", "x"])
    ['eager', 'x']
    """
    if not given:
        return names
    expanded = [name for part in given.split(",") for name in (GOAL_CONTENDERS if part == "goals" else (part,))]
    return list(dict.fromkeys(expanded))


def write_results(out: Path, results: Mapping[str, Any]) -> None:
    """``<out>.json`` and ``<out>.md`` of the results so far."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(header(results) + "\n\n" + table(results) + "\n")


def measure(args: argparse.Namespace, chosen: list[str], work: Path,
            progress: Callable[[Mapping[str, Any]], None]) -> dict[str, Any]:
    """Write the checkpoint and prompts in ``work``, build every contender, then run them all, ``--rounds`` times.

    Builds come first and runs follow back to back, round-robin, so that the load other work puts on the
    machine drifts as little as possible between contenders; each figure is the best round's.
    ``progress`` gets the results so far after each step, so a long run that is stopped keeps its rows.
    """
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / "checkpoint"
    config = shape_config(args.shape, args.layers)
    model = write_checkpoint(checkpoint, config)
    model.update(shape=args.shape, layers=config.num_hidden_layers, checkpoint_mb=size_mb(checkpoint))
    prompt_sets = prompts(config.vocab_size, prompt=args.prompt)
    prompt_file = work / "prompts.json"
    prompt_file.write_text(json.dumps(prompt_sets))
    common = ["--threads", str(args.threads), "--checkpoint", str(checkpoint), "--tokens", str(args.tokens),
              "--repeats", str(args.repeats), "--prompts", str(prompt_file)]
    floor_arguments = ["--child", "floor", *common, "--files", str(work), "--weight-bytes", str(model["weight_bytes"])]
    command = " ".join(shlex.quote(part) for part in ["python", "benchmarks/runtime_speed.py", *sys.argv[1:]])
    rows: dict[str, Any] = {name: {} for name in chosen}
    results = {"command": command, "date": datetime.date.today().isoformat(), "machine": machine(), "model": model,
               "threads": args.threads, "prompt": args.prompt, "tokens": args.tokens, "rounds": args.rounds,
               "prompts": prompt_sets, "floor": {}, "contenders": rows}
    arguments = {name: [*common, "--contender", name, "--files", str(work / name)] for name in chosen}
    for name in chosen:
        rows[name] = built_row(name, arguments[name], args, model, reuse=args.reuse_builds)
        progress(results)
    for _ in range(args.rounds):
        results["floor"] = measure_floor(floor_arguments, model["weight_bytes"], results["floor"], timeout=args.timeout)
        for name in chosen:
            if "error" not in rows[name]:
                rows[name] = with_run(rows[name], name, arguments[name], timeout=args.timeout)
                compare_tokens(rows)
                progress(results)
    return results


def measure_floor(arguments: list[str], weight_bytes: int, before: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
    """The read bandwidth measured now in a fresh process, or ``before`` where that was higher; the decode floor."""
    got = run_json(__file__, arguments, timeout=timeout)
    best = max((m for m in (before, got) if "bandwidth" in m), key=lambda m: m["bandwidth"], default=got)
    return {**best, "decode_ms": weight_bytes / best["bandwidth"] * 1e3} if "bandwidth" in best else best


def built_row(name: str, arguments: list[str], args: argparse.Namespace, model: Mapping[str, Any], *,
              reuse: bool) -> dict[str, Any]:
    """A contender's build in a fresh process (or, with ``reuse``, the one its files' ``build.json`` records)."""
    if contenders(args.threads)[name].build is None:
        return {"stages": None, "build_peak_rss_mb": None, "size_mb": model["checkpoint_mb"]}
    record = Path(arguments[arguments.index("--files") + 1]).with_suffix(".build.json")
    if reuse and record.is_file():
        built = json.loads(record.read_text())
    else:
        print(f"{name}: build", flush=True)
        built = run_json(__file__, ["--child", "build", *arguments], timeout=args.timeout)
        if "error" in built:
            print(f"{name}: build failed: {built['error']}", flush=True)
            return {"error": f"build: {built['error']}"}
        record.write_text(json.dumps(built))
    print(f"{name}: built {json.dumps(built)}", flush=True)
    return {"stages": built["stages"], "build_peak_rss_mb": built["peak_rss_mb"], "size_mb": built["size_mb"]}


def with_run(row: Mapping[str, Any], name: str, arguments: list[str], *, timeout: float) -> dict[str, Any]:
    """``row`` with one more run of the contender in a fresh process: each figure the best so far, tokens the first."""
    print(f"{name}: run", flush=True)
    ran = run_json(__file__, ["--child", "run", *arguments], timeout=timeout)
    if "error" in ran:
        print(f"{name}: run failed: {ran['error']}", flush=True)
        return {**row, "error": f"run: {ran['error']}"}
    runs = dict(row.get("runs", {}))
    for batch, run in ran["runs"].items():
        before = runs.get(batch, run)
        runs[batch] = {**before, **{key: min(before[key], run[key]) for key in ("prefill_ms", "decode_ms", "peak_rss_mb")
                                    if key in run}}
    print(f"{name}: {json.dumps({batch: {k: v for k, v in run.items() if k != 'tokens'} for batch, run in runs.items()})}",
          flush=True)
    memory = {key: ran[key] for key in ("footprint_mb", "load_peak_rss_mb", "file_rss_mb") if ran.get(key) is not None}
    return {**row, **memory, "runs": runs, "threads": ran["threads"],
            "peak_rss_mb": max(row.get("peak_rss_mb") or 0, ran["peak_rss_mb"])}


if __name__ == "__main__":
    main()
