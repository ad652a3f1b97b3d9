"""hfx._stack: the stages' calls run in one reserved chunk of CPython's frame stack (python/cpython#142183)."""

from __future__ import annotations

import sys
import threading

import pytest

from hfx import _stack
from hfx._stack import chunks_thrash, faults_of_calls_across_an_edge, on_a_reserved_stack

resource = pytest.importorskip("resource")


def _in_a_fresh_thread(work):
    """``work()`` in a new thread: its frame stack starts empty, below no reservation (the tests run on one)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join()
    return result[0]


def test_cpython_3_11_and_3_12_still_map_a_chunk_per_call_across_an_edge():
    """Canary: when this fails, this CPython caches a chunk (gh-145789) and ``hfx._stack`` steps aside by itself;
    when hfx requires such a CPython, the module can go."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 11), (3, 12)):
        pytest.skip("3.13 and 3.14 got the cached chunk in patch releases; their check decides at run time")
    assert chunks_thrash()
    assert _in_a_fresh_thread(faults_of_calls_across_an_edge) > 300


@pytest.mark.skipif(not chunks_thrash(), reason="this interpreter caches a chunk: nothing to reserve")
def test_calls_across_an_edge_fault_no_more_on_the_reserved_stack():
    plain = _in_a_fresh_thread(faults_of_calls_across_an_edge)
    reserved = _in_a_fresh_thread(on_a_reserved_stack(faults_of_calls_across_an_edge))
    # Each of the 400 calls at the edge maps a chunk outside; inside, every frame fits in the reserved chunk.
    assert plain > 300 and reserved < 100, (plain, reserved)


def test_a_wrapped_function_returns_raises_and_nests_on_one_reservation(monkeypatch):
    reservations = []
    real = _stack.reserved_call
    monkeypatch.setattr(_stack._INSIDE, "reserved", False)  # the test itself runs on a reservation
    monkeypatch.setattr(_stack, "chunks_thrash", lambda: True)
    monkeypatch.setattr(_stack, "reserved_call", lambda work: reservations.append(1) or real(work))

    @on_a_reserved_stack
    def depth(n):
        assert _stack._INSIDE.reserved
        return n if n == 0 else 1 + depth(n - 1)

    assert depth(50) == 50 and len(reservations) == 1  # the calls below the first do not reserve again

    @on_a_reserved_stack
    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    assert len(reservations) == 2  # the flag is put back after a failure: the next call reserves again


def test_the_reservation_is_per_thread(monkeypatch):
    monkeypatch.setattr(_stack._INSIDE, "reserved", False)
    monkeypatch.setattr(_stack, "chunks_thrash", lambda: True)
    seen = {}

    @on_a_reserved_stack
    def inside(name):
        seen[name] = _stack._INSIDE.reserved
        if name == "main":
            thread = threading.Thread(target=lambda: seen.setdefault("other before", getattr(_stack._INSIDE, "reserved", False)))
            thread.start()
            thread.join()
        return name

    assert inside("main") == "main"
    assert seen == {"main": True, "other before": False}


def test_where_chunks_do_not_thrash_the_function_is_called_as_it_is(monkeypatch):
    monkeypatch.setattr(_stack, "chunks_thrash", lambda: False)
    monkeypatch.setattr(_stack, "reserved_call", lambda work: pytest.fail("reserved without thrash"))
    assert on_a_reserved_stack(lambda x: x + 1)(1) == 2
