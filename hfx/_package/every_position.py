"""A decode graph's ``logits_to_keep`` input taken out for a pipeline that feeds none: the graph keeps every position.

hfx's multi-token decode graph takes the positions whose logits it returns
(``logits_to_keep``, ``hfx.decompose``), so a prompt's logits cost one
position's lm_head. ONNX Runtime GenAI and Transformers.js feed only the
inputs they know and read the logits as ``[batch, tokens, vocab]`` (GenAI sizes
its logits buffer so, ``src/models/logits.cpp``): their graph computes the
positions from ``input_ids`` instead, ``Range(0, tokens)``.
"""

from __future__ import annotations

from typing import Any

import attrs

from hfx._contract import io_without_positions
from hfx._kept_positions import KEPT_DIM, KEPT_INPUT


def every_position(program: Any, /) -> Any:
    """A new ``OnnxProgram`` of ``program`` that returns the logits of every position of ``input_ids`` and takes
    no ``logits_to_keep``; ``program`` itself when it takes none. ``program`` is not changed."""
    import numpy as np
    import onnx_ir as ir

    if KEPT_INPUT not in program.io.input_names:
        return program
    model = program.model.clone()  # the graph is new, the weights are shared
    graph = model.graph
    kept = next(value for value in graph.inputs if value.name == KEPT_INPUT)
    ids = next(value for value in graph.inputs if value.name == "input_ids")

    def constant(value: int) -> ir.Node:
        return ir.node("Constant", [], attributes={"value": ir.tensor(np.array(value, dtype=np.int64))})

    start, step = constant(0), constant(1)
    tokens = ir.node("Shape", [ids], attributes={"start": 1, "end": 2})
    count = ir.node("Squeeze", [tokens.outputs[0]])
    positions = ir.node("Range", [start.outputs[0], count.outputs[0], step.outputs[0]])
    ir.convenience.replace_all_uses_with(kept, positions.outputs[0])
    graph.inputs.remove(kept)
    graph.insert_before(graph.node(0), [start, step, tokens, count, positions])
    positions.outputs[0].name = KEPT_INPUT
    sequence = ids.shape[1] if ids.shape is not None else None
    for value in graph.outputs:
        if value.shape is not None:
            value.shape = ir.Shape([sequence if str(dim) == KEPT_DIM else dim for dim in value.shape])
    return attrs.evolve(program, model=model, io=io_without_positions(program.io))
