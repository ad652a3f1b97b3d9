"""Export the tiny Llama with torch.export, verify on new shapes, save and load."""

import tempfile

from toolz import pipe

import hfx
from hfx import zoo

model = zoo.build("llama")
exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.export)
print("inputs:", [(s.name, s.shape) for s in exported.io.inputs])

new_inputs = zoo.inputs("llama", batch=3, sequence=11)
report = hfx.verify(model, new_inputs, exported)
print(report)

directory = hfx.save(tempfile.mkdtemp() + "/llama-pt2", exported)
loaded = hfx.load(directory)
print("loaded:", type(loaded(**new_inputs)).__name__, "from", directory)
assert report.passed
