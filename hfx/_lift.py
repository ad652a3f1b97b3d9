"""Lift a stage over ``Components`` so that one stage serves one record or many."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from hfx._errors import ComponentError
from hfx._records import Components
from hfx._stack import on_a_reserved_stack

Stage = Callable[..., Any]
S = TypeVar("S", bound=Stage)


def per_component(stage: S, /, *, name: str | None = None,
                  options_for: Callable[[Components, str, dict[str, Any]], dict[str, Any]] | None = None) -> S:
    """Make ``stage`` map itself over a ``Components`` subject, one component at a time.

    The subject is the stage's last positional argument; the positional data
    before it and the keyword options are passed to every component alike. A
    failure keeps its own type (``CaptureError``, ``InputError``, ``ValueError``
    ...) and gains a note naming the component and the stage
    (``exc.__notes__``: ``"in component 'decode' of lower_to_pte"``). The stage
    runs on a reserved frame stack (``hfx._stack``): stages trace graphs many
    frames deep.

    Args:
        stage: a function whose last positional argument is one record.
        name: the stage's name in the note (default: ``stage.__name__``), for a
            public stage that lifts a private helper.
        options_for: ``(subject, component name, options) -> options``: the keyword options one
            component gets, read from the whole ``Components`` (ExecuTorch's bounds for the
            batch a beam search runs); every component gets the caller's by default.

    Returns:
        The stage, taking one record or ``Components`` of them (then returning ``Components``).

    Example:
        >>> def scale(by, x, /, *, plus=0):
        ...     return x * by + plus
        >>> lifted = per_component(scale)
        >>> dict(lifted(3, Components(items={"a": 1, "b": 2}), plus=1))
        {'a': 4, 'b': 7}
        >>> lifted(2, 5)
        10
    """
    label = name or _stage_name(stage)
    reserved = on_a_reserved_stack(stage)

    @functools.wraps(stage)
    def lifted(*args: Any, **options: Any) -> Any:
        if not args or not isinstance(args[-1], Components):
            return reserved(*args, **options)  # also the stage's own TypeError for a missing subject, which curry reads
        *data, subject = args
        own = (lambda key: options_for(subject, key, dict(options))) if options_for else (lambda key: options)
        items = {key: _named(key, label, lambda v, key=key: reserved(*data, v, **own(key)), value)
                 for key, value in subject.items()}
        return attrs.evolve(subject, items=items)

    return lifted  # type: ignore[return-value]


def _named(key: str, stage: str, run: Callable[[Any], Any], value: Any) -> Any:
    """``run(value)``, a failure noted with the component ``key`` and the ``stage`` it failed in."""
    try:
        return run(value)
    except Exception as exc:
        exc.add_note(f"in component {key!r} of {stage}")
        raise


def _stage_name(stage: Stage) -> str:
    """A stage's name for a note: its ``__name__``, or that of the function a ``partial`` binds."""
    return getattr(stage, "__name__", None) or getattr(getattr(stage, "func", None), "__name__", None) or repr(stage)


def by_component(stages: Mapping[str, Stage]) -> Callable[[Components], Components]:
    """Return a stage that runs ``stages[name]`` on each component (like ``optax.partition``).

    Args:
        stages: component name -> the stage for that component (a curried stage with its options bound).

    Returns:
        A stage ``Components -> Components``. A failure keeps its type and gains a
        note naming the component and the stage, as with ``per_component``.

    Raises:
        ComponentError: the ``Components`` hold a component ``stages`` has no stage for
            (before any stage runs).

    Example:
        >>> inc = by_component({"a": lambda x: x + 1, "b": lambda x: x - 1})
        >>> dict(inc(Components(items={"a": 1, "b": 1})))
        {'a': 2, 'b': 0}
    """
    stages = dict(stages)

    def run(components: Components) -> Components:
        unknown = [key for key in components if key not in stages]
        if unknown:
            msg = f"by_component has no stage for component(s) {unknown}; it has stages for {sorted(stages)}"
            raise ComponentError(msg, components=tuple(unknown))
        return attrs.evolve(
            components,
            items={key: _named(key, _stage_name(stages[key]), stages[key], value) for key, value in components.items()},
        )

    return run
