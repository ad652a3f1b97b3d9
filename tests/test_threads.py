"""Exports in several threads at once: each gets a correct program, and nothing is left patched.

torch.export and hfx's process-wide patches are not re-entrant (two exports at once failed with
"ProxyTorchDispatchMode slot already occupied"); hfx runs the stages that trace or patch one at a time
(``hfx._serial``), while calling programs stays concurrent.
"""

from __future__ import annotations

import concurrent.futures
import sys

import pytest
import torch
import transformers
from toolz import pipe
from torch.utils import _pytree as pytree

import hfx
from hfx import zoo
from tests.helpers import assert_same_state, new_inputs, state_of
from tests.tolerances import FP32_PARITY

_THREADS, _EXPORTS = 4, 2


def _globals(model: torch.nn.Module) -> dict[str, dict[str, object]]:
    """The namespaces hfx's patches write, by identity of their values: torch's, transformers' and the model's."""
    owners = {"torch": torch, "torch.nn.functional": torch.nn.functional, "pytree.SUPPORTED_NODES": None,
              "transformers.cache_utils": transformers.cache_utils, type(model).__name__: type(model)}
    owners.update({f"module {name}": module for name, module in model.named_modules()})
    owners.update({cls.__name__: cls for cls in vars(transformers.cache_utils).values() if isinstance(cls, type)})
    owners.update({name: module for name, module in sys.modules.items() if name.startswith("transformers.models.llama")})
    found = {}
    for name, owner in owners.items():
        items = pytree.SUPPORTED_NODES if owner is None else vars(owner)
        found[name] = {key: id(value) for key, value in dict(items).items()}
    return found


def _export_twice(model: torch.nn.Module, batch: int) -> list[tuple[torch.nn.Module, dict, object]]:
    """Two exports from one thread: the Llama at its own capture shape (an Exported), and a Linear piped to ONNX
    (torch.onnx traces as torch.export does); each with its model and inputs of a new shape to check it on."""
    exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=batch, sequence=5 + batch)), hfx.export)
    linear = torch.nn.Linear(3, batch)
    onnx = pipe(linear, hfx.capture({"input": torch.randn(2, 3)}), hfx.lower_to_onnx)
    return [(model, new_inputs("llama"), exported), (linear, {"input": torch.randn(5, 3)}, onnx)]


def test_exports_in_four_threads_each_get_a_correct_program_and_leave_nothing_patched(models):
    pytest.importorskip("onnxruntime")
    model = models("llama")
    before, state = _globals(model), state_of(model)
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        programs = [p for ps in pool.map(lambda b: _export_twice(model, b), range(1, _THREADS + 1)) for p in ps]
    assert len(programs) == _THREADS * _EXPORTS
    # Calling the programs concurrently gives each the eager numbers on a new shape.
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        reports = list(pool.map(lambda checked: hfx.verify(*checked), programs))
    assert all(report.passed and report.max_abs <= FP32_PARITY for report in reports), [str(r) for r in reports]
    assert _globals(model) == before
    assert_same_state(model, state)


def test_a_cache_registration_outlives_a_thread_that_leaves_first():
    import threading

    from hfx._pytree import registered_caches

    inside, leave = threading.Event(), threading.Event()
    cls = transformers.DynamicCache

    def hold():
        with registered_caches([cls]):
            inside.set()
            leave.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    inside.wait()
    with registered_caches([cls]):
        leave.set()
        thread.join()  # the other block has ended: the class stays registered for this one
        assert cls in pytree.SUPPORTED_NODES
    assert cls not in pytree.SUPPORTED_NODES
