"""Shared, session-scoped models and exports: each expensive export runs once per test session."""

from __future__ import annotations

import contextlib
import gc
import os
import warnings

import _pytest.python
import pytest
import torch

import hfx
from hfx import zoo
from hfx._stack import on_a_reserved_stack
from tests import shared_exports
from tests.helpers import decomposed_by_name, exported_by_name, memoized, one_layer


def pytest_collection_finish(session):
    # torch.export and the lowerings allocate millions of short-lived objects, and each full collection walks every
    # live one: the ~600k of the imported packages and the collected tests are frozen out of those walks, and young
    # collections run every 20k allocations instead of 700 (garbage collection was 9% of a lowering here).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: one thread each, so they do not fight over the cores.
    torch.set_num_threads(1)


_SHARING = pytest.MonkeyPatch()


def pytest_configure(config):
    config.addinivalue_line("markers", "fresh_exports: every export and runtime conversion in the test runs afresh (tests/shared_exports.py)")
    import _pytest.fixtures

    import hfx._export.export as module

    _SHARING.setattr(module, "exported_from_flat", shared_exports.sharing(module.exported_from_flat))
    _share_lowerings()
    _decline_openvino_telemetry()
    # Fixtures and tests run eager models and generate many frames deep too, outside hfx's stages: on a reserved
    # frame stack as the stages do (hfx._stack, python/cpython#142183). pytest's function that calls a fixture.
    if callable(getattr(_pytest.fixtures, "call_fixture_func", None)):
        _SHARING.setattr(_pytest.fixtures, "call_fixture_func", on_a_reserved_stack(_pytest.fixtures.call_fixture_func))


# Conversions kept per worker: a popular graph is converted again far apart in the suite (by the reuse distances
# of one run, 8 kept would share ~70 of its ~200 repeated worker-seconds, 64 ~125); OpenVINO models and ExecuTorch
# bytes are few Python objects for the garbage collector to walk.
LOWERINGS_KEPT = 64


def _share_lowerings():
    """The runtimes' conversions of one ``Exported`` object with the same options run once per worker (the zoo
    Llama's decode graph was converted again by 8 modules each for ONNX and OpenVINO: ~150 worker-seconds); a shared
    export is one object, and ``for_runtime`` of one object one object too. Each caller gets its own copy of what
    it may change: OpenVINO's ``Model`` and the ExecuTorch bounds and counts."""
    import hfx.backends._aoti as aoti
    import hfx.backends._executorch as executorch
    import hfx.backends._onnx as onnx
    import hfx.backends._openvino as openvino

    for_runtime = shared_exports.sharing_by_identity(onnx.for_runtime, kept=LOWERINGS_KEPT)
    for module in (aoti, executorch, onnx, openvino):
        _SHARING.setattr(module, "for_runtime", for_runtime)
    _SHARING.setattr(onnx, "_to_onnx", shared_exports.sharing_by_identity(onnx._to_onnx, kept=LOWERINGS_KEPT))  # noqa: SLF001
    _SHARING.setattr(openvino, "_convert", shared_exports.sharing_by_identity(  # noqa: SLF001
        openvino._convert, copy=lambda model: model.clone(), kept=LOWERINGS_KEPT))  # noqa: SLF001
    _SHARING.setattr(executorch, "_to_pte", shared_exports.sharing_by_identity(  # noqa: SLF001
        executorch._to_pte, skip=("log",), copy=lambda made: (*made[:2], dict(made[2]), dict(made[3])), kept=LOWERINGS_KEPT))  # noqa: SLF001


def _decline_openvino_telemetry():
    """The suite answers OpenVINO's telemetry consent check "declined", as OpenVINO does in a CI job.

    ``openvino.convert_model`` sends several telemetry events per call unless the user opted out
    (``opt_in_out --opt_out``, a file in the home directory), each from a process it forks: forking a worker
    of several GB, and the failed connections in this closed network, were ~9% of the suite's worker time
    (py-spy, 2026-12-06). The suite neither sends nor writes to the home directory.
    """
    try:
        from openvino_telemetry.utils import opt_in_checker as checker
    except ImportError:  # no OpenVINO: nothing sends
        return
    _SHARING.setattr(checker.OptInChecker, "check", lambda self, *args, **kwargs: checker.ConsentCheckResult.DECLINED)


_RESERVED_PYFUNC_CALL = on_a_reserved_stack(_pytest.python.pytest_pyfunc_call)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Each test function on a reserved frame stack (see pytest_configure); pytest's own call, inside it."""
    return _RESERVED_PYFUNC_CALL(pyfuncitem)


# The tests of export itself, of its patches and of what it leaves behind when a stage fails or runs in threads.
_FRESH_EXPORTS = ("tests/_export/", "tests/patches/", "tests/test_faults.py", "tests/test_purity.py",
                  "tests/test_pytree_registry.py", "tests/test_threads.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        if path.startswith(_FRESH_EXPORTS):
            item.add_marker(pytest.mark.fresh_exports)


def pytest_unconfigure(config):
    _SHARING.undo()


# Fixtures of tests that watch code run (its prints, warnings, logs) or change it: a shared export would run nothing.
_WATCHING = ("monkeypatch", "capfd", "capsys", "caplog", "recwarn")


@pytest.fixture(autouse=True)
def _fresh_exports_where_asked(request):
    """Tests of export itself (marked ``fresh_exports``) and tests that watch or monkeypatch code trace every
    export again."""
    fresh = (request.node.get_closest_marker("fresh_exports") is not None
             or any(name in request.fixturenames for name in _WATCHING))
    with shared_exports.suspended() if fresh else contextlib.nullcontext():
        yield


@pytest.fixture(autouse=True)
def _hfx_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="hfx")
        yield


@pytest.fixture(scope="session")
def models():
    """One tiny model per parity architecture, built lazily."""
    return memoized(zoo.build)


@pytest.fixture(scope="session")
def exported(models):
    """One ``Exported`` per parity architecture, exported once per session from capture-shaped inputs."""
    return exported_by_name(models)


@pytest.fixture(scope="session")
def lowered_onnx(exported):
    """``lowered_onnx(name, **options)``: the parity architecture's ``Exported`` lowered to ONNX once per session
    for each set of options (a program is immutable: tests that quantize or wrap it get new ones)."""
    return memoized(lambda name, **options: hfx.lower_to_onnx(exported(name), **options))


@pytest.fixture(scope="session")
def generative(models):
    """``(model, exported Components)`` per generative architecture, decomposed and exported once per session."""
    return decomposed_by_name(models)


@pytest.fixture(scope="session")
def generative_one_layer():
    """``(model, exported Components)`` of ``tests.helpers.one_layer(name)``, decomposed and exported once per session."""
    return decomposed_by_name(memoized(one_layer))
