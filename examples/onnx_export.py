"""Lower the tiny Llama to ONNX, verify it on new shapes with ONNX Runtime, save, load and call it."""

import tempfile
import time

from toolz import pipe

import hfx
from hfx import zoo

model = zoo.build("llama")
exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.export)

start = time.perf_counter()
program = hfx.lower_to_onnx(exported)  # opset 18, onnxscript optimizer on; the Exported is left as it was
print(f"lowered in {time.perf_counter() - start:.1f} s")
graph = program.model.graph  # an onnx_ir.Model; onnx_ir.to_proto(program.model) gives a ModelProto
print("inputs: ", [(v.name, [str(d) for d in v.shape]) for v in graph.inputs])
print("outputs:", [(v.name, [str(d) for d in v.shape]) for v in graph.outputs])

new_inputs = zoo.inputs("llama", batch=3, sequence=11)  # another batch and length, left padding in row 0
report = hfx.verify(model, new_inputs, program)
print(report)

directory = hfx.save(tempfile.mkdtemp() + "/llama-onnx", program)  # hfx.json, model.onnx, model.onnx.data
loaded = hfx.load(directory)
outputs = loaded(**new_inputs)
print("loaded:", type(outputs).__name__, "logits", tuple(outputs.logits.shape), "from", directory)
assert report.passed
