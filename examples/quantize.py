"""Quantize the tiny Llama on three runtimes as pipe stages, check each against eager, save and load one."""

import tempfile

import torch
from toolz import pipe

import hfx
from hfx import zoo

model = zoo.build("llama")
exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.export)
calibration = [zoo.inputs("llama", batch=1, sequence=n) for n in (5, 9, 13)]  # input dicts, like the capture's
new_inputs = zoo.inputs("llama", batch=3, sequence=11)  # another batch and length than the capture
with torch.no_grad():
    reference = model(**new_inputs).logits


def cosine(program):
    logits = program(**new_inputs).logits
    return torch.nn.functional.cosine_similarity(reference.flatten(), logits.flatten(), dim=0).item()


programs = {
    "pte 8da4w": pipe(exported, hfx.quantize_pt2e(scheme="8da4w", group_size=32), hfx.lower_to_pte),
    "onnx dynamic": pipe(exported, hfx.lower_to_onnx, hfx.quantize_onnx),
    "onnx static": pipe(exported, hfx.lower_to_onnx, hfx.quantize_onnx(mode="static", calibration=calibration)),
    "ov int4": pipe(exported, hfx.lower_to_ov, hfx.quantize_ov(mode="int4", group_size=32)),
}
for name, program in programs.items():
    print(f"{name:13s} cosine vs eager fp32: {cosine(program):.4f}")

# Decomposed models: per-component calibration inputs, recorded from the model's own generate().
parts = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.decompose, hfx.export)
per_component = hfx.calibration_inputs(model, calibration, parts)  # {"decode": [...]}: one graph for prompt and steps
quantized = pipe(parts, hfx.lower_to_ov, hfx.quantize_ov(mode="int8-static", calibration=per_component))
directory = hfx.save(tempfile.mkdtemp() + "/llama-ov-int8", quantized)
loaded = hfx.load(directory)
print("manifest meta:", dict(loaded.meta.quantization))
print("tokens:", hfx.generate(calibration[0], loaded, max_new_tokens=8).tolist())
