"""Quantization stages, one per runtime, that pipe after the lowering (or export) they quantize.

``quantize_pt2e`` (ExecuTorch / XNNPACK, on an ``Exported``), ``quantize_onnx``
(ONNX Runtime, on an ``OnnxProgram``) and ``quantize_ov`` (NNCF, on an
``OvProgram``) each return a new record of the kind they take; options are
keyword arguments and the stages are curried::

    pipe(model, hfx.capture(inputs), hfx.export, hfx.quantize_pt2e, hfx.lower_to_pte)
    pipe(model, hfx.capture(inputs), hfx.lower_to_ov, hfx.quantize_ov(mode="int4"))

``calibration_inputs`` builds per-component calibration data for decomposed models.
"""

from hfx.quantize._calibration import calibration_inputs as calibration_inputs
from hfx.quantize._onnx import quantize_onnx as quantize_onnx
from hfx.quantize._openvino import quantize_ov as quantize_ov
from hfx.quantize._pt2e import quantize_pt2e as quantize_pt2e

__all__ = ["calibration_inputs", "quantize_onnx", "quantize_ov", "quantize_pt2e"]
