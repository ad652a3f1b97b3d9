"""torch's pytree registry holds the same entries after every stage as before it, whether the stage succeeds or fails.

hfx registers the cache classes as pytree nodes only while a stage needs them (``hfx._pytree``). Each test runs
one stage on the tiny zoo Llama (its decode step takes and returns a ``DynamicCache``; the .pte lowering runs on
a one-layer attention over a ``DynamicCache``, seconds instead of half a minute), or makes it fail
where the caches are registered (a bad input, a patch raising, an inner function raising), and compares every
registry table of ``torch.utils._pytree`` with a snapshot by identity of the entries. The backends are imported
and the model is built first: their import registers classes of its own (transformers' ``ModelOutput``s,
torchao's constants), and that is not a stage's doing.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch
import transformers
from torch.utils import _pytree as pytree

import hfx
from hfx import zoo
from hfx.patches import default_patches
from tests.helpers import CAPTURE_SHAPE

# Every registry of torch 2.13's torch/utils/_pytree.py: node definitions, serialisation both ways, constants,
# the registrations queued for the C++ pytree, and the treespec serialisation protocols.
_TABLES = ("SUPPORTED_NODES", "SUPPORTED_SERIALIZED_TYPES", "SERIALIZED_TYPE_TO_PYTHON_TYPE", "CONSTANT_NODES",
           "_cxx_pytree_pending_imports", "_SUPPORTED_PROTOCOLS")


def _registry() -> dict[str, dict[Any, Any]]:
    """Each table as ``{key: entry}`` (a set's members and a list's items keyed by themselves and their index)."""
    tables = {}
    for name in _TABLES:
        table = getattr(pytree, name)
        if isinstance(table, dict):
            tables[name] = dict(table)
        elif isinstance(table, list):
            tables[name] = dict(enumerate(table))
        else:
            tables[name] = {member: member for member in table}
    return tables


@contextlib.contextmanager
def _registry_kept() -> Iterator[None]:
    """Fail unless every registry table holds, on exit, exactly the entries (the same objects) it held on entry."""
    before = _registry()
    try:
        yield
    finally:
        after = _registry()
        for name, table in before.items():
            now = after[name]
            added = [key for key in now if key not in table]
            removed = [key for key in table if key not in now]
            replaced = [key for key in table if key in now and now[key] is not table[key]]
            assert not (added or removed or replaced), f"{name}: added {added}, removed {removed}, replaced {replaced}"


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Put every table back as it was after each test, so that one stage's leftovers cannot hide the next one's."""
    before = _registry()
    yield
    for name, entries in before.items():
        table = getattr(pytree, name)
        table.clear()
        if isinstance(table, dict):
            table.update(entries)
        elif isinstance(table, list):
            table.extend(entries.values())
        else:
            table.update(entries)


# The lowering stages' runtimes, and the modules they import from them on the first lowering.
_RUNTIMES = {
    "lower_to_onnx": ("onnxruntime", ("onnxscript", "torch.onnx")),
    "lower_to_ov": ("openvino", ("openvino.frontend.pytorch.fx_decoder",)),
    "lower_to_pte": ("executorch", ("executorch.exir", "executorch.runtime",
                                    "executorch.backends.xnnpack.partition.xnnpack_partitioner")),
}


def _warm_up() -> None:
    """Import the installed runtimes as the lowerings do (torchao, which executorch imports, registers constants)."""
    for package, modules in _RUNTIMES.values():
        if importlib.util.find_spec(package) is not None:
            for module in modules:
                importlib.import_module(module)


def _runtime_of(stage: str | None) -> None:
    """Skip unless the runtime ``stage`` lowers to is installed."""
    if stage in _RUNTIMES:
        pytest.importorskip(_RUNTIMES[stage][0])


class _Attend(torch.nn.Module):
    """Attends each query over the keys and values of a cache's first layer: a program that takes a cache."""

    def forward(self, query: torch.Tensor, past_key_values: Any) -> torch.Tensor:
        layer = past_key_values.layers[0]
        return torch.softmax(query @ layer.keys.transpose(-1, -2), dim=-1) @ layer.values


class Llama:
    """The tiny Llama, its generate inputs, its decomposition, the exported parts and their decode inputs."""

    def __init__(self, model: Any, exported: hfx.Components) -> None:
        self.model, self.exported = model, exported
        self.prompt = zoo.inputs("llama", **CAPTURE_SHAPE)
        self.capture = hfx.capture(self.prompt, model)
        self.parts = hfx.decompose(self.capture)

    @functools.cached_property
    def attend(self) -> hfx.Exported:
        """A one-layer attention over a ``DynamicCache``, exported: lowering it to a .pte takes seconds, the zoo
        Llama's decode half a minute, and the registry sees the same cache classes come and go."""
        cache = transformers.DynamicCache()
        cache.update(torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4), 0)
        return hfx.export(hfx.capture({"query": torch.randn(2, 2, 1, 4), "past_key_values": cache}, _Attend()))

    @property
    def decode_inputs(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.parts["decode"].kwargs))


@pytest.fixture(scope="module")
def llama(generative) -> Llama:
    _warm_up()
    return Llama(*generative("llama"))


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory) -> Any:
    return hfx.save(tmp_path_factory.mktemp("saved") / "llama", llama.exported)


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected")


@contextlib.contextmanager
def _raising_patch() -> Iterator[None]:
    raise RuntimeError("injected")
    yield


# stage -> what it runs on ``(llama, saved directory, tmp_path)``
_STAGES: dict[str, Callable[[Llama, Any, Any], Any]] = {
    "capture": lambda ll, saved, tmp: hfx.capture(ll.prompt, ll.model),
    "decompose": lambda ll, saved, tmp: hfx.decompose(ll.capture),
    "export": lambda ll, saved, tmp: hfx.export(ll.parts["decode"]),
    "lower_to_onnx": lambda ll, saved, tmp: hfx.lower_to_onnx(ll.exported["decode"]),
    "lower_to_ov": lambda ll, saved, tmp: hfx.lower_to_ov(ll.exported["decode"]),
    "lower_to_pte": lambda ll, saved, tmp: hfx.lower_to_pte(ll.attend),
    "verify": lambda ll, saved, tmp: hfx.verify(ll.model, ll.decode_inputs, ll.exported["decode"]),
    "generate": lambda ll, saved, tmp: hfx.generate(ll.prompt, ll.exported, max_new_tokens=3),
    "save": lambda ll, saved, tmp: hfx.save(tmp / "saved", ll.exported),
    "load": lambda ll, saved, tmp: hfx.load(saved),
    "call": lambda ll, saved, tmp: ll.exported["decode"](**ll.decode_inputs),
    "call_loaded": lambda ll, saved, tmp: hfx.load(saved)["decode"](**ll.decode_inputs),
}


@pytest.mark.parametrize("stage", list(_STAGES))
def test_the_registry_is_unchanged_after_a_stage(stage, llama, saved, tmp_path):
    _runtime_of(stage)
    with _registry_kept():
        _STAGES[stage](llama, saved, tmp_path)


def _without_position_ids(ll: Llama) -> dict[str, Any]:
    inputs = ll.decode_inputs
    del inputs["position_ids"]
    return inputs


@attrs.frozen(kw_only=True)
class Failure:
    """A stage made to fail where the caches are registered: an inner function raising, or a failing call."""

    id: str
    stage: str | None = None  # the stage of _STAGES it runs, with ``raising`` made to raise
    raising: str | None = None  # the dotted path of the inner function that raises
    run: Callable[[Llama], Any] | None = None  # or a failing call of its own: a bad input, a patch raising
    error: type[BaseException]
    match: str


_FAILURES = (
    Failure(id="capture-bad-input", run=lambda ll: hfx.capture({**ll.prompt, "not_an_input": 1}, ll.model),
            error=hfx.InputError, match="not_an_input"),
    Failure(id="decompose-forward-raising", stage="decompose",
            raising="transformers.models.llama.modeling_llama.LlamaForCausalLM.forward", error=RuntimeError,
            match="injected"),
    Failure(id="export-patch-raising", error=hfx.PatchError, match="injected",
            run=lambda ll: hfx.export(ll.parts["decode"], patches=(*default_patches(ll.model), _raising_patch))),
    Failure(id="export-torch-export-raising", stage="export", raising="torch.export.export", error=hfx.CaptureError,
            match="injected"),
    Failure(id="lower_to_onnx-torch-onnx-raising", stage="lower_to_onnx", raising="torch.onnx.export",
            error=hfx.LoweringError, match="injected"),
    Failure(id="lower_to_ov-convert-raising", stage="lower_to_ov", raising="openvino.convert_model",
            error=hfx.LoweringError, match="injected"),
    Failure(id="lower_to_pte-edge-raising", stage="lower_to_pte",
            raising="executorch.exir.to_edge_transform_and_lower", error=hfx.LoweringError, match="injected"),
    Failure(id="verify-bad-input", error=hfx.InputError, match="position_ids",
            run=lambda ll: hfx.verify(ll.model, _without_position_ids(ll), ll.exported["decode"])),
    Failure(id="generate-bad-input", error=hfx.InputError, match="'input_ids' must be int64",
            run=lambda ll: hfx.generate({**ll.prompt, "input_ids": ll.prompt["input_ids"].float()}, ll.exported)),
    Failure(id="save-torch-save-raising", stage="save", raising="torch.export.save", error=RuntimeError,
            match="injected"),
    Failure(id="load-torch-load-raising", stage="load", raising="torch.export.load", error=ValueError,
            match="could not be read from decode.pt2: RuntimeError: injected"),
    Failure(id="call-bad-input", error=hfx.InputError, match="position_ids",
            run=lambda ll: ll.exported["decode"](**_without_position_ids(ll))),
)


@pytest.mark.parametrize("failure", _FAILURES, ids=lambda failure: failure.id)
def test_the_registry_is_unchanged_after_a_failing_stage(failure, llama, saved, tmp_path, monkeypatch):
    _runtime_of(failure.stage)
    if failure.raising is not None:
        monkeypatch.setattr(failure.raising, _raise)
    with _registry_kept(), pytest.raises(failure.error, match=failure.match):
        if failure.run is not None:
            failure.run(llama)
        else:
            _STAGES[failure.stage](llama, saved, tmp_path)


def test_the_snapshot_sees_a_registration_left_behind():
    class Left:
        pass

    with pytest.raises(AssertionError, match="SUPPORTED_NODES: added"), _registry_kept():
        pytree.register_pytree_node(Left, lambda x: ([], None), lambda values, context: Left())
    pytree._deregister_pytree_node(Left)
