"""benchmarks/step_overhead.py: the step it times is the one hfx.generate feeds (no timing asserted)."""

from __future__ import annotations

from benchmarks import step_overhead as so
from hfx._contract import input_keys


def test_the_timed_step_takes_every_input_of_the_graph_and_runs_on_the_runtime():
    _, decode, kwargs, following = so.decode_step(4)
    assert set(kwargs) == set(following) == set(input_keys(decode.io))  # logits_to_keep too, as generate feeds it
    row = so.measure("onnx", so.program_for("onnx", decode, 1), kwargs, following, 3)
    assert row["inputs"] == len(decode.io.inputs)
