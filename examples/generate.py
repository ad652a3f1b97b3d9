"""Generate text with exported graphs on one runtime: python examples/generate.py [pt2|onnx|pte|ov].

Decomposes the tiny Llama by running its generate() once (a full-attention text
decoder: one decode graph that takes the prompt from an empty cache, then one
token per step), exports it once, lowers it to the runtime, and checks that greedy
decoding gives exactly the eager tokens on a left-padded batch.
"""

import sys
import time

import torch
from toolz import pipe

import hfx
from hfx import zoo

LOWERINGS = {
    "pt2": lambda parts: parts,
    "onnx": hfx.lower_to_onnx,
    "pte": lambda parts: hfx.lower_to_pte(parts),
    "ov": lambda parts: hfx.lower_to_ov(parts),
}

runtime = sys.argv[1] if len(sys.argv) > 1 else "pt2"
model = zoo.build("llama")
start = time.perf_counter()
programs = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.decompose, hfx.export, LOWERINGS[runtime])
print(f"{runtime}: components {list(programs)} ready in {time.perf_counter() - start:.1f} s")

prompt = zoo.inputs("llama", batch=2, sequence=9)  # row 0 is left-padded
tokens = hfx.generate(prompt, programs, max_new_tokens=20)
with torch.no_grad():
    expected = model.generate(**prompt, max_new_tokens=20, do_sample=False)
print("new tokens:", tokens[:, 9:].tolist())
print("same as eager generate():", torch.equal(tokens, expected))
assert torch.equal(tokens, expected)
