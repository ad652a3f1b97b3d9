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


class ComponentError(HfxError, RuntimeError):
    """A stage failed on one component of a ``Components`` record."""

    def __init__(self, component: str, stage: str, cause: BaseException) -> None:
        self.component = component
        self.stage = stage
        super().__init__(f"{stage} failed on component {component!r}: {cause}")


class PatchError(HfxError, RuntimeError):
    """A patch could not be applied; every patch entered before it was undone."""


class InputError(HfxError, ValueError):
    """Inputs given to a program or stage do not match what it accepts."""


def describe(stage: str, model: object, component: str, what: str, todo: str) -> str:
    """Return the one-paragraph message hfx errors use: stage, component, model, cause, remedy."""
    model_name = model if isinstance(model, str) else type(model).__name__
    return f"[{stage}] component {component!r} of {model_name}: {what} {todo}".strip()
