"""with_patches: the order it enters and exits patches in, and the error that names a patch failing to apply.

The patch contract of swap_attr, swap_attr_on_each, swap_item and with_patches (restored on exit, on
error, on a failed later patch, an added attribute removed) is checked in test_contract.py.
"""

from __future__ import annotations

import contextlib

import pytest

from hfx import PatchError
from hfx.patches import with_patches


def _logging(calls: list[str], name: str):
    @contextlib.contextmanager
    def patch():
        calls.append(f"enter {name}")
        try:
            yield
        finally:
            calls.append(f"exit {name}")

    patch.__name__ = name
    return patch


def test_patches_enter_in_order_and_exit_in_reverse_order():
    calls: list[str] = []
    with with_patches(_logging(calls, "a"), _logging(calls, "b")):
        calls.append("block")
    assert calls == ["enter a", "enter b", "block", "exit b", "exit a"]


def test_a_patch_that_fails_to_apply_is_named_and_its_error_chained():
    calls: list[str] = []

    def unavailable():
        raise ModuleNotFoundError("no module named 'runtime'")

    with pytest.raises(PatchError, match="patch unavailable failed to apply: no module named 'runtime'") as info, \
            with_patches(_logging(calls, "a"), unavailable, _logging(calls, "b")):
        pass
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert calls == ["enter a", "exit a"]  # the patch after it was never entered
