"""Immutable records that flow between hfx stages."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from hfx._contract import call, load_spec


def readonly(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Return a read-only copy of ``mapping`` (the caller's dict is never shared)."""
    return MappingProxyType(dict(mapping or {}))


@attrs.frozen(kw_only=True)
class DynamicShapes:
    """Named dynamic axes of a program's inputs and the bounds of each name.

    ``axes`` maps an input's leaf name (``"input_ids"``, ``"pixel_values"``) to
    ``{axis: dim name}``; every input that shares an axis shares its name.
    ``bounds`` maps a dim name to ``(min, max)``; ``max`` is ``None`` when unbounded.
    """

    axes: Mapping[str, Mapping[int, str]] = attrs.field(
        factory=dict, converter=lambda m: readonly({k: readonly(v) for k, v in dict(m).items()})
    )
    bounds: Mapping[str, tuple[int, int | None]] = attrs.field(factory=dict, converter=readonly)

    @property
    def names(self) -> tuple[str, ...]:
        """Every dim name, in first-use order."""
        seen: dict[str, None] = {}
        for per_axis in self.axes.values():
            seen.update(dict.fromkeys(per_axis.values()))
        return tuple(seen)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "axes": {k: {str(a): n for a, n in v.items()} for k, v in self.axes.items()},
            "bounds": {k: list(v) for k, v in self.bounds.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DynamicShapes:
        """The inverse of ``to_json``."""
        return cls(
            axes={k: {int(a): n for a, n in v.items()} for k, v in data["axes"].items()},
            bounds={k: tuple(v) for k, v in data["bounds"].items()},
        )


@attrs.frozen(kw_only=True)
class TensorSpec:
    """One flat graph input or output: its name, dtype and shape (a ``str`` is a named dynamic dim)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] = attrs.field(converter=tuple)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorSpec:
        """The inverse of ``to_json``."""
        return cls(name=data["name"], dtype=data["dtype"], shape=tuple(data["shape"]))


@attrs.frozen(kw_only=True)
class IoSpec:
    """The calling contract of an exported graph, shared by every runtime it is lowered to.

    ``inputs``/``outputs`` are the flat graph tensors in order; ``in_spec`` and
    ``out_spec`` are serialised pytree specs that rebuild the keyword arguments
    and the model's output structure (a ``ModelOutput``); ``constants`` are the
    non-tensor keyword arguments baked into the graph at capture. ``updates``
    names the inputs the graph writes in place (a static cache); a runtime that
    cannot write its inputs returns their new values as the last outputs,
    after the ``out_spec`` leaves, and the call copies them back.
    """

    inputs: tuple[TensorSpec, ...] = attrs.field(converter=tuple)
    outputs: tuple[TensorSpec, ...] = attrs.field(converter=tuple)
    in_spec: str
    out_spec: str
    constants: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly)
    bounds: Mapping[str, tuple[int, int | None]] = attrs.field(factory=dict, converter=readonly)
    updates: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Flat graph input names, in order."""
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Flat graph output names, in order."""
        return tuple(spec.name for spec in self.outputs)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "in_spec": self.in_spec,
            "out_spec": self.out_spec,
            "constants": {k: _json_constant(v) for k, v in self.constants.items()},
            "bounds": {k: list(v) for k, v in self.bounds.items()},
            "updates": list(self.updates),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IoSpec:
        """The inverse of ``to_json``."""
        return cls(
            inputs=[TensorSpec.from_json(s) for s in data["inputs"]],
            outputs=[TensorSpec.from_json(s) for s in data["outputs"]],
            in_spec=data["in_spec"],
            out_spec=data["out_spec"],
            constants=data["constants"],
            bounds={k: tuple(v) for k, v in data["bounds"].items()},
            updates=data.get("updates", ()),
        )


def _json_constant(value: Any) -> Any:
    json.dumps(value)  # constants baked into a graph must round-trip through the manifest
    return value


@attrs.frozen(kw_only=True, eq=False)
class Capture:
    """A model and the exact keyword arguments it is exported with.

    ``module`` is what ``torch.export`` traces: the user's model, or after
    ``flatten_signature`` a shallow view of it with a flat ``forward``.
    ``source`` is always the user's model. ``constants`` are the non-tensor
    keyword arguments baked into the graph (filled by ``flatten_signature``).
    """

    module: Any
    source: Any
    kwargs: Mapping[str, Any] = attrs.field(converter=readonly)
    constants: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly)
    dynamic_shapes: DynamicShapes | None = None
    is_flat: bool = False
    name: str = "model"


@attrs.frozen(kw_only=True, eq=False)
class Components(Mapping[str, Any]):
    """An ordered, read-only mapping of component name to record (``Capture``, ``Exported``, a program).

    ``meta`` carries what the components share and ``generate`` needs (the
    generation config, the decoder start token, whether the model is an
    encoder-decoder); it is JSON-ready and saved in the manifest.
    ``processor`` is an optional tokenizer or processor saved alongside.
    """

    items_: Mapping[str, Any] = attrs.field(converter=readonly, alias="items")
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly)
    processor: Any = None

    def __getitem__(self, key: str) -> Any:
        return self.items_[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={type(v).__name__}" for k, v in self.items_.items())
        return f"Components({inner})"


def _unchecked_module(program: Any) -> Any:
    """``program.module()`` without torch's per-call input-constraint hook.

    hfx's call checks the same names, dtypes, dims and bounds before the graph
    runs; torch's hook re-derives them with sympy on every call, which took
    half the time of a tiny model's decode step (measured: 2.3 ms of which
    1.1 ms in ``_check_input_constraints_pre_hook``).
    """
    from torch.export._unlift import _check_input_constraints_pre_hook

    module = program.module(check_guards=False)
    for key, hook in list(module._forward_pre_hooks.items()):  # noqa: SLF001
        if hook is _check_input_constraints_pre_hook:
            del module._forward_pre_hooks[key]  # noqa: SLF001
            module._forward_pre_hooks_with_kwargs.pop(key, None)  # noqa: SLF001
    return module


@attrs.frozen(kw_only=True, eq=False)
class Exported:
    """One ``torch.export`` program, the contract to call it and the shapes that made it.

    Calling it runs the program with the model's keyword arguments and returns
    the model's output structure. Lower it to any number of runtimes.
    """

    program: Any = attrs.field(repr=False)  # torch.export.ExportedProgram
    io: IoSpec
    dynamic_shapes: DynamicShapes
    name: str = "model"
    source_class: str = ""
    # hfx's call checks the inputs (names, dtypes, dims, bounds) before the graph runs; torch's
    # guard function breaks on reloaded programs whose cache input has no tensors yet (an empty
    # prefill cache), and the relations it checks stay in the graph as runtime asserts.
    _module: Any = attrs.field(
        init=False, repr=False, default=attrs.Factory(lambda self: _unchecked_module(self.program), takes_self=True)
    )

    def __call__(self, **kwargs: Any) -> Any:
        """Run the exported program on ``kwargs`` (checked against ``io``)."""
        return call(self.io, self._run, kwargs, program=f"Exported({self.name})")

    def _run(self, flat: list[Any]) -> list[Any]:
        import torch
        from torch.utils import _pytree as pytree

        _, kwargs = pytree.tree_unflatten(flat, load_spec(self.io.in_spec))
        with torch.no_grad():
            return pytree.tree_leaves(self._module(**kwargs))
