"""What every runtime's lowering enters for speed (``lowering_speedups``): torch's registry walk once per question, not
once per namespace, and hfx's pytree spec caches.

``patch_cia_ops_materialized_once_per_collection``: ``torch.export`` asks which
CompositeImplicitAutograd ops a program may keep whole
(``torch._export.utils._collect_all_valid_cia_ops``) each time a decomposition table
is read or applied: every ``run_decompositions``, and every ``in``, ``keys()`` or
``items()`` on a fresh ``default_decompositions()`` table. Each answer walks every
op namespace (about 40 once ExecuTorch and OpenVINO are imported), and for each
namespace ``_collect_all_valid_cia_ops_for_namespace`` first materialises every
CompositeImplicitAutograd op of the C++ dispatcher into ``torch.ops``
(``_materialize_cpp_cia_ops``, torch 2.13.0 and 2.14.1): the same ~840 ``getattr``
chains 40 times in a row, with nothing registered in between. ExecuTorch's lowering
asks dozens of times, ONNX's and OpenVINO's a few: in hfx's test suite these walks
were ~5% of all worker time (py-spy, 2026-12-06). The patch materialises once per
question and lets the namespace walk that follows skip the repeats; what the walk
finds is the same set of ops (tests/backends/test_lowering_speed.py). It steps aside
when torch no longer materialises per namespace. Delete when torch materialises once
per collection (or caches it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from hfx._pytree import spec_caches
from hfx.patches._core import swap_attr, swap_attr_on_each

# The modules that call ``_collect_all_valid_cia_ops`` by the name they imported (torch 2.13.0 and 2.14.1).
_COLLECTORS = ("torch._export.utils", "torch.export.decomp_utils", "torch.export.exported_program")


def _collecting_with_one_materialisation(collect: Callable[[], Any], utils: Any) -> Callable[[], Any]:
    """``collect`` (``_collect_all_valid_cia_ops``) that materialises the dispatcher's ops once, then walks with
    ``_materialize_cpp_cia_ops`` a no-op."""

    def collect_all_valid_cia_ops() -> Any:
        utils._materialize_cpp_cia_ops()  # noqa: SLF001
        with swap_attr(utils, "_materialize_cpp_cia_ops", _materialised):
            return collect()

    collect_all_valid_cia_ops.__wrapped__ = collect
    return collect_all_valid_cia_ops


def _materialised() -> None:
    """``_materialize_cpp_cia_ops`` inside a collection that has materialised already."""


def materialisations(collect: Callable[[], Any]) -> tuple[Any, int]:
    """What ``collect()`` returns and how many times it materialised the dispatcher's ops."""
    from torch._export import utils

    calls = []
    original = utils._materialize_cpp_cia_ops  # noqa: SLF001

    def counted() -> None:
        calls.append(None)
        original()

    with swap_attr(utils, "_materialize_cpp_cia_ops", counted):
        found = collect()
    return found, len(calls)


@functools.cache
def materialises_per_namespace() -> bool:
    """Whether one ``_collect_all_valid_cia_ops`` materialises the dispatcher's ops more than once (probed once)."""
    from torch._export import utils

    return materialisations(utils._collect_all_valid_cia_ops)[1] > 1  # noqa: SLF001


@contextlib.contextmanager
def patch_cia_ops_materialized_once_per_collection() -> Iterator[None]:
    """Materialise the dispatcher's CompositeImplicitAutograd ops once per collection of them (module docstring).

    Steps aside when torch materialises once already, and inside a lowering that has entered it (nested).
    """
    import importlib

    from torch._export import utils

    original = utils._collect_all_valid_cia_ops  # noqa: SLF001
    if hasattr(original, "__wrapped__") or not materialises_per_namespace():
        yield
        return
    modules = [importlib.import_module(name) for name in _COLLECTORS]
    owners = [module for module in modules if getattr(module, "_collect_all_valid_cia_ops", None) is original]
    with swap_attr_on_each(owners, "_collect_all_valid_cia_ops", _collecting_with_one_materialisation(original, utils)):
        yield


@contextlib.contextmanager
def lowering_speedups(io: Any) -> Iterator[None]:
    """What every runtime's lowering runs inside: hfx's pytree spec caches for ``io`` (``hfx._pytree.spec_caches``)
    and ``patch_cia_ops_materialized_once_per_collection``."""
    with spec_caches(io), patch_cia_ops_materialized_once_per_collection():
        yield
