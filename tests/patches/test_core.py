"""swap_attr, swap_item and with_patches restore exactly, on exit, on error and on a failed later patch."""

from __future__ import annotations

import contextlib

import pytest

from hfx import PatchError
from hfx.patches import swap_attr, swap_item, with_patches


class Owner:
    @staticmethod
    def static():
        return "static"

    def method(self):
        return "method"


class Child(Owner):
    pass


def test_swap_attr_is_active_inside():
    with swap_attr(Owner, "method", lambda self: "patched"):
        assert Owner().method() == "patched"


def test_swap_attr_restores_the_original_object():
    original = vars(Owner)["static"]
    with swap_attr(Owner, "static", staticmethod(lambda: "patched")):
        assert Owner.static() == "patched"
    assert vars(Owner)["static"] is original
    assert Owner.static() == "static"


def test_swap_attr_restores_after_an_exception():
    original = vars(Owner)["method"]
    with pytest.raises(RuntimeError), swap_attr(Owner, "method", None):
        raise RuntimeError
    assert vars(Owner)["method"] is original


def test_swap_attr_removes_an_attribute_that_was_inherited():
    with swap_attr(Child, "method", lambda self: "child"):
        assert Child().method() == "child"
    assert "method" not in vars(Child)
    assert Child().method() == "method"


def test_swap_item_restores_and_removes():
    table = {"a": 1}
    with swap_item(table, "a", 2), swap_item(table, "b", 3):
        assert table == {"a": 2, "b": 3}
    assert table == {"a": 1}


def test_a_failing_later_patch_unwinds_the_earlier_ones():
    def first():
        return swap_attr(Owner, "method", lambda self: "first")

    @contextlib.contextmanager
    def broken():
        raise ValueError("cannot apply")
        yield

    original = vars(Owner)["method"]
    with pytest.raises(PatchError, match="broken failed to apply"), with_patches(first, broken):
        pass
    assert vars(Owner)["method"] is original


def test_with_patches_restores_after_an_exception_in_the_block():
    table = {}
    with pytest.raises(KeyError), with_patches(lambda: swap_item(table, "k", 1)):
        raise KeyError
    assert table == {}
