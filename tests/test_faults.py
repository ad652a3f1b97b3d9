"""A failure inside every stage and inside each runtime's lowering leaves nothing of the user's, nor of the process,
changed: every owner an hfx patch swaps (compared by identity over ``vars()``, the slots of
``tests/patches/test_contract.py``'s table), torch's pytree registry, the model's parameters, buffers, attributes
and eager outputs, and the caller's inputs.

Each fault is raised by the upstream call the stage makes while its patches are entered (``torch.export.export``
under ``default_patches``, ExecuTorch's lowering under ``PTE_PATCHES`` ...), the place where a failure would leave
the most behind. tests/patches/test_contract.py checks each patch's own enter and exit failures.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch
from torch.utils import _pytree as pytree

import hfx
from hfx import zoo
from tests.helpers import assert_same_state, one_layer, state_of
from tests.patches.test_contract import changed_slots, every_slot, read_slots


class InjectedFault(RuntimeError):
    """The failure each case raises inside a stage."""


def _exported(model):
    return hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama"), model)))["decode"]


def _on_the_export(stage):
    """``make(model, inputs) -> call``: the model's decode step exported (before the fault), then ``stage`` on it."""
    return lambda model, inputs: (lambda exported: lambda: stage(exported))(_exported(model))


def _on_the_program(lower, quantize):
    """``make(model, inputs) -> call``: exported and lowered with ``lower`` (before the fault), then ``quantize``."""
    return lambda model, inputs: (lambda program: lambda: quantize(program))(lower(_exported(model)))


# stage -> (package it needs, module or class, attribute that raises, make(model, inputs) -> the call that meets it).
FAULTS = {
    "capture": (None, "hfx._capture.capture", "check_inputs", lambda model, inputs: lambda: hfx.capture(inputs, model)),
    "decompose": (None, "transformers.generation.utils.GenerationMixin", "generate",
                  lambda model, inputs: lambda: hfx.decompose(hfx.capture(inputs, model))),
    "export": (None, "torch.export", "export", lambda model, inputs: lambda: hfx.export(hfx.capture(inputs, model))),
    "lower_to_aoti": (None, "torch._inductor", "aoti_compile_and_package", _on_the_export(hfx.lower_to_aoti)),
    "lower_to_onnx": ("onnxruntime", "torch.onnx", "export", _on_the_export(hfx.lower_to_onnx)),
    "lower_to_pte": ("executorch", "executorch.exir", "to_edge_transform_and_lower", _on_the_export(hfx.lower_to_pte)),
    "lower_to_ov": ("openvino", "openvino", "convert_model", _on_the_export(hfx.lower_to_ov)),
    "quantize_pt2e": ("executorch", "torchao.quantization.pt2e.quantize_pt2e", "prepare_pt2e",
                      _on_the_export(hfx.quantize_pt2e(scheme="8da8w"))),
    "quantize_onnx": ("onnxruntime", "onnxruntime.quantization", "quantize_dynamic",
                      _on_the_program(hfx.lower_to_onnx, hfx.quantize_onnx(mode="dynamic"))),
    "quantize_ov": ("openvino", "nncf", "compress_weights", _on_the_program(hfx.lower_to_ov, hfx.quantize_ov(mode="int8"))),
}


def _owner(path: str):
    """The object ``path`` names: a module, or a class inside one (``package.module.Class``)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _raise(*args, **kwargs):
    raise InjectedFault("injected fault")


def _mentions_the_fault(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, InjectedFault) or "injected fault" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.mark.parametrize("stage", list(FAULTS))
def test_a_failure_inside_the_stage_leaves_everything_as_it_was(stage, models, monkeypatch):
    package, where, attribute, make = FAULTS[stage]
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    model = one_layer("llama").train()  # train mode: the stages switch to eval inside, and must switch back
    inputs = zoo.inputs("llama", batch=2, sequence=7)
    probe = zoo.inputs("llama", batch=1, sequence=5)
    with torch.no_grad():
        eager = model.eval()(**probe).logits
    model.train()
    call = make(model, inputs)  # what the stage starts from is made first, as by the pipe's earlier steps
    slots = every_slot(models)
    held = read_slots(slots)
    registry = dict(pytree.SUPPORTED_NODES)
    state, attributes = state_of(model), dict(vars(model))
    given = {key: value.clone() for key, value in inputs.items()}
    monkeypatch.setattr(_owner(where), attribute, _raise)

    with pytest.raises(Exception) as caught:  # noqa: PT011 - each stage wraps the fault in its own error
        call()
    monkeypatch.undo()

    assert _mentions_the_fault(caught.value), f"{stage} raised something else: {caught.value!r}"
    assert not changed_slots(slots, held), f"{stage} left patched: {changed_slots(slots, held)}"
    assert dict(pytree.SUPPORTED_NODES).keys() == registry.keys()
    assert all(pytree.SUPPORTED_NODES[key] is value for key, value in registry.items())
    assert_same_state(model, state)
    assert vars(model).keys() == attributes.keys() and all(vars(model)[k] is v for k, v in attributes.items())
    assert model.training and all(module.training for module in model.modules())
    assert all(torch.equal(inputs[key], value) for key, value in given.items()) and inputs.keys() == given.keys()
    with torch.no_grad():
        assert torch.equal(model.eval()(**probe).logits, eager)
