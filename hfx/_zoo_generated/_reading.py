"""Reading tiny configs: attributes that may sit on a sub-config or be per-layer."""

from __future__ import annotations

import dataclasses
from typing import Any


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def find(config: Any, *attributes: str) -> Any:
    """The first of ``attributes`` set on ``config`` or, breadth first, on its sub-configs; ``None`` when none is."""
    from transformers import PretrainedConfig

    queue = [config]
    while queue:
        current = queue.pop(0)
        for attribute in attributes:
            value = read(current, attribute)
            if value is not None:
                return value
        subs = (read(current, f.name) for f in dataclasses.fields(current))
        queue += [v for v in subs if isinstance(v, PretrainedConfig)]
    return None


def read(config: Any, attribute: str) -> Any:
    """``config.<attribute>`` or ``None``; per-layer attributes of heterogeneous configs read as their global value."""
    try:
        return getattr(config, attribute, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
        return vars(config).get(attribute)


def text_config(config: Any) -> Any:
    """The decoder's text config of a composite config, else the config itself."""
    try:
        return config.get_text_config(decoder=True)
    except (AttributeError, ValueError):
        return config
