"""Lower the tiny Llama to an ExecuTorch .pte (XNNPACK), verify it on new shapes, save, load and call it."""

import tempfile
import time

from toolz import pipe

import hfx
from hfx import zoo

model = zoo.build("llama")
exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.export)
print("export bounds:", dict(exported.io.bounds))  # batch unbounded, sequence up to max_position_embeddings

start = time.perf_counter()
program = hfx.lower_to_pte(exported, max_sizes={"batch": 4, "sequence": 128})  # the Exported is left as it was
print(f"lowered in {time.perf_counter() - start:.1f} s: {len(program.buffer) / 1e3:.0f} KB .pte, "
      f"{program.planned_bytes / 2**20:.1f} MiB planned for {dict(program.max_sizes)}")

new_inputs = zoo.inputs("llama", batch=3, sequence=11)  # another batch and length, left padding in row 0
report = hfx.verify(model, new_inputs, program)
print(report)

try:
    program(**zoo.inputs("llama", batch=5, sequence=11))  # beyond the planned batch: checked before the runtime
except hfx.InputError as exc:
    print("rejected:", exc, *exc.__notes__, sep="\n  ")

directory = hfx.save(tempfile.mkdtemp() + "/llama-pte", program)  # hfx.json, model.pte
loaded = hfx.load(directory)
outputs = loaded(**new_inputs)
print("loaded:", type(outputs).__name__, "logits", tuple(outputs.logits.shape), "from", directory)
assert report.passed
