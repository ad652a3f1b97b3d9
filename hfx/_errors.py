"""Errors raised by hfx stages.

Every error names the stage that failed, the component and the model, and says
what to do, so that a failure deep inside ``torch.export`` or a runtime reads as
a sentence about the user's model.
"""

from __future__ import annotations


class HfxError(Exception):
    """Base class of every error that hfx raises on purpose."""


class CaptureError(HfxError, RuntimeError):
    """The model could not be captured or exported with ``torch.export``."""


class LoweringError(HfxError, RuntimeError):
    """An exported program could not be lowered to, or run on, a runtime."""


class ComponentError(HfxError, KeyError):
    """A mapping keyed by component name has no entry for a component of a ``Components`` record.

    Raised before any work by ``by_component`` (no stage for a component) and by
    ``verify`` (no inputs for a component). A stage that *fails* on one component
    does not raise this: ``per_component`` and ``by_component`` re-raise the
    stage's own error (``CaptureError``, ``InputError``, ``ValueError`` ...) with
    a note naming the component and the stage (``exc.__notes__``).

    Attributes:
        components: the names of the components that had no entry.
    """

    def __init__(self, message: str, *, components: tuple[str, ...]) -> None:
        super().__init__(message)
        self.components = components

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's own str is the repr of its argument


class PatchError(HfxError, RuntimeError):
    """A patch could not be applied; every patch entered before it was undone."""


class InputError(HfxError, ValueError):
    """Inputs given to a program or stage do not match what it accepts."""


def describe(stage: str, model: object, component: str, what: str, todo: str) -> str:
    """Return the one-paragraph message hfx errors use: stage, component, model, cause, remedy."""
    model_name = model if isinstance(model, str) else type(model).__name__
    return f"[{stage}] component {component!r} of {model_name}: {what} {todo}".strip()


def argument_error(call: str, argument: str, wanted: str, got: object) -> TypeError:
    """The ``TypeError`` for an argument of the wrong kind, showing the call's order (a swapped call reads as one).

    Example:
        >>> str(argument_error("save(directory, program)", "directory", "a path", object()))
        'save: directory must be a path, got object; call save(directory, program)'
    """
    stage = call.split("(", 1)[0]
    return TypeError(f"{stage}: {argument} must be {wanted}, got {type(got).__name__}; call {call}")


def reason_of(exc: BaseException, *, limit: int) -> str:
    """``Type: first line`` of an exception (its cause's when the message is empty), at most ``limit`` characters:
    a failure's one-line reason in a report (the coverage cells, the generated zoo's census)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if not first and exc.__cause__ is not None:
        return reason_of(exc.__cause__, limit=limit)
    return f"{type(exc).__name__}: {first}"[:limit]
