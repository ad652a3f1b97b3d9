"""Patches that act on the user's model for the length of an export and then undo themselves."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr

# Attention kernels torch.export cannot trace on CPU; sdpa computes the same function.
_UNEXPORTABLE_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention")


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every distinct config object reachable from the model's modules and their sub-configs."""
    found: dict[int, Any] = {}
    pending = [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    while pending:
        config = pending.pop()
        if id(config) in found:
            continue
        found[id(config)] = config
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, "to_dict"):
                pending.append(sub)
    return list(found.values())


@contextlib.contextmanager
def preserve_module_state(model: torch.nn.Module) -> Iterator[None]:
    """Restore every submodule's and config's attributes, parameters and buffers on exit.

    Tracing runs the model's Python code with fake tensors; code that caches on
    ``self`` (rotary tables, ``cached_sequence_length``, lazily built masks,
    output-capturing hooks that transformers installs on first use) would
    otherwise keep fake tensors or half-installed hooks after the export. This
    takes a shallow snapshot of each ``__dict__`` and of every dict in it
    (parameters, buffers, submodules, hooks) and puts back exactly what was there.
    """
    owners = [*model.modules(), *_configs(model)]
    snapshots = [(owner, _snapshot(owner)) for owner in owners]
    try:
        yield
    finally:
        for owner, snapshot in snapshots:
            _restore(owner, snapshot)


class _Contents:
    """A dict attribute and what it held (parameters, buffers, submodules, hooks that code adds lazily)."""

    __slots__ = ("container", "items")

    def __init__(self, container: dict[Any, Any]) -> None:
        self.container, self.items = container, dict(container)


def _snapshot(owner: Any) -> dict[str, Any]:
    return {key: _Contents(value) if type(value) in (dict, OrderedDict) else value for key, value in vars(owner).items()}


def _restore(owner: Any, snapshot: dict[str, Any]) -> None:
    current = vars(owner)
    for key in [k for k in current if k not in snapshot]:
        del current[key]
    for key, value in snapshot.items():
        if isinstance(value, _Contents):
            value.container.clear()
            value.container.update(value.items)
            current[key] = value.container
        elif current.get(key, object()) is not value:
            current[key] = value


@contextlib.contextmanager
def patch_eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Trace the model in eval mode (no dropout) and give back its training flags on exit."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


@contextlib.contextmanager
def patch_attention_implementation(model: torch.nn.Module) -> Iterator[None]:
    """Switch flash/flex attention to sdpa for the export only (they cannot be traced on CPU)."""
    with contextlib.ExitStack() as stack:
        for config in _configs(model):
            if vars(config).get("_attn_implementation_internal") in _UNEXPORTABLE_ATTENTION:
                stack.enter_context(swap_attr(config, "_attn_implementation_internal", "sdpa"))
        yield
