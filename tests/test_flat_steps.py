"""The decode loop's flat path: a program's ``flat_call`` and ``DecodeSteps``, against the program's own call.

The programs are the one-layer zoo Llama's decode, exported and lowered to each runtime. The flat path must give
the public call's logits and cache exactly, step after step, with the cache carried in the runtime's own form.
"""

from __future__ import annotations

import inspect
import sys

import attrs
import pytest
import torch
import transformers
from torch.utils import _pytree as pytree

import hfx
from hfx import zoo
from hfx._capture.positions import text_positions
from hfx._contract import FlatCall, flat_inputs
from hfx._flat_steps import CHECKED_STEPS, DecodeSteps, _as_input, flat_step, step_plan, steps_within_bounds
from hfx._kept_positions import last_position
from hfx._pytree import spec_caches
from hfx._upstream import cache_argument, output_cache

LOWERINGS = {"pt2": (None, None), "onnx": ("onnxruntime", "lower_to_onnx"), "ov": ("openvino", "lower_to_ov"),
             "pte": ("executorch", "lower_to_pte")}
STEPS = 5
# The model's cache argument: ``past_key_values``, ``cache`` from transformers 5.24 on.
CACHE = cache_argument(inspect.signature(transformers.LlamaForCausalLM.forward).parameters)


@pytest.fixture(scope="module")
def decode_of(generative_one_layer):
    """``decode_of(runtime) -> (model, the decode program on that runtime)``, lowered once per module."""
    cache = {}

    def get(runtime: str):
        model, parts = generative_one_layer("llama")
        module, lowering = LOWERINGS[runtime]
        if module is not None:
            pytest.importorskip(module)
        if runtime not in cache:
            cache[runtime] = parts["decode"] if lowering is None else getattr(hfx, lowering)(parts["decode"])
        return model, cache[runtime]

    return get


def _prompt_and_cache(model, batch: int = 2, sequence: int = 6):
    """A left-padded prompt, its eager cache and the first new tokens."""
    prompt = zoo.inputs("llama", batch=batch, sequence=sequence)
    prompt["attention_mask"][0, :2] = 0
    with torch.no_grad():
        out = model(**prompt, use_cache=True)
    return prompt["attention_mask"], output_cache(out), out.logits[:, -1:].argmax(-1)


def _step_state(mask: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": tokens, "attention_mask": mask, "position_ids": text_positions(mask)[:, -1:],
            "logits_to_keep": last_position(tokens)}


def test_the_plan_feeds_the_new_tensors_and_carries_the_cache_into_itself(decode_of):
    _, decode = decode_of("pt2")
    plan = step_plan(decode.io)
    names, outputs = decode.io.input_names, decode.io.output_names
    assert [key for key, _, _ in plan.fed] == ["input_ids", "position_ids", "attention_mask", "logits_to_keep"]
    assert [(names[i], outputs[o]) for i, o in plan.carried] == [
        ("past_key_values.layers.0.keys", "present.layers.0.keys"),  # hfx's input names on every release
        ("past_key_values.layers.0.values", "present.layers.0.values")]
    assert outputs[plan.logits] == "logits" and plan.cache[0] == CACHE
    assert plan.dtypes == tuple(getattr(torch, spec.dtype) for spec in decode.io.inputs)


def test_the_plan_refuses_outputs_that_cannot_be_the_next_inputs(decode_of):
    _, decode = decode_of("pt2")
    io = decode.io
    halved = attrs.evolve(io, outputs=[attrs.evolve(spec, dtype="float16") if spec.name.startswith("present") else spec
                                       for spec in io.outputs])
    assert step_plan(halved) is None
    narrower = attrs.evolve(io, outputs=[attrs.evolve(spec, shape=(*spec.shape[:-1], 8)) if spec.name.startswith("present")
                                         else spec for spec in io.outputs])
    assert step_plan(narrower) is None
    assert step_plan(io) is not None  # the record is unchanged


def test_steps_within_bounds_counts_the_steps_before_a_growing_dim_passes_its_bound():
    bounds = {"past": (0, 20), "total": (1, 21), "batch": (1, None), "free": (0, None)}
    first, second = {"past": 10, "total": 11, "batch": 2, "free": 3}, {"past": 11, "total": 12, "batch": 2, "free": 5}
    assert steps_within_bounds(bounds, first, second) == 9
    assert steps_within_bounds({}, first, second) == sys.maxsize
    assert steps_within_bounds(bounds, second, first) == 0  # a dim that shrinks: the steps are not alike
    assert steps_within_bounds(bounds, first, {"past": 11}) == 0  # other dims: not the same program's steps


@pytest.mark.parametrize("runtime", LOWERINGS)
def test_the_flat_call_is_the_program_on_its_flat_inputs(decode_of, runtime):
    model, decode = decode_of(runtime)
    mask, cache, tokens = _prompt_and_cache(model)
    kwargs = {**_step_state(torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], -1), tokens), CACHE: cache}
    call = decode.flat_call()
    assert isinstance(call, FlatCall) and call.io is decode.io
    with spec_caches(decode.io):
        flat = flat_inputs(decode.io, kwargs, program="test")
        outputs = call.run([call.to_runtime(tensor) for tensor in flat])
        want = pytree.tree_leaves(decode(**kwargs))
    assert len(outputs) == len(decode.io.outputs) == len(want)
    for spec, output, expected in zip(decode.io.outputs, outputs, want, strict=True):
        got = call.to_torch(output)
        assert str(got.dtype).removeprefix("torch.") == spec.dtype
        assert torch.equal(got, expected), spec.name


@pytest.mark.parametrize("runtime", LOWERINGS)
def test_flat_steps_give_the_public_calls_logits_and_cache(decode_of, runtime):
    model, decode = decode_of(runtime)
    mask, cache, tokens = _prompt_and_cache(model)
    plan, call = step_plan(decode.io), decode.flat_call()
    with spec_caches(decode.io):
        carried = [call.to_runtime(_as_input(leaf, plan.dtypes[i]))
                   for leaf, (i, _) in zip(pytree.tree_leaves(cache), plan.carried, strict=True)]
        public, converted = cache, {}
        for _ in range(STEPS):  # the cache grows: each step's carried values are the runtime's outputs of the one before
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], -1)
            state = _step_state(mask, tokens)
            logits, carried = flat_step(plan, call, state, carried, converted)
            outputs = decode(**state, **{CACHE: public})
            assert torch.equal(logits, outputs.logits)
            public, tokens = output_cache(outputs), logits[:, -1:].argmax(-1)
        for value, want in zip(carried, pytree.tree_leaves(public), strict=True):
            assert torch.equal(call.to_torch(value), want)


class _Counted:
    """A program's call that counts its checked calls and has no flat call."""

    def __init__(self, program):
        self.program, self.calls = program, 0

    def __call__(self, **kwargs):
        self.calls += 1
        return self.program(**kwargs)


def _drive(steps: DecodeSteps, model, count: int) -> list[torch.Tensor]:
    """Run ``count`` decode steps of ``steps`` after an eager prompt; each step's logits."""
    mask, cache, tokens = _prompt_and_cache(model)
    state, logits = {CACHE: cache}, []
    for _ in range(count):
        mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], -1)
        state.update(_step_state(mask, tokens))
        logits.append(steps(state))
        tokens = logits[-1][:, -1:].argmax(-1)
    return logits


def test_decode_steps_check_the_first_steps_then_go_flat_with_the_same_logits(decode_of):
    model, decode = decode_of("pt2")
    counted = _Counted(decode)
    checked = DecodeSteps(decode, counted, cache_key=CACHE)  # no flat_call on the wrapper: never flat
    with spec_caches(decode.io):
        want = _drive(checked, model, 6)
        assert counted.calls == 6
        steps = DecodeSteps(decode, decode, cache_key=CACHE)
        flags = []
        original = steps.run
        steps.run = lambda **kwargs: flags.append(steps.is_flat) or original(**kwargs)
        got = _drive(steps, model, 6)
    assert flags == [False] * CHECKED_STEPS  # only the checked calls reach the program's own call
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_decode_steps_past_the_bounds_raise_the_programs_own_error(generative_one_layer):
    from hfx._records import Exported

    model, parts = generative_one_layer("llama")
    decode = parts["decode"]
    # The prompt (6) and 5 steps fit 11 positions; the sixth step's mask is 12 long.
    io = attrs.evolve(decode.io, bounds={**decode.io.bounds, "total_sequence": (1, 11)})
    bounded = Exported(program=decode.program, io=io, dynamic_shapes=decode.dynamic_shapes, name="decode")
    steps = DecodeSteps(bounded, bounded, cache_key=CACHE)
    with spec_caches(io), pytest.raises(hfx.InputError, match=r"Exported\(decode\): axis 1 of input 'attention_mask' "
                                                               r"\(total_sequence\) is 12, outside the program's bounds"):
        _drive(steps, model, 6)
    with spec_caches(io):
        assert len(_drive(DecodeSteps(bounded, bounded, cache_key=CACHE), model, 5)) == 5


def test_generate_runs_its_decode_steps_flat(generative_one_layer, monkeypatch):
    model, parts = generative_one_layer("llama")
    flat = []
    original = DecodeSteps.__call__
    monkeypatch.setattr(DecodeSteps, "__call__", lambda self, state: flat.append(self.is_flat) or original(self, state))
    inputs = zoo.inputs("llama", batch=2, sequence=7)
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    assert torch.equal(hfx.generate(inputs, parts, max_new_tokens=10), want)
    assert flat == [False] * CHECKED_STEPS + [True] * (9 - CHECKED_STEPS)  # the prompt's step is not a decode step
