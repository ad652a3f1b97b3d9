"""A stateful OpenVINO model: the KV cache lives in the model as state, and one graph serves the prompt and every step.

This is the form OpenVINO's own LLM path runs (``openvino_genai.LLMPipeline``
refuses a model whose cache is an input: "Model is supposed to be stateful"):
each ``past_key_values.*`` input becomes a variable read at the start of a call
and each matching ``present.*`` output the value written back, so the cache
never leaves the runtime between steps. A ``beam_idx`` input reorders the cache
rows before each step (beam search; ``arange(batch)`` keeps them). The state of
a new request starts empty: ``batch`` rows (from ``input_ids``) and a past of 0.
It returns the logits of the last position only (``last_position_logits``; a
``logits_to_keep`` input becomes that position, ``last_position_only``), and
its linear layers keep one packed weight layout on the CPU (``linear_inputs_as_4d``).
"""

from __future__ import annotations

from typing import Any

import attrs

from hfx._kept_positions import KEPT_INPUT

CACHE_INPUT = "past_key_values"
CACHE_OUTPUT = "present"
BEAM_INPUT = "beam_idx"
LOGITS = "logits"
# The CPU plugin's bound on the weights of a FullyConnected it may run as a 1x1 convolution (linear_inputs_as_4d).
_CONVOLUTION_WEIGHT_BYTES = 16 << 20


def cache_pairs(model: Any) -> list[tuple[Any, Any]]:
    """``(Parameter, Result)`` of each cache input and the output that holds its next value, by name."""
    results = {name: result for result in model.get_results() for name in result.output(0).get_names()}
    pairs = []
    for parameter in model.get_parameters():
        name = parameter.output(0).get_any_name()
        if name.startswith(f"{CACHE_INPUT}."):
            present = CACHE_OUTPUT + name.removeprefix(CACHE_INPUT)
            if present not in results:
                msg = f"the cache input {name!r} has no output {present!r} that holds its next value"
                raise ValueError(msg)
            pairs.append((parameter, results[present]))
    return pairs


def stateful_model(model: Any, /) -> Any:
    """A copy of ``model`` whose cache inputs and outputs are state, with a ``beam_idx`` input (see the module doc).

    Raises:
        ValueError: ``model`` has no cache input, no ``input_ids``, or a cache input without its output.
    """
    import openvino as ov
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    model = model.clone()
    pairs = cache_pairs(model)
    if not pairs:
        msg = f"the model has no {CACHE_INPUT}.* inputs: only a graph that takes and returns its cache can keep it as state"
        raise ValueError(msg)
    ids = next((p for p in model.get_parameters() if "input_ids" in p.output(0).get_names()), None)
    if ids is None:
        msg = "the model has no input_ids input: the state's batch size is read from it"
        raise ValueError(msg)
    beam = ops.parameter([-1], ov.Type.i32, name=BEAM_INPUT)
    beam.output(0).set_names({BEAM_INPUT})
    zero = ops.constant(0, ov.Type.i64)
    for parameter, _ in pairs:
        readers = list(parameter.output(0).get_target_inputs())
        reordered = ops.gather(parameter, beam, zero)  # the cache's batch axis is 0
        for reader in readers:
            reader.replace_source_output(reordered.output(0))
    model.add_parameters([beam])
    apply_make_stateful_transformation(model, pairs)
    batch = ops.gather(ops.shape_of(ids, output_type="i64"), ops.constant([0], ov.Type.i64), zero)
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            shape = op.get_output_partial_shape(0)
            # An empty cache: the request's batch, the static head and feature sizes, a past of its minimum (0).
            sizes = [batch, *(ops.constant([shape[i].get_min_length()], ov.Type.i64) for i in range(1, shape.rank.get_length()))]
            op.set_arguments([ops.broadcast(ops.constant(0.0, op.get_output_element_type(0)), ops.concat(sizes, 0))])
    last_position_only(model)
    last_position_logits(model)
    linear_inputs_as_4d(model)
    model.validate_nodes_and_infer_types()
    return model


def last_position_only(model: Any, /) -> bool:
    """Replace ``model``'s ``logits_to_keep`` input (the positions whose logits a multi-token decode returns) by
    the last position, in place; whether it had one.

    A stateful model only generates, and OpenVINO GenAI feeds no such input.
    """
    import numpy as np
    from openvino import opset13 as ops

    kept = next((p for p in model.get_parameters() if KEPT_INPUT in p.output(0).get_names()), None)
    if kept is None:
        return False
    last = ops.constant(np.array([-1], dtype=kept.get_element_type().to_dtype()))
    for reader in list(kept.output(0).get_target_inputs()):
        reader.replace_source_output(last.output(0))
    model.remove_parameter(kept)
    return True


# Ops between the lm_head and the logits that act on each position alone (a soft cap: divide, tanh, multiply).
_POSITIONWISE = frozenset({"Add", "Subtract", "Multiply", "Divide", "Tanh", "Convert"})


def _logits_result(model: Any) -> Any | None:
    """The result named ``logits`` (the name ``stateful_io`` gives the same output), or ``None``."""
    return next((result for result in model.get_results() if LOGITS in result.output(0).get_names()), None)


def _logits_matmul(model: Any) -> Any | None:
    """The matmul that makes the ``logits`` output (through position-wise ops after it), or ``None``."""
    result = _logits_result(model)
    node = None if result is None else result.input_value(0).get_node()
    while node is not None and node.get_type_name() in _POSITIONWISE:
        computed = [value for value in node.input_values() if value.get_node().get_type_name() != "Constant"]
        node = computed[0].get_node() if len(computed) == 1 else None
    return node if node is not None and node.get_type_name() == "MatMul" else None


def last_position_logits(model: Any, /) -> bool:
    """Make ``model``'s lm_head read only the last position, in place: a 3-D ``logits`` becomes ``[batch, 1,
    vocab]``; whether the lm_head was found (if not, the output itself is sliced).

    A stateful model only generates: every caller reads the last position's logits (``hfx.generate``,
    transformers' ``generate`` through ``hfx.as_model``, which refuses assisted decoding on it, and
    OpenVINO GenAI, which slices the same input itself). The prompt's other positions cost the lm_head's
    compute (a fifth of a SmolLM-135M-shaped prompt's) and their logits' memory (128 x 49152 floats a
    row, held by the plugin and the output).
    """
    import numpy as np
    from openvino import opset13 as ops

    def sliced(port: Any) -> None:
        # a gather of index [-1] on the position axis: a length of 1 that shape inference knows (a slice's is "..1")
        index, axis = ops.constant(np.array([-1], dtype=np.int64)), ops.constant(np.int64(1))
        last = ops.gather(port.get_source_output(), index, axis)
        port.replace_source_output(last.output(0))

    matmul = _logits_matmul(model)
    if matmul is not None and matmul.input_value(0).get_partial_shape().rank.get_length() == 3:
        sliced(matmul.input(0))
        return True
    result = _logits_result(model)
    if result is not None and result.get_output_partial_shape(0).rank.get_length() == 3:
        sliced(result.input(0))
    return False


def linear_inputs_as_4d(model: Any, /) -> int:
    """Give each linear layer of ``model`` under 16 MiB of weights a 4-D input (``unsqueeze(0)`` before the
    ``MatMul``, ``squeeze(0)`` after), in place; return how many.

    Workaround (OpenVINO 2026.4.1's CPU plugin, ``fullyconnected_implementations.cpp``): on a CPU with
    AVX-512 a FullyConnected over a 2-D or 3-D input whose weights are under 16 MiB runs as a brgemm 1x1
    convolution when it gets 2 to 3136 rows and as oneDNN's inner product for one row, and each packs
    its own copy of the weights. A stateful model serves the prompt (many rows) and every step (one row),
    so it held two copies of most weights (a SmolLM-135M-shaped decoder: 2.11x the weight bytes while
    generating, 1.71x with this). Over a 4-D input the convolution declines ("one_of(srcRank, 2, 3)")
    and the inner product, with one weight layout, serves every row count, as it does on a CPU without
    AVX-512 whatever the rank. The weights of a larger layer (a vocabulary's ``lm_head``) are left alone, as is the
    matmul that makes an output (OpenVINO GenAI slices the logits' input there). Delete when the plugin
    keeps one layout per weight.
    """
    import numpy as np
    from openvino import opset13 as ops

    outputs = {result.input_value(0).get_node().get_friendly_name() for result in model.get_results()}
    head = _logits_matmul(model)
    outputs |= set() if head is None else {head.get_friendly_name()}
    wrapped = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or op.get_friendly_name() in outputs:
            continue
        rows, weights = op.input_value(0), op.input_value(1)
        constant = weights.get_node()
        if rows.get_partial_shape().rank.get_length() != 3 or constant.get_type_name() != "Constant":
            continue
        if constant.get_byte_size() >= _CONVOLUTION_WEIGHT_BYTES:
            continue
        readers = list(op.output(0).get_target_inputs())
        axis = ops.constant(np.array([0], dtype=np.int64))
        matmul = ops.matmul(ops.unsqueeze(rows, axis), weights, op.get_transpose_a(), op.get_transpose_b())
        matmul.set_friendly_name(op.get_friendly_name())
        squeezed = ops.squeeze(matmul, axis)
        for reader in readers:
            reader.replace_source_output(squeezed.output(0))
        wrapped += 1
    return wrapped


def _last_position(spec: Any) -> Any:
    """``spec`` with one position: ``[batch, sequence, vocab]`` -> ``[batch, 1, vocab]``."""
    return attrs.evolve(spec, shape=(spec.shape[0], 1, *spec.shape[2:]))


def stateful_io(io: Any, /) -> Any:
    """The calling contract of ``stateful_model``'s model: no cache in or out, a ``beam_idx`` of ``batch`` int32 last.

    Raises:
        ValueError: ``io`` takes no ``past_key_values`` cache, or writes a static cache in place.
    """
    import torch
    from torch.utils import _pytree as pytree

    from hfx._contract import in_spec_without, io_without_positions, load_spec
    from hfx._pytree import spec_caches
    from hfx._records import TensorSpec
    from hfx._upstream import graph_name

    cached = [spec.name for spec in io.inputs if spec.name.startswith(f"{CACHE_INPUT}.")]
    if not cached or io.updates:
        what = "takes no past_key_values cache" if not cached else f"writes {list(io.updates)} in place (a static cache)"
        msg = f"the graph {what}: only one that takes a dynamic cache and returns it can keep it as state"
        raise ValueError(msg)
    io = io_without_positions(io)  # the last position's logits only (last_position_only, last_position_logits)
    in_spec = in_spec_without(io, lambda key: graph_name(key) == CACHE_INPUT, {BEAM_INPUT: torch.zeros(1, dtype=torch.int32)})
    with spec_caches(io):
        returned = load_spec(io.out_spec)
        outputs = pytree.tree_unflatten([torch.zeros(1)] * returned.num_leaves, returned)
        kept = type(outputs)(**{key: value for key, value in outputs.items() if graph_name(key) != CACHE_INPUT})
        out_spec = pytree.treespec_dumps(pytree.tree_structure(kept))
    inputs = [spec for spec in io.inputs if spec.name not in cached]
    ids = next(spec for spec in io.inputs if spec.name == "input_ids")
    beam = TensorSpec(name=BEAM_INPUT, dtype="int32", shape=ids.shape[:1])  # one row index per batch row
    present = {CACHE_OUTPUT + name.removeprefix(CACHE_INPUT) for name in cached}
    # the last position's logits only (last_position_logits)
    outputs_kept = [_last_position(spec) if spec.name == LOGITS and len(spec.shape) == 3 else spec
                    for spec in io.outputs if spec.name not in present]
    return attrs.evolve(io, inputs=(*inputs, beam), outputs=outputs_kept, in_spec=in_spec, out_spec=out_spec)
