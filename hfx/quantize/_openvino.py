"""``quantize_ov``: NNCF weight compression (int8, int4) or full int8 quantization of an ``OvProgram``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from toolz import curry

from hfx._cpu import onednn_int8_without_saturation
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

STAGE = "quantize_ov"

MODES: Mapping[str, str] = MappingProxyType(
    {
        "int8": "int8 asymmetric weights per output channel (nncf.compress_weights); data-free",
        "int4": "int4 symmetric weights per group of group_size inputs on a `ratio` of the layers, the rest int8 "
                "(nncf.compress_weights); calibration, when given, picks the layers",
        "int8-static": "int8 weights and activations (nncf.quantize, transformer preset); needs calibration",
    }
)


@curry
def quantize_ov(
    program: Any, /, *, mode: str = "int8", calibration: Calibration | None = None, group_size: int = 128,
    ratio: float = 1.0, reduce_range: bool | None = None,
) -> Any:
    """Compress or quantize an OpenVINO program with NNCF; return a new ``OvProgram``.

    ``"int8"`` and ``"int4"`` compress the weights of matrix multiplications and
    embeddings (the CPU plugin decompresses them on the fly); ``"int8-static"``
    quantizes weights and activations, with activation ranges observed on
    ``calibration``; it stores 7-bit weights (NNCF's ``OverflowFix.ENABLE``) where the CPU's int8
    kernels would saturate: x86 without VNNI or AMX, or oneDNN capped below VNNI by
    ``ONEDNN_MAX_CPU_ISA`` (``hfx._cpu``; NNCF's and OpenVINO's guidance for such CPUs). The weight
    modes keep float activations, so the CPU does not change what they compute beyond rounding.
    NNCF works on a clone: the given program and its model are
    not changed. ``pipe(model, capture(inputs), lower_to_ov, quantize_ov(mode="int4"))``.

    Args:
        program: an ``OvProgram``, or ``Components`` of them.
        mode: ``"int8"``, ``"int4"`` or ``"int8-static"`` (see ``MODES``).
        calibration: input dicts for the model, or ``{component: [input dicts]}``
            (``hfx.calibration_inputs``); required for ``"int8-static"``, used by ``"int4"`` when ``ratio < 1``.
        group_size: inputs per int4 scale (``"int4"``); must divide the layers' input sizes.
        ratio: the share of layers in int4 (``"int4"``), in (0, 1]; the rest stay int8.
        reduce_range: 7-bit int8 weights for ``"int8-static"``; ``None`` decides from this CPU.
            Pass ``True`` for a program that will run on CPUs without VNNI elsewhere.

    Returns:
        A new ``OvProgram`` with the same ``io`` (``Components`` of them, with ``meta.quantization``).

    Raises:
        ValueError: an unknown ``mode``, a bad ``group_size``, ``ratio`` or ``reduce_range`` (a bool for a
            weight mode), or ``"int8-static"`` without calibration.
        ImportError: nncf or openvino is missing (install ``hfx[openvino]``).
        LoweringError: NNCF failed.

    Example:
        >>> import torch, hfx
        >>> ov = hfx.lower_to_ov(hfx.capture({"input": torch.ones(2, 64)}, torch.nn.Linear(64, 8)))
        >>> quantize_ov(mode="int8")(ov)(input=torch.ones(5, 64)).shape
        torch.Size([5, 8])
    """
    _check_options(mode, group_size, ratio)
    reduce_range = int8_reduce_range(STAGE, reduce_range, int8=mode == "int8-static",
                                     without_saturation=onednn_int8_without_saturation)
    result = per_component(_quantize, name=STAGE)(program, mode=mode, calibration=calibration, group_size=group_size,
                                                  ratio=ratio, reduce_range=reduce_range)
    entry = {"stage": STAGE, "mode": mode, "calibrated": calibration is not None}
    if mode == "int4":
        entry = {**entry, "group_size": group_size, "ratio": ratio}
    return with_quantization(result, {**entry, "reduce_range": reduce_range} if mode == "int8-static" else entry)


def _check_options(mode: str, group_size: int, ratio: float) -> None:
    """Raise ``ValueError`` naming the first option out of range."""
    check_choice(STAGE, "mode", mode, MODES)
    check_positive_int(STAGE, "group_size", group_size, "64, 128")
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        msg = f"{STAGE}: ratio must be a number in (0, 1] (the share of int4 layers), got {ratio!r}"
        raise ValueError(msg)


def _quantize(
    program: Any, /, *, mode: str, calibration: Calibration | None, group_size: int, ratio: float, reduce_range: bool
) -> Any:
    """One component: NNCF on a clone of the model, compiled into a new program."""
    from hfx.backends._common import require
    from hfx.backends._openvino import OvProgram

    require("openvino", "nncf", extra="openvino", stage="quantize_ov")
    static = "mode 'int8-static'" if mode == "int8-static" else None
    samples = component_samples(STAGE, program, OvProgram, calibration, static=static, instead="mode='int8'")
    feeds = named_feeds(program.io, samples, program=f"{STAGE}({program.name})") if samples else None
    with quietly("nncf") as log:
        try:
            model = _nncf(program.model.clone(), mode, feeds, group_size, ratio, reduce_range)
        except Exception as exc:
            todo = "Try mode='int8', or for 'int4' a group_size that divides the layers' input sizes."
            raise quantization_error(STAGE, program.source_class, program.name, exc, todo, log.getvalue()) from exc
    return OvProgram(model=model, io=program.io, name=program.name, device=program.device,
                     source_class=program.source_class, graph_fixes=program.graph_fixes)


def _nncf(model: Any, mode: str, feeds: list[dict[str, Any]] | None, group_size: int, ratio: float,
          reduce_range: bool) -> Any:
    """``model`` (a clone, which NNCF may change) compressed or quantized by NNCF."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        OverflowFix,
    )

    dataset = nncf.Dataset(feeds) if feeds else None
    if mode == "int8":
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    if mode == "int4":
        return nncf.compress_weights(
            model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=group_size, ratio=ratio, dataset=dataset,
        )
    overflow_fix = OverflowFix.ENABLE if reduce_range else OverflowFix.DISABLE
    return nncf.quantize(model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds or ()),
                         advanced_parameters=AdvancedQuantizationParameters(overflow_fix=overflow_fix))
