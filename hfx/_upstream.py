"""What differs between the upstream releases hfx is tested with, each difference handled here and only here.

transformers 5.24 renamed the models' cache argument and output field
(``forward(..., cache=...)``, ``CausalLMOutputWithPast.cache``) where 5.23 and
older have ``past_key_values`` (``cache_params`` for state-space models):

- graph names stay ``past_key_values.*`` / ``present.*`` whatever the release
  calls the argument (``graph_name``), so ONNX, OpenVINO and ExecuTorch files
  and the pipelines that read them do not change with transformers;
- a saved output structure names the field as the release that saved it did;
  ``with_installed_fields`` renames it to the installed class's field, so an
  export saved with either release loads and generates with the other;
- ``output_cache`` reads the cache of a model output under any of the names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.utils import _pytree as pytree

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
