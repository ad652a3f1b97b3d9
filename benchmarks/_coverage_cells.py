"""One cell of the coverage table: export one zoo architecture with one tool to one runtime and check it.

Run by ``benchmarks/coverage.py`` in a subprocess per cell (``--cell arch,runtime,kind,tool``), so that a crash,
a hang or leaked global state in one cell cannot touch another. Only this module imports the peer
(``transformers.exporters``); hfx itself never does.

A cell returns a JSON-ready dict: ``status`` (``pass`` / ``fail`` / ``n/a``), ``reason`` (exception type and
first line, or what differed), ``export_s`` (capture + export + lowering), ``max_diff`` (forward cells) and
``tokens_match`` (generation cells).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

import hfx
from hfx import _errors as errors
from hfx import zoo

RUNTIMES = ("torch", "onnx", "pte", "ov")
KINDS = ("forward", "generation")
TOOLS = ("hfx", "peer")

CAPTURE = {"batch": 2, "sequence": 7}
NEW_SHAPE = {"batch": 3, "sequence": 11}
PROMPT = {"batch": 2, "sequence": 9}
NEW_TOKENS = 8
ATOL = 1e-4
# float32 rounding grows with an output's magnitude, and eager float32 is itself that far from exact: eager
# float32 vs float64 differs by 1.7e-4 on T5's logits (max 365) and 3e-4 on BART's (max 14.7, 2e-5 of it). A
# runtime that orders the same sums differently lands about as far again, so a forward passes at
# ATOL + RTOL * (largest eager magnitude), as ``hfx.verify(rtol=)`` does; a real error (a wrong mask or position)
# is of the order of the output itself.
RTOL = 5e-5

# runtime -> the hfx lowering (torch: the Exported program itself runs)
HFX_LOWERINGS: dict[str, Callable[[Any], Any]] = {
    "torch": lambda exported: exported,
    "onnx": lambda exported: hfx.lower_to_onnx(exported),
    "pte": lambda exported: hfx.lower_to_pte(exported),
    "ov": lambda exported: hfx.lower_to_ov(exported),
}

# runtime -> (peer exporter class, peer config class) names in transformers.exporters
PEER_CLASSES = {
    "torch": ("DynamoExporter", "DynamoConfig"),
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "pte": ("ExecutorchExporter", "ExecutorchConfig"),
    "ov": ("OpenVINOExporter", "OpenVINOConfig"),
}


def reason_of(exc: BaseException) -> str:
    """``Type: first line`` of an exception (its cause's when the message is empty), at most 160 characters."""
    return errors.reason_of(exc, limit=160)


def _timed(build: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = build()
    return value, time.perf_counter() - start


def _forward_result(report: hfx.Report, seconds: float) -> dict[str, Any]:
    failing = [d for d in report.diffs if not d.max_abs <= report.atol + report.rtol * d.scale]  # NaN fails
    worst = max(failing, key=lambda d: (d.max_abs != d.max_abs, d.max_abs), default=None)  # a NaN first
    result = {"status": "pass" if report.passed else "fail", "export_s": round(seconds, 2),
              "max_diff": report.max_abs}
    if not report.passed and worst is not None:
        how = "shape differs or missing" if worst.max_abs == float("inf") else f"max abs {worst.max_abs:.1e}"
        first = report.diffs[0]
        result["reason"] = f"parity: {worst.name} {how} ({first.name} max abs {first.max_abs:.0e})"
    return result


def hfx_forward(arch: str, runtime: str) -> dict[str, Any]:
    """Export the forward at the capture shape, lower it, compare with eager at a new batch and sequence length,
    and, for an image model, at another image size wherever the program takes it."""
    model = zoo.build(arch)
    program, seconds = _timed(
        lambda: HFX_LOWERINGS[runtime](hfx.export(hfx.capture(zoo.forward_inputs(arch, **CAPTURE), model)))
    )
    inputs = zoo.forward_inputs(arch, **NEW_SHAPE)
    result = _forward_result(hfx.verify(model, inputs, program, atol=ATOL, rtol=RTOL), seconds)
    resized = at_another_image_size(inputs)
    if result["status"] == "pass" and resized is not None:
        result.update(_at_image_size(model, resized, program))
    return result


def at_another_image_size(inputs: dict[str, Any]) -> dict[str, Any] | None:
    """``inputs`` with their images (``pixel_values``, batch x channels x H x W, or a video's batch x frames x
    channels x H x W) at 1.5 H x 1.25 W, and every other tensor that ends in H x W (a ``pixel_mask``) resized
    alike; ``None`` without images.

    Example:
        >>> resized = at_another_image_size({"pixel_values": torch.ones(2, 3, 32, 32), "pixel_mask": torch.ones(2, 32, 32)})
        >>> {name: tuple(value.shape) for name, value in resized.items()}
        {'pixel_values': (2, 3, 48, 40), 'pixel_mask': (2, 48, 40)}
    """
    pixels = inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.ndim not in (4, 5) or not pixels.is_floating_point():
        return None
    height, width = pixels.shape[-2:]
    size = (height + height // 2, width + width // 4)
    generator = torch.Generator().manual_seed(0)
    resized = dict(inputs)
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and tuple(value.shape[-2:]) == (height, width):
            shape = (*value.shape[:-2], *size)
            resized[name] = (torch.randn(shape, generator=generator, dtype=value.dtype) if value.is_floating_point()
                             else torch.ones(shape, dtype=value.dtype))
    return resized


def _at_image_size(model: torch.nn.Module, inputs: dict[str, Any], program: Any) -> dict[str, Any]:
    """The check at another image size: ``image_size`` says what happened (eager refuses it, the program refuses
    it, or it matched); a program that takes the size and differs from eager fails the cell."""
    size = "x".join(str(n) for n in inputs["pixel_values"].shape[-2:])
    try:
        with torch.no_grad():
            model(**copy.deepcopy(inputs))
    except Exception:  # noqa: BLE001 - the model itself takes one image size: nothing to compare
        return {"image_size": f"{size}: eager refuses"}
    try:
        report = hfx.verify(model, inputs, program, atol=ATOL, rtol=RTOL)
    except errors.InputError:
        return {"image_size": f"{size}: refused"}
    except Exception as exc:  # noqa: BLE001 - the program took the size and broke: a claim it does not keep
        return {"status": "fail", "image_size": f"{size}: error", "reason": f"at {size}: {reason_of(exc)}"}
    checked = _forward_result(report, 0.0)
    if checked["status"] == "pass":
        return {"image_size": f"{size}: pass"}
    return {"status": "fail", "image_size": f"{size}: fail", "reason": f"at {size}: {checked['reason']}"}


def _eager_tokens(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**copy.deepcopy(inputs), max_new_tokens=NEW_TOKENS, do_sample=False)


def _token_result(got: torch.Tensor, want: torch.Tensor, seconds: float) -> dict[str, Any]:
    match = got.shape == want.shape and torch.equal(got, want)
    result = {"status": "pass" if match else "fail", "export_s": round(seconds, 2), "tokens_match": match}
    if not match and got.shape != want.shape:
        result["reason"] = f"tokens differ: got shape {tuple(got.shape)}, want {tuple(want.shape)}"
    elif not match:
        row = int((got != want).any(dim=-1).nonzero()[0])
        result["reason"] = (f"tokens differ: row {row} got {got.tolist()[row][-NEW_TOKENS:]} "
                            f"want {want.tolist()[row][-NEW_TOKENS:]}")
    return result


def hfx_generation(arch: str, runtime: str) -> dict[str, Any]:
    """``decompose`` + export + lower, then ``hfx.generate`` greedy tokens against eager ``generate`` (left-padded)."""
    model = zoo.build(arch)
    prompt = zoo.inputs(arch, **PROMPT)
    try:
        want = _eager_tokens(model, prompt)
    except Exception as exc:  # noqa: BLE001 - the zoo's prompt is not one eager generate takes: no reference
        return {"status": "n/a", "reason": f"eager generate fails on the zoo's prompt: {reason_of(exc)}"}
    programs, seconds = _timed(
        lambda: HFX_LOWERINGS[runtime](hfx.export(hfx.decompose(hfx.capture(zoo.inputs(arch, **CAPTURE), model))))
    )
    if (getattr(model.generation_config, "num_beams", None) or 1) > 1:  # hfx.generate's loop refuses beam search
        with torch.no_grad():  # transformers' generate, beams and all, over the programs
            got = hfx.as_model(programs).generate(**copy.deepcopy(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)
    else:
        got = hfx.generate(copy.deepcopy(prompt), programs, max_new_tokens=NEW_TOKENS)
    return _token_result(got, want, seconds)


class _PeerProgram:
    """The peer's single-graph ``ExportedModel`` seen through ``hfx.verify``'s program interface."""

    class io:  # noqa: N801 - mirrors the ``program.io.constants`` that verify reads
        constants: dict[str, Any] = {}

    def __init__(self, exported: Any) -> None:
        self.exported = exported
        self.name = "peer"

    def __call__(self, **inputs: Any) -> Any:
        return self.exported(**copy.deepcopy(inputs))


def _peer(runtime: str) -> tuple[Any, Any]:
    import transformers.exporters as peer

    exporter, config = PEER_CLASSES[runtime]
    return getattr(peer, exporter)(), getattr(peer, config)(dynamic=True)


def peer_forward(arch: str, runtime: str) -> dict[str, Any]:
    """The peer's ``export`` with ``dynamic=True`` (its documented default), run and compared like hfx's."""
    exporter, config = _peer(runtime)
    model = zoo.build(arch)
    # The peer casts the sample inputs in place, so it gets its own copy.
    exported, seconds = _timed(lambda: exporter.export(model, zoo.forward_inputs(arch, **CAPTURE), config))
    report = hfx.verify(model, zoo.forward_inputs(arch, **NEW_SHAPE), _PeerProgram(exported), atol=ATOL, rtol=RTOL)
    return _forward_result(report, seconds)


def peer_generation(arch: str, runtime: str) -> dict[str, Any]:
    """The peer's ``export_for_generation``: it exports the components but has no loop that generates with them."""
    exporter, config = _peer(runtime)
    model = zoo.build(arch)
    exported, seconds = _timed(lambda: exporter.export_for_generation(model, zoo.inputs(arch, **CAPTURE), config))
    return {"status": "n/a", "export_s": round(seconds, 2),
            "reason": f"no generation loop; exported {', '.join(exported.components)}"}


CELLS: dict[tuple[str, str], Callable[[str, str], dict[str, Any]]] = {
    ("hfx", "forward"): hfx_forward,
    ("hfx", "generation"): hfx_generation,
    ("peer", "forward"): peer_forward,
    ("peer", "generation"): peer_generation,
}


def run_cell(arch: str, runtime: str, kind: str, tool: str) -> dict[str, Any]:
    """Run one cell; an exception becomes a ``fail`` with its reason (``n/a`` for a peer generation export)."""
    if runtime not in RUNTIMES or kind not in KINDS or tool not in TOOLS:
        msg = f"unknown cell {arch},{runtime},{kind},{tool}; runtimes {RUNTIMES}, kinds {KINDS}, tools {TOOLS}"
        raise ValueError(msg)
    torch.set_num_threads(1)  # a shared machine: one core per cell, so parallel cells do not fight
    start = time.perf_counter()
    try:
        result = CELLS[tool, kind](arch, runtime)
    except Exception as exc:  # noqa: BLE001 - a cell reports any failure as data
        status = "n/a" if (tool, kind) == ("peer", "generation") else "fail"
        prefix = "no generation loop; export_for_generation failed: " if status == "n/a" else ""
        result = {"status": status, "reason": prefix + reason_of(exc)}
    result["wall_s"] = round(time.perf_counter() - start, 2)
    return result
