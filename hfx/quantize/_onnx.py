"""``quantize_onnx``: ONNX Runtime quantization of an ``OnnxProgram`` (dynamic int8, static QDQ, or int4 weights)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
from toolz import curry

from hfx._cpu import int8_dot_product_without_saturation
from hfx._lift import per_component
from hfx.quantize._calibration import Calibration, named_feeds
from hfx.quantize._common import (
    check_choice,
    check_positive_int,
    component_samples,
    int8_reduce_range,
    quantization_error,
    quietly,
    with_quantization,
)

STAGE = "quantize_onnx"

MODES: Mapping[str, str] = MappingProxyType(
    {
        "dynamic": "int8 weights per output channel, activations quantized per call (MatMulInteger); no calibration",
        "static": "QDQ int8 weights and activations, activation ranges observed on calibration (MinMax)",
        "int4": "int4 symmetric weights per block of group_size inputs (MatMulNBits), float32 compute; no calibration",
    }
)

# MatMulNBits takes blocks of a power of two, at least 16 inputs (ONNX Runtime 1.32's kernels).
_BLOCK_SIZES = (16, 32, 64, 128, 256)


@curry
def quantize_onnx(
    program: Any, /, *, mode: str = "dynamic", calibration: Calibration | None = None, group_size: int = 32,
    reduce_range: bool | None = None,
) -> Any:
    """Quantize an ONNX program with ONNX Runtime's quantizer; return a new ``OnnxProgram``.

    ``"dynamic"`` stores int8 weights and quantizes activations at run time;
    ``"static"`` inserts QuantizeLinear/DequantizeLinear pairs (QDQ) whose
    activation ranges are observed on ``calibration``; ``"int4"`` stores the
    weights of every ``MatMul`` with a constant weight (the linears, the LM head)
    as int4 per block of ``group_size`` inputs, run by ``MatMulNBits`` (ONNX
    Runtime's ``matmul_nbits_quantizer``, round to nearest). The int8 modes store 7-bit
    weights (``reduce_range``) where the CPU's int8 kernels would saturate: x86 without VNNI
    or AMX (``hfx._cpu``; ONNX Runtime's guidance for such CPUs). The model goes to ONNX
    Runtime as a file with external data, so models over 2 GB quantize. The
    given program is not changed. ``pipe(model, capture(inputs), lower_to_onnx, quantize_onnx)``.

    Args:
        program: an ``OnnxProgram``, or ``Components`` of them.
        mode: ``"dynamic"``, ``"static"`` or ``"int4"`` (see ``MODES``).
        calibration: input dicts for the model, or ``{component: [input dicts]}``
            (``hfx.calibration_inputs``); required for ``"static"``.
        group_size: ``"int4"``'s block: how many inputs share a scale (16, 32, 64, 128 or 256).
        reduce_range: 7-bit int8 weights (``"dynamic"``, ``"static"``), so that CPUs without VNNI
            do not saturate; ``None`` decides from this CPU. Pass ``True`` for a program that will
            run on other CPUs than this one (an AVX2 fleet); ``"int4"`` takes only ``None``.

    Returns:
        A new ``OnnxProgram`` with the same ``io`` (``Components`` of them, with ``meta.quantization``).

    Raises:
        ValueError: an unknown ``mode``, ``"static"`` without calibration, a ``group_size``
            MatMulNBits does not take, or ``reduce_range`` that is not a bool (or set for ``"int4"``).
        ImportError: onnxruntime is missing (install ``hfx[onnx]``).
        LoweringError: ONNX Runtime's quantizer failed.

    Example:
        >>> import torch, hfx
        >>> onnx = hfx.lower_to_onnx(hfx.capture({"input": torch.ones(2, 64)}, torch.nn.Linear(64, 8)))
        >>> quantize_onnx(onnx)(input=torch.ones(5, 64)).shape
        torch.Size([5, 8])
    """
    check_choice(STAGE, "mode", mode, MODES)
    check_positive_int(STAGE, "group_size", group_size, "32, 128")
    if group_size not in _BLOCK_SIZES:
        msg = f"{STAGE}: group_size must be one of {list(_BLOCK_SIZES)} (MatMulNBits' blocks), got {group_size!r}"
        raise ValueError(msg)
    reduce_range = int8_reduce_range(STAGE, reduce_range, int8=mode != "int4",
                                     without_saturation=int8_dot_product_without_saturation)
    result = per_component(_quantize, name=STAGE)(program, mode=mode, calibration=calibration, group_size=group_size,
                                                  reduce_range=reduce_range)
    entry = {"stage": STAGE, "mode": mode, "calibrated": calibration is not None}
    return with_quantization(result, {**entry, "group_size": group_size} if mode == "int4" else
                             {**entry, "reduce_range": reduce_range})


def _quantize(program: Any, /, *, mode: str, calibration: Calibration | None, group_size: int,
              reduce_range: bool) -> Any:
    """One component: the model written to a temporary directory, quantized there and read back into memory."""
    from hfx.backends._common import require
    from hfx.backends._onnx import OnnxProgram

    require("onnx", "onnxscript", "onnxruntime", extra="onnx", stage="quantize_onnx")
    static = "mode 'static'" if mode == "static" else None
    samples = component_samples(STAGE, program, OnnxProgram, calibration, static=static, instead="mode='dynamic'")
    feeds = named_feeds(program.io, samples, program=f"{STAGE}({program.name})") if samples else None
    # ONNX Runtime's quantizer logs its advice through the root logger.
    with tempfile.TemporaryDirectory(prefix="hfx-quantize-onnx-") as tmp, quietly("root", "onnxruntime") as log:
        try:
            model = _quantized_model(program.model, Path(tmp), mode, feeds, group_size, reduce_range)
        except Exception as exc:
            todo = "Try mode='dynamic', or lower with optimize=False and quantize again."
            raise quantization_error(STAGE, "", program.name, exc, todo, log.getvalue()) from exc
    return attrs.evolve(program, model=model)  # its io, fixes, fusions, threads and providers


def _quantized_model(model: Any, directory: Path, mode: str, feeds: list[dict[str, Any]] | None,
                     group_size: int, reduce_range: bool) -> Any:
    """``model`` saved in ``directory``, quantized by ONNX Runtime and loaded back with its weights in memory."""
    import onnx_ir as ir
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    source, target = directory / "model.onnx", directory / "quantized.onnx"
    ir.save(model, source, external_data="model.onnx.data")  # the in-memory model is not changed
    if mode == "int4":
        _int4(source, target, group_size)
    elif mode == "dynamic":
        quantize_dynamic(source, target, per_channel=True, reduce_range=reduce_range, weight_type=QuantType.QInt8,
                         use_external_data_format=True)
    else:
        quantize_static(
            source, target, _Feeds(feeds or []), quant_format=QuantFormat.QDQ, per_channel=True,
            reduce_range=reduce_range, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, use_external_data_format=True,
        )
    quantized = ir.load(target)
    ir.external_data.load_to_model(quantized)  # the program outlives the temporary directory
    return quantized


def _int4(source: Path, target: Path, group_size: int) -> None:
    """Write ``source`` with int4 ``MatMulNBits`` weights to ``target``.

    ``accuracy_level`` stays unset: the kernel dequantizes to float32 and multiplies in
    float32, so the result depends on the weights' rounding alone, the same on AVX2 and
    AVX-512 CPUs (level 4 quantizes activations to int8 in ISA-specific blocks).
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=4, block_size=group_size, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=True)


class _Feeds:
    """The ``CalibrationDataReader`` protocol (``get_next``) over a list of feeds; ONNX Runtime reads it once."""

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._feeds: Iterator[dict[str, Any]] = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._feeds, None)
