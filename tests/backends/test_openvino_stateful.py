"""``lower_to_ov(stateful=True)``: the KV cache stays inside OpenVINO, one graph serves the prompt and every step."""

from __future__ import annotations

import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.tolerances import FP32_ONE_BLOCK

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def llama():
    return zoo.build("llama")


@pytest.fixture(scope="module")
def parts(llama):
    return pipe(llama, hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=True))


@pytest.fixture(scope="module")
def stateful(parts):
    return hfx.lower_to_ov(parts["decode"], stateful=True)


def _prompt(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    prompt = zoo.inputs("llama", batch=batch, sequence=sequence)
    prompt["attention_mask"][0, :2] = 0  # a left-padded row
    return prompt


def test_the_program_takes_no_cache_and_names_the_state(stateful):
    assert stateful.state == tuple(f"past_key_values.layers.{i}.{kind}" for i in range(2) for kind in ("keys", "values"))
    assert stateful.io.input_names == ("input_ids", "position_ids", "attention_mask", "beam_idx")
    assert stateful.io.output_names == ("logits",)
    assert stateful.io.outputs[0].shape[:2] == ("batch", 1)  # the last position's: what generation reads
    assert len(stateful.model.get_sinks()) == 4


def test_generate_gives_the_eager_tokens_at_a_new_batch_and_length(llama, parts, stateful):
    prompt = _prompt(3, 5)
    programs = hfx.Components(items={"decode": stateful}, meta=parts.meta)
    want = llama.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(hfx.generate(prompt, programs, max_new_tokens=6), want)


def test_a_call_starts_from_an_empty_cache_and_a_session_keeps_it(parts, stateful):
    stateless = hfx.lower_to_ov(parts["decode"])
    prompt = _prompt(2, 6)
    positions = (prompt["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    feed = {**prompt, "position_ids": positions}
    rows = torch.arange(2, dtype=torch.int32)
    empty = hfx._generate.initial_cache(stateless, 2, "past_key_values")  # noqa: SLF001
    want = stateless(**feed, past_key_values=empty)
    for _ in range(2):  # twice: each plain call starts again; the last position's logits only
        got = stateful(**feed, beam_idx=rows).logits
        torch.testing.assert_close(got, want.logits[:, -1:], atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)
    session = stateful.session()
    session(**feed, beam_idx=rows)
    token = want.logits[:, -1].argmax(-1, keepdim=True)
    step = {"input_ids": token, "attention_mask": torch.cat([prompt["attention_mask"], torch.ones(2, 1, dtype=torch.long)], -1),
            "position_ids": positions[:, -1:] + 1}
    expected = stateless(**step, past_key_values=want.past_key_values).logits
    torch.testing.assert_close(session(**step, beam_idx=rows).logits, expected, atol=FP32_ONE_BLOCK, rtol=FP32_ONE_BLOCK)


def test_a_saved_stateful_program_loads_and_generates_the_same_tokens(parts, stateful, tmp_path):
    programs = hfx.Components(items={"decode": stateful}, meta=parts.meta)
    loaded = hfx.load(hfx.save(tmp_path / "stateful", programs))
    assert loaded["decode"].state == stateful.state
    prompt = _prompt(2, 4)
    assert torch.equal(hfx.generate(prompt, loaded, max_new_tokens=5), hfx.generate(prompt, programs, max_new_tokens=5))


def test_stateful_needs_a_graph_that_takes_its_cache():
    bert = pipe(zoo.build("bert"), hfx.capture(zoo.inputs("bert")), hfx.export)
    with pytest.raises(ValueError, match=r"lower_to_ov\(stateful=True\) on component 'model'.*multi_token_decode=True"):
        hfx.lower_to_ov(bert, stateful=True)


def test_generate_refuses_a_prefill_before_a_stateful_decode(llama, stateful):
    split = pipe(llama, hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=False))
    with pytest.raises(ValueError, match="no past_key_values cache|takes no"):
        hfx.lower_to_ov(split["prefill"], stateful=True)  # refused from its contract, before the conversion
    # The prefill stays an Exported (torch): the refusal is about the stateful decode after it.
    programs = hfx.Components(items={"prefill": hfx.export(split["prefill"]), "decode": stateful}, meta=split.meta)
    with pytest.raises(ValueError, match="multi_token_decode=True"):
        hfx.generate(_prompt(2, 5), programs, max_new_tokens=2)


def test_as_model_drives_the_stateful_program_greedy_and_with_beams(llama, parts, stateful):
    # transformers' generate over the cache kept inside OpenVINO: each call of the view's forward is one call of
    # the program's session; beam search's reorder reaches the program as beam_idx.
    view = hfx.as_model(hfx.Components(items={"decode": stateful}, meta=parts.meta))
    prompt = _prompt(3, 5)
    with torch.no_grad():
        for settings in ({"max_new_tokens": 6}, {"max_new_tokens": 8, "num_beams": 3}):
            want = llama.generate(**prompt, do_sample=False, **settings)
            assert torch.equal(view.generate(**prompt, do_sample=False, **settings), want)


def test_as_model_refuses_to_crop_the_stateful_cache(llama, parts, stateful):
    view = hfx.as_model(hfx.Components(items={"decode": stateful}, meta=parts.meta))
    prompt = _prompt(1, 5)
    for drafts in ({"assistant_model": llama}, {"prompt_lookup_num_tokens": 2}):
        with pytest.raises(ValueError, match=r"cannot be cropped.*stateful=False"), torch.no_grad():
            view.generate(**prompt, max_new_tokens=4, do_sample=False, **drafts)


def _matmul_input_ranks(model) -> list[int]:
    """The rank of the rows each matmul over constant weights takes, in graph order."""
    return [op.input_value(0).get_partial_shape().rank.get_length() for op in model.get_ordered_ops()
            if op.get_type_name() == "MatMul" and op.input_value(1).get_node().get_type_name() == "Constant"]


def test_each_layer_takes_4d_rows_so_the_cpu_keeps_one_weight_layout(parts, stateful):
    # 2 layers x (q, k, v, o, gate, up, down) over 4-D rows; the lm_head that makes the logits keeps its 3-D rows
    assert _matmul_input_ranks(stateful.model) == [4] * 14 + [3]
    assert _matmul_input_ranks(hfx.lower_to_ov(parts["decode"]).model) == [3] * 15  # a stateless graph is left alone


def test_linear_inputs_as_4d_leaves_large_weights_and_outputs_alone():
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    from hfx.backends._openvino_stateful import linear_inputs_as_4d

    rows = ops.parameter([-1, -1, 8], ov.Type.f32, name="rows")
    hidden = ops.matmul(rows, ops.constant(np.ones((8, 8), np.float32)), False, True)
    large = ops.matmul(hidden, ops.constant(np.ones((1 << 19, 8), np.float32)), False, True)  # 16 MiB of weights
    small_out = ops.matmul(hidden, ops.constant(np.ones((4, 8), np.float32)), False, True)  # makes an output
    model = ov.Model([ops.reduce_sum(large, ops.constant(np.array([2])), False), small_out], [rows])
    assert linear_inputs_as_4d(model) == 1
    model.validate_nodes_and_infer_types()
    assert _matmul_input_ranks(model) == [4, 3, 3]
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled({"rows": np.ones((2, 3, 8), np.float32)})
    np.testing.assert_allclose(got[compiled.outputs[1]], np.full((2, 3, 4), 64.0))


def test_the_lm_head_reads_the_last_position_only(stateful):
    (result,) = stateful.model.get_results()
    head = result.input_value(0).get_node()
    assert head.get_type_name() == "MatMul" and head.input_value(0).get_node().get_type_name() == "Gather"
    assert result.get_output_partial_shape(0)[1].get_length() == 1


def test_last_position_logits_slices_under_a_soft_cap_or_else_the_output():
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    from hfx.backends._openvino_stateful import last_position_logits

    def model(capped: bool, through_matmul: bool = True) -> ov.Model:
        rows = ops.parameter([-1, -1, 4], ov.Type.f32, name="rows")
        logits = ops.matmul(rows, ops.constant(np.eye(4, dtype=np.float32)), False, True) if through_matmul else rows
        if capped:  # Gemma 2's final soft cap: tanh(x / 30) * 30
            thirty = ops.constant(np.float32(30))
            logits = ops.multiply(ops.tanh(ops.divide(logits, thirty)), thirty)
        logits.output(0).set_names({"logits"})
        return ov.Model([logits], [rows])

    rows = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for capped, through_matmul, found in ((False, True, True), (True, True, True), (False, False, False)):
        graph = model(capped, through_matmul)
        assert last_position_logits(graph) is found
        graph.validate_nodes_and_infer_types()
        got = ov.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({0: rows})[0]
        want = np.tanh(rows / 30) * 30 if capped else rows
        np.testing.assert_allclose(got, want[:, -1:], rtol=1e-6)
