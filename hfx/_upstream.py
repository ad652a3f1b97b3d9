"""What differs between the upstream releases hfx is tested with, each difference handled here and only here.

transformers 5.24 renamed the models' cache argument and output field
(``forward(..., cache=...)``, ``CausalLMOutputWithPast.cache``) where 5.23 and
older have ``past_key_values`` (``cache_params`` for state-space models):

- graph names stay ``past_key_values.*`` / ``present.*`` whatever the release
  calls the argument (``graph_name``), so ONNX, OpenVINO and ExecuTorch files
  and the pipelines that read them do not change with transformers (a
  state-space model's ``cache_params.*`` of 5.23 is ``past_key_values.*`` under
  5.24: no pipeline reads those, and hfx feeds a graph by its spec, not names);
- a saved output structure names the field as the release that saved it did;
  ``with_installed_fields`` renames it to the installed class's field, so an
  export saved with either release loads and generates with the other;
- ``output_cache`` reads the cache of a model output under any of the names.

``WINDOW`` is the tested window (pyproject.toml declares the same ranges);
``check_window`` warns once per process about a release outside it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from torch.utils import _pytree as pytree

#: Distribution -> (oldest, newest) ``major.minor`` release the suite passes on (CI runs both ends).
WINDOW = MappingProxyType({
    "torch": ("2.13", "2.14"),
    "transformers": ("5.22", "5.24"),
    "onnx": ("1.23", "1.23"),
    "onnxscript": ("0.7", "0.7"),
    "onnxruntime": ("1.32", "1.32"),
    "executorch": ("1.5", "1.5"),
    "openvino": ("2026.4", "2026.4"),
})


class UntestedVersionWarning(UserWarning):
    """An installed release is outside hfx's tested window; hfx goes on and may fail or differ."""


@functools.cache
def check_window(distribution: str) -> str | None:
    """Warn (once per process) when the installed ``distribution`` is outside ``WINDOW``; its version, or ``None`` if absent.

    Example:
        >>> check_window("no-such-distribution") is None
        True
    """
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    oldest, newest = WINDOW.get(distribution, (None, None))
    if oldest is not None and not _release(oldest) <= _release(installed) <= _release(newest):
        window = oldest if oldest == newest else f"{oldest} to {newest}"
        warnings.warn(f"hfx is tested with {distribution} {window}.x; {installed} is installed. hfx goes on; a failure "
                      f"or a numeric difference may come from the untested release: pip install '{distribution}"
                      f">={oldest},<{_next(newest)}' to get a tested one.", UntestedVersionWarning, stacklevel=2)
    return installed


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``2.14.1+cpu`` or ``2026.4.1``."""
    found = re.match(r"(\d+)(?:\.(\d+))?", version)
    return (int(found[1]), int(found[2] or 0)) if found else (0, 0)


def _next(release: str) -> str:
    major, minor = _release(release)
    return f"{major}.{minor + 1}"


#: The names the cache argument and output field have had, newest first.
CACHE_NAMES = ("cache", "past_key_values", "cache_params")
#: The graph name of the 5.24 cache argument: the name every runtime's files and pipelines use.
_GRAPH_NAMES = {"cache": "past_key_values"}


def graph_name(top: str) -> str:
    """The name graphs give a top-level argument or output field: ``past_key_values`` for transformers 5.24's ``cache``.

    Example:
        >>> graph_name("cache"), graph_name("input_ids")
        ('past_key_values', 'input_ids')
    """
    return _GRAPH_NAMES.get(top, top)


def cache_argument(names: Any) -> str | None:
    """Which of ``names`` (a forward's parameters or a call's keyword arguments) is the cache, or ``None``.

    Example:
        >>> cache_argument(["input_ids", "cache", "use_cache"]), cache_argument(["input_ids"])
        ('cache', None)
    """
    return next((name for name in CACHE_NAMES if name in names), None)


def with_taken_cache_name(kwargs: Mapping[str, Any], taken: Any) -> Mapping[str, Any]:
    """``kwargs`` with the cache under the name a program ``taken`` (its arguments) uses, if given under another.

    A program exported with transformers 5.24 takes ``cache``, one of 5.23
    ``past_key_values``: either is called with either name.

    Example:
        >>> dict(with_taken_cache_name({"input_ids": 1, "past_key_values": 2}, ["input_ids", "cache"]))
        {'input_ids': 1, 'cache': 2}
    """
    wanted, given = cache_argument(taken), cache_argument(kwargs)
    if wanted is None or given is None or wanted == given or wanted in kwargs:
        return kwargs
    return {(wanted if key == given else key): value for key, value in kwargs.items()}


def output_cache(outputs: Any) -> Any:
    """The cache a model output hands back, under whichever name the installed release gives it (``None`` when none)."""
    keys = outputs.keys() if hasattr(outputs, "keys") else ()
    name = cache_argument(keys)
    return outputs[name] if name is not None else None


def with_installed_fields(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """``spec`` with each ``ModelOutput`` node's cache field named as the installed class names it.

    A spec saved with transformers 5.23 names ``past_key_values`` where 5.24's
    class has ``cache``, and the other way round; rebuilding the output would
    fail (5.23) or warn on every call (5.24). Specs whose names already match
    come back unchanged (the same object).
    """
    old = spec.children()
    children = [with_installed_fields(child) for child in old]
    context = _installed_context(spec.type, spec.context)
    if context is spec.context and all(new is child for new, child in zip(children, old, strict=True)):
        return spec
    return pytree.TreeSpec(spec.type, context, children)


def _installed_context(node_type: Any, context: Any) -> Any:
    """A ``ModelOutput`` node's field names with a cache name its class lacks replaced by the one it has."""
    if not (dataclasses.is_dataclass(node_type) and isinstance(context, list)):
        return context
    fields = {field.name for field in dataclasses.fields(node_type)}
    installed = cache_argument(fields)
    if installed is None or not any(name in CACHE_NAMES and name not in fields for name in context):
        return context
    return [installed if name in CACHE_NAMES and name not in fields else name for name in context]
