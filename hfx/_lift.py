"""Lift a stage over ``Components`` so that one stage serves one record or many."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from hfx._errors import ComponentError
from hfx._records import Components

Stage = Callable[..., Any]
S = TypeVar("S", bound=Stage)


def per_component(stage: S) -> S:
    """Make ``stage`` map itself over a ``Components`` subject, one component at a time.

    The subject is the stage's first positional argument; keyword options are
    passed to every component alike. A failure is re-raised as ``ComponentError``
    naming the component and the stage.

    >>> def double(x, /, *, by=2):
    ...     return x * by
    >>> lifted = per_component(double)
    >>> dict(lifted(Components(items={"a": 1, "b": 2}), by=3))
    {'a': 3, 'b': 6}
    >>> lifted(5)
    10
    """

    @functools.wraps(stage)
    def lifted(subject: Any, /, *args: Any, **options: Any) -> Any:
        if not isinstance(subject, Components):
            return stage(subject, *args, **options)
        mapped = {key: _named(key, stage, value, args, options) for key, value in subject.items()}
        return attrs.evolve(subject, items=mapped)

    return lifted  # type: ignore[return-value]


def _named(key: str, stage: Stage, value: Any, args: tuple[Any, ...], options: Mapping[str, Any]) -> Any:
    """Run ``stage`` on one component, naming the component in any failure."""
    try:
        return stage(value, *args, **options)
    except ComponentError:
        raise
    except Exception as exc:
        raise ComponentError(key, stage.__name__, exc) from exc


def by_component(stages: Mapping[str, Stage]) -> Callable[[Components], Components]:
    """Return a stage that runs ``stages[name]`` on each component (like ``optax.partition``).

    >>> inc = by_component({"a": lambda x: x + 1, "b": lambda x: x - 1})
    >>> dict(inc(Components(items={"a": 1, "b": 1})))
    {'a': 2, 'b': 0}
    """
    stages = dict(stages)

    def run(components: Components) -> Components:
        unknown = set(components) - set(stages)
        if unknown:
            msg = f"by_component has no stage for component(s) {sorted(unknown)}; known: {sorted(stages)}"
            raise KeyError(msg)
        return attrs.evolve(
            components, items={key: _named(key, stages[key], value, (), {}) for key, value in components.items()}
        )

    return run
