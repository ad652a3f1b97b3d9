"""The quantized forms hfx offers, per runtime, as data: the one list the quantization and speed benchmarks share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Form:
    """A quantized form: the hfx stage and options that make it, and where it goes in the pipeline."""

    runtime: str  # "pte", "onnx" or "ov": the lowering it belongs to
    label: str  # as the tables print it
    stage: str  # the hfx function
    options: Mapping[str, Any]  # its keyword arguments; ``calibration: True`` stands for calibration data
    before_lowering: bool  # PT2E quantizes the ``Exported``; the others the lowered program

    @property
    def slug(self) -> str:
        """The label as a name part: ``"int8 static"`` -> ``"int8-static"``."""
        return self.label.replace(" ", "-").lower()

    def call(self, value: Any, calibration: Any = None) -> Any:
        """``hfx.<stage>(value, **options)``, with ``calibration`` where the form needs it."""
        import hfx

        options = {**self.options, "calibration": calibration} if self.options.get("calibration") else dict(self.options)
        return getattr(hfx, self.stage)(value, **options)


QUANTIZED_FORMS: tuple[Form, ...] = (
    Form(runtime="pte", label="8da4w", stage="quantize_pt2e", options={"scheme": "8da4w"}, before_lowering=True),
    Form(runtime="pte", label="8da8w", stage="quantize_pt2e", options={"scheme": "8da8w"}, before_lowering=True),
    Form(runtime="pte", label="int8 static", stage="quantize_pt2e", options={"scheme": "int8", "calibration": True},
         before_lowering=True),
    Form(runtime="onnx", label="dynamic int8", stage="quantize_onnx", options={"mode": "dynamic"}, before_lowering=False),
    Form(runtime="onnx", label="static QDQ", stage="quantize_onnx", options={"mode": "static", "calibration": True},
         before_lowering=False),
    Form(runtime="onnx", label="int4", stage="quantize_onnx", options={"mode": "int4"}, before_lowering=False),
    Form(runtime="ov", label="int8 weights", stage="quantize_ov", options={"mode": "int8"}, before_lowering=False),
    Form(runtime="ov", label="int4 weights", stage="quantize_ov", options={"mode": "int4"}, before_lowering=False),
    Form(runtime="ov", label="int8 static", stage="quantize_ov", options={"mode": "int8-static", "calibration": True},
         before_lowering=False),
)
