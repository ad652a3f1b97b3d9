"""What the quantization stages share: option checks, quiet runs, errors and the manifest record."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from hfx._errors import LoweringError, describe
from hfx._records import Components


def check_choice(stage: str, option: str, value: Any, choices: Mapping[str, str]) -> None:
    """Raise ``ValueError`` naming the stage, the option and every choice with what it does, unless ``value`` is one."""
    if value not in choices:
        listed = "; ".join(f"{name!r}: {what}" for name, what in choices.items())
        msg = f"{stage}: {option} must be one of {sorted(choices)}, got {value!r}. {listed}"
        raise ValueError(msg)


def check_positive_int(stage: str, option: str, value: Any, examples: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        msg = f"{stage}: {option} must be a positive int ({examples}), got {value!r}"
        raise ValueError(msg)


def int8_reduce_range(stage: str, value: Any, *, int8: bool, without_saturation: Callable[[], bool]) -> bool:
    """``reduce_range`` resolved: the given bool, else 7-bit weights where ``without_saturation()`` says the CPU's
    int8 kernels would saturate (``hfx._cpu``); always False for a form without int8 activations (``int8=False``).

    Raises:
        ValueError: ``value`` is neither None nor a bool, or a bool for a form it does not apply to.
    """
    if value is not None and not isinstance(value, bool):
        msg = f"{stage}: reduce_range must be True, False or None (decided from this CPU), got {value!r}"
        raise ValueError(msg)
    if not int8:
        if value is not None:
            msg = (f"{stage}: reduce_range applies only to the modes that quantize activations to int8 (7-bit "
                   "weights keep CPUs without VNNI from saturating); drop it")
            raise ValueError(msg)
        return False
    return not without_saturation() if value is None else value


@contextlib.contextmanager
def quietly(*namespaces: str) -> Iterator[io.StringIO]:
    """Keep the quantizer's prints, progress bars, warnings and log records in a buffer (for the error message)."""
    from hfx.backends._common import captured_output

    buffer = io.StringIO()
    with captured_output(buffer, namespaces):
        yield buffer


def quantization_error(stage: str, model: str, component: str, exc: BaseException, todo: str, log: str) -> LoweringError:
    """A ``LoweringError`` naming the stage, component and model, the quantizer's failure and its output."""
    from hfx.backends._common import first_line, with_log

    what = f"quantization failed: {type(exc).__name__}: {first_line(exc)}."
    return LoweringError(with_log(describe(stage, model or "model", component, what, todo), log, source=stage))


def with_quantization(result: Any, entry: Mapping[str, Any]) -> Any:
    """``result`` with ``entry`` recorded in ``meta.quantization`` when it is ``Components`` (saved in the manifest)."""
    if not isinstance(result, Components):
        return result
    return attrs.evolve(result, meta=attrs.evolve(result.meta, quantization=entry))


def component_samples(
    stage: str, subject: Any, kind: type, calibration: Any, *, static: str | None, instead: str
) -> list[Mapping[str, Any]] | None:
    """The calibration samples of one component, after checking the record's type and that a static form has some.

    Raises:
        TypeError: ``subject`` is not a ``kind``.
        ValueError: ``static`` names the chosen static form and no samples were given.
    """
    from hfx.quantize._calibration import samples_for

    if not isinstance(subject, kind):
        msg = f"{stage} takes an {kind.__name__} or Components of them, got {type(subject).__name__}"
        raise TypeError(msg)
    samples = samples_for(calibration, subject.name, stage=stage)
    if static and samples is None:
        msg = f"{stage}: {static} observes activation ranges; pass calibration=[input dicts] (or use {instead})"
        raise ValueError(msg)
    return samples
