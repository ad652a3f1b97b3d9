"""``verify``: run a program and the eager model on the same inputs and report the differences."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs
import torch
from toolz import curry

from hfx._errors import ComponentError, argument_error
from hfx._pytree import named_leaves
from hfx._records import Components


@attrs.frozen(kw_only=True)
class OutputDiff:
    """How far one output of a program is from eager."""

    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    scale: float = 0.0  # the largest magnitude of the eager output (what ``rtol`` scales)


@attrs.frozen(kw_only=True)
class Report:
    """Per-output differences between a program and the eager model, and whether they are within tolerance.

    An output passes when its largest absolute difference is at most
    ``atol + rtol * scale``, ``scale`` being the output's largest eager magnitude.
    """

    program: str
    atol: float
    rtol: float = 0.0
    diffs: tuple[OutputDiff, ...] = attrs.field(converter=tuple)

    @property
    def max_abs(self) -> float:
        """The largest absolute difference over every output."""
        return max((d.max_abs for d in self.diffs), default=0.0)

    @property
    def passed(self) -> bool:
        """Whether every output is within ``atol + rtol * scale`` of eager (NaN fails)."""
        return all(d.max_abs <= self.atol + self.rtol * d.scale for d in self.diffs)

    def __str__(self) -> str:
        tolerance = f"atol {self.atol:g}" + (f", rtol {self.rtol:g}" if self.rtol else "")
        rows = [f"{self.program}: {'PASS' if self.passed else 'FAIL'} ({tolerance})"]
        rows += [f"  {d.name:<28} {str(list(d.shape)):<18} max abs {d.max_abs:.3e}  max rel {d.max_rel:.3e}" for d in self.diffs]
        return "\n".join(rows)


def _diff(name: str, got: torch.Tensor, want: torch.Tensor) -> OutputDiff:
    got, want = got.detach().to(torch.float64), want.detach().to(torch.float64)
    if got.shape != want.shape:
        return OutputDiff(name=name, shape=tuple(want.shape), max_abs=float("inf"), max_rel=float("inf"))
    if got.numel() == 0:
        return OutputDiff(name=name, shape=tuple(want.shape), max_abs=0.0, max_rel=0.0)
    # equal values are no difference, infinities (masked logits) and NaNs at the same places included
    same = (got == want) | (got.isnan() & want.isnan())
    delta = torch.where(same, 0.0, (got - want).abs())
    rel = delta / want.abs().clamp_min(1e-6)
    max_abs = float(delta.max()) if not delta.isnan().any() else float("nan")
    finite = want[want.isfinite()].abs()
    return OutputDiff(name=name, shape=tuple(want.shape), max_abs=max_abs, max_rel=float(rel.max()),
                      scale=float(finite.max()) if finite.numel() else 0.0)


@curry
def verify(
    model: torch.nn.Module, inputs: Mapping[str, Any], program: Any, /, *, atol: float = 1e-4, rtol: float = 0.0
) -> Report:
    """Compare ``program(**inputs)`` with ``model(**inputs)`` output by output.

    Use inputs of another batch size and sequence length than the capture to
    check that the dynamic shapes hold. The model runs in eval mode under
    ``no_grad`` with the constants the program baked in (``use_cache=False`` …);
    neither the model nor ``inputs`` is changed. ``verify(model, inputs)`` alone
    is a stage ``program -> Report``: ``pipe(model, capture(inputs), lower_to_onnx, verify(model, new))``.

    Args:
        model: the eager model the program was exported from.
        inputs: keyword arguments for both (for ``Components``: component name -> inputs).
        program: an ``Exported`` or a runtime program, or ``Components`` of them.
        atol: the largest absolute difference that passes.
        rtol: adds ``rtol`` times each output's largest eager magnitude to ``atol``
            (logits of a real model are large: their float32 noise grows with them).

    Returns:
        A ``Report`` (``Components`` of them for ``Components``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``inputs`` not a mapping, or
            ``program`` a model or a mapping (the arguments in the wrong order).
        ComponentError: ``program`` is ``Components`` and ``inputs`` has no entry for one of them.

    Example:
        >>> import torch
        >>> from hfx import capture, export
        >>> lin = torch.nn.Linear(3, 2)
        >>> verify(lin, {"input": torch.ones(4, 3)}, export(capture({"input": torch.ones(1, 3)}, lin))).passed
        True
    """
    _check_order(model, inputs, program)
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            msg = f"verify: {name} must be a number >= 0 (the largest difference that passes), got {value!r}"
            raise ValueError(msg)
    if isinstance(program, Components):
        missing = [k for k in program if k not in inputs]
        if missing:
            msg = f"verify: inputs has no entry for component(s) {missing}; for Components pass {{component: inputs}} for {list(program)}"
            raise ComponentError(msg, components=tuple(missing))
        return Components(items={k: verify(model, inputs[k], p, atol=atol, rtol=rtol) for k, p in program.items()})
    got = program(**copy.deepcopy(dict(inputs)))  # a static cache is written in place (io.updates)
    want = eager_outputs(model, {**copy.deepcopy(dict(inputs)), **program.io.constants})
    got_leaves = dict(named_leaves({"": got}))
    want_leaves = _with_joined_lists(
        [(n, t) for n, t in named_leaves({"": want}) if isinstance(t, torch.Tensor)], got_leaves
    )
    diffs = [_diff(name.removeprefix("."), got_leaves[name], tensor) for name, tensor in want_leaves if name in got_leaves]
    missing = [n for n, _ in want_leaves if n not in got_leaves]
    diffs += [OutputDiff(name=n.removeprefix("."), shape=(), max_abs=float("inf"), max_rel=float("inf")) for n in missing]
    label = f"{type(program).__name__}({getattr(program, 'name', 'model')})"
    return Report(program=label, atol=atol, rtol=rtol, diffs=diffs)


def _check_order(model: Any, inputs: Any, program: Any) -> None:
    """Raise ``TypeError`` naming the argument that is not what ``verify(model, inputs, program)`` takes."""
    call = "verify(model, inputs, program)"
    if isinstance(program, torch.nn.Module) or (isinstance(program, Mapping) and not isinstance(program, Components)):
        wanted = "an Exported, a runtime program or Components, not the model or its inputs"
        raise argument_error(call, "program (the last argument)", wanted, program)
    if not isinstance(model, torch.nn.Module):
        raise argument_error(call, "model", "the eager torch.nn.Module", model)
    if not isinstance(inputs, Mapping):
        raise argument_error(call, "inputs", "a mapping of keyword arguments", inputs)


def _with_joined_lists(
    want: list[tuple[str, torch.Tensor]], got: Mapping[str, Any]
) -> list[tuple[str, torch.Tensor]]:
    """``want`` with each per-item list of tensors that the program returns joined replaced by its ``cat``.

    A graph with a dynamic batch cannot return a list whose length follows the
    batch (SmolVLM's ``image_hidden_states.pooler_output`` holds one tensor per
    prompt; ``patch_per_image_feature_split``): the program returns the rows
    joined along dim 0, as one tensor or a one-item list, and that is compared.
    """
    joined: dict[str, list[torch.Tensor]] = {}
    kept: list[tuple[str, torch.Tensor]] = []
    for name, tensor in want:
        parent, _, index = name.rpartition(".")
        target = _joined_target(parent, got) if index.isdigit() and f"{parent}.1" not in got else None
        if target is None:
            kept.append((name, tensor))
            continue
        if target not in joined:
            kept.append((target, tensor))  # a placeholder, replaced by the cat below
        joined.setdefault(target, []).append(tensor)
    return [(name, torch.cat(joined[name]) if len(joined.get(name, ())) > 1 else tensor) for name, tensor in kept]


def _joined_target(parent: str, got: Mapping[str, Any]) -> str | None:
    """The program's output holding the joined list at ``parent``: the tensor itself or its one-item list."""
    if isinstance(got.get(parent), torch.Tensor):
        return parent
    return f"{parent}.0" if isinstance(got.get(f"{parent}.0"), torch.Tensor) else None


def eager_outputs(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> Any:
    """Run ``model(**kwargs)`` in eval mode under ``no_grad`` and restore its training flags."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            return model(**kwargs)
    finally:
        for module, training in flags:
            module.training = training
