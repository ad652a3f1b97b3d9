"""Immutable records that flow between hfx stages."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Self

import attrs

from hfx._contract import FlatCall, call, load_spec


def readonly(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Return a read-only copy of ``mapping`` (the caller's dict is never shared)."""
    return MappingProxyType(dict(mapping or {}))


def _readonly_nested(mapping: Mapping[str, Mapping[Any, Any]] | None) -> Mapping[str, Mapping[Any, Any]]:
    """``readonly`` on ``mapping`` and on each of its values."""
    return readonly({k: readonly(v) for k, v in dict(mapping or {}).items()})


@attrs.frozen(kw_only=True)
class DynamicShapes:
    """Named dynamic axes of a program's inputs and the bounds of each name.

    ``axes`` maps an input's leaf name (``"input_ids"``, ``"pixel_values"``) to
    ``{axis: dim name}``; every input that shares an axis shares its name.
    ``bounds`` maps a dim name to ``(min, max)``; ``max`` is ``None`` when unbounded.
    """

    axes: Mapping[str, Mapping[int, str]] = attrs.field(factory=dict, converter=_readonly_nested)
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
    ``constant_outputs`` are the ``(leaf index, value)`` of output leaves that
    are not tensors (``None``): no graph returns them, the call puts them back
    (``hfx._export.constant_outputs``). ``declared_bounds`` holds, for each dim
    whose ``bounds`` torch.export narrowed while tracing the model's code (a
    branch or a view on that size, taken at the capture's size), the bounds it
    was exported with.
    """

    inputs: tuple[TensorSpec, ...] = attrs.field(converter=tuple)
    outputs: tuple[TensorSpec, ...] = attrs.field(converter=tuple)
    in_spec: str
    out_spec: str
    constants: Mapping[str, Any] = attrs.field(factory=dict, converter=readonly)
    bounds: Mapping[str, tuple[int, int | None]] = attrs.field(factory=dict, converter=readonly)
    updates: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    constant_outputs: tuple[tuple[int, Any], ...] = attrs.field(
        default=(), converter=lambda pairs: tuple((int(i), _json_constant(v)) for i, v in pairs))
    declared_bounds: Mapping[str, tuple[int, int | None]] = attrs.field(factory=dict, converter=readonly)

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
            "constant_outputs": [list(pair) for pair in self.constant_outputs],
            "declared_bounds": {k: list(v) for k, v in self.declared_bounds.items()},
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
            constant_outputs=data.get("constant_outputs", ()),
            declared_bounds={k: tuple(v) for k, v in data.get("declared_bounds", {}).items()},
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


def _mapping_or_value(value: Any) -> Any:
    """A read-only copy of a mapping (``None``: empty); any other value is left for the field's validator to name."""
    return readonly(value) if value is None or isinstance(value, Mapping) else value


def _nested_or_value(value: Any) -> Any:
    """``_mapping_or_value`` for a mapping of mappings: both levels read-only."""
    if value is None or (isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values())):
        return _readonly_nested(value)
    return value


def _plain(value: Any) -> Any:
    """``value`` as ``json.loads`` gives it back: a record as the dict of its fields, every mapping as a ``dict``,
    every sequence as a ``list``."""
    if attrs.has(type(value)):
        return {field.name: _plain(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json_ready(instance: Any, attribute: Any, value: Any) -> None:
    """Validator: ``value`` holds JSON values only (it is saved in the manifest)."""
    try:
        json.dumps(_plain(value))
    except (TypeError, ValueError) as exc:
        msg = f"{type(instance).__name__}.{attribute.name} must hold JSON values only (it is saved in hfx.json): {exc}"
        raise TypeError(msg) from exc


def _mapping(values: type = object, *validators: Any, converter: Any = _mapping_or_value) -> Any:
    """A field holding a read-only ``{str: values}`` mapping, empty by default, checked by ``validators`` too."""
    each = attrs.validators.deep_mapping(
        attrs.validators.instance_of(str), attrs.validators.instance_of(values), attrs.validators.instance_of(Mapping)
    )
    return attrs.field(factory=dict, converter=converter, validator=[each, *validators])


def _optional(kind: type) -> Any:
    """Validator: ``None`` or a ``kind``."""
    return attrs.validators.optional(attrs.validators.instance_of(kind))


class _FieldsJson:
    """``to_json`` / ``from_json`` for a record whose fields are JSON values and read-only mappings of them."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, one key per field."""
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The inverse of ``to_json``."""
        return cls(**data)


@attrs.frozen(kw_only=True)
class GenerationSettings(_FieldsJson):
    """What the decode loop takes from the model besides its graphs.

    ``config`` is the generation config as JSON, every key
    (``GenerationConfig.to_json_string(use_diff=False)``): ``generate`` reads its
    EOS and pad tokens, calibration rebuilds it. ``returns_start_token`` is false
    for a model whose ``generate()`` leaves the decoder start token out (Whisper).
    ``prompts_the_decoder`` is true for an encoder-decoder whose main input is not
    ``input_ids`` (an image or audio encoder): ``generate()`` starts its decoder from
    the ``input_ids`` it is given (PP-FormulaNet).
    """

    config: Mapping[str, Any] = _mapping(object, _json_ready)
    decoder_start_token_id: int | None = attrs.field(default=None, validator=_optional(int))
    is_encoder_decoder: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    returns_start_token: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    prompts_the_decoder: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen(kw_only=True)
class ComponentRoles(_FieldsJson):
    """Which component does what in ``generate``.

    ``feature_encoders`` maps an encoder component to the modality it encodes
    (``{"image_encoder": "image"}``); ``projectors`` maps a modality to the
    component that projects its features; ``cache_input`` names the cache
    argument of the decode graph (``past_key_values``; ``cache_params`` for
    Mamba); ``placeholder_tokens`` maps a modality to the token id its features
    replace in the prompt; ``internal_cache_length`` is the positions of the KV
    cache a decode graph keeps in its own buffers (``decompose(internal_cache_length=...)``,
    ``forward(tokens, input_pos)``), ``None`` when the cache is an input.
    ``whole_sequence_steps``: each decode step takes every token so far with the cache, and the model
    drops the cached ones itself (CPM-Ant), not the new token alone. A cache-free model's
    ``appended_tokens`` follow the sequence in every call (XLM's mask token, whose logits are the next
    token's), and ``token_fills`` are per-token inputs of one value (XLM's ``langs``).
    """

    feature_encoders: Mapping[str, str] = _mapping(str)
    projectors: Mapping[str, str] = _mapping(str)
    cache_input: str | None = attrs.field(default=None, validator=_optional(str))
    placeholder_tokens: Mapping[str, int] = _mapping(int)
    internal_cache_length: int | None = attrs.field(default=None, validator=_optional(int))
    whole_sequence_steps: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    appended_tokens: tuple[int, ...] = attrs.field(
        default=(), converter=tuple, validator=attrs.validators.deep_iterable(attrs.validators.instance_of(int)))
    token_fills: Mapping[str, int] = _mapping(int)


@attrs.frozen(kw_only=True)
class ModelSpec(_FieldsJson):
    """The model's class name and config: enough to build a weightless copy of it.

    ``generate`` computes a prompt's M-RoPE position ids (Qwen2-VL) with the
    model's own ``get_rope_index``, on a copy built on the ``meta`` device.
    """

    class_name: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    config: Mapping[str, Any] = _mapping(object, _json_ready)


@attrs.frozen(kw_only=True)
class EncoderInputs(_FieldsJson):
    """How ``generate`` builds the inputs of a packed-image encoder (a Qwen2-VL-style tower).

    ``names`` maps an input of the encoder graph to the ``generate`` input it
    takes (``{"hidden_states": "pixel_values", "grid_thw": "image_grid_thw"}``);
    ``computed`` maps each ``transformers.vision_utils`` getter the tower ran to
    its options, with which ``generate`` computes that getter's inputs for new images.
    """

    names: Mapping[str, str] = _mapping(str)
    computed: Mapping[str, Mapping[str, Any]] = _mapping(Mapping, _json_ready, converter=_nested_or_value)


@attrs.frozen(kw_only=True)
class GenerationMeta(_FieldsJson):
    """What the components of one model share and ``generate`` needs besides the graphs; saved in the manifest.

    ``decompose`` fills it; a ``Components`` made another way (one program)
    holds the defaults: no generation config, no roles.

    Attributes:
        generation: the generation config, the decoder start token, whether the
            model is an encoder-decoder and whether its ``generate()`` returns the start token.
        roles: which component encodes which modality, the projectors, the cache
            input and the placeholder tokens.
        model: the model's class and config (M-RoPE prompt positions are computed on a weightless copy).
        encoder_inputs: per packed-image encoder component, how its inputs are built.
        quantization: what a ``hfx.quantize`` stage did
            (``{"stage": "quantize_onnx", "mode": "static", "calibrated": True}``); empty when none ran.
        extra: the JSON facts given to ``save(meta=...)`` (a model id ...).

    Example:
        >>> meta = GenerationMeta(generation=GenerationSettings(is_encoder_decoder=True, decoder_start_token_id=0))
        >>> GenerationMeta.from_json(meta.to_json()) == meta
        True
        >>> old = GenerationMeta.from_json({"cache_input": "cache_params", "model_id": "x"})  # a schema 1 manifest's
        >>> old.roles.cache_input, dict(old.extra)
        ('cache_params', {'model_id': 'x'})
    """

    generation: GenerationSettings = attrs.field(
        factory=GenerationSettings, validator=attrs.validators.instance_of(GenerationSettings)
    )
    roles: ComponentRoles = attrs.field(factory=ComponentRoles, validator=attrs.validators.instance_of(ComponentRoles))
    model: ModelSpec = attrs.field(factory=ModelSpec, validator=attrs.validators.instance_of(ModelSpec))
    encoder_inputs: Mapping[str, EncoderInputs] = _mapping(EncoderInputs)
    quantization: Mapping[str, Any] = _mapping(object, _json_ready)
    extra: Mapping[str, Any] = _mapping(object, _json_ready)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerationMeta:
        """The inverse of ``to_json``; also reads the flat dict of schema 1 manifests (hfx before this record).

        Raises:
            ValueError: ``data`` does not describe a ``GenerationMeta`` (the message names the field).
        """
        if not isinstance(data, Mapping):
            msg = f"GenerationMeta.from_json takes a dict, got {type(data).__name__}"
            raise ValueError(msg)
        try:
            if set(data) != {field.name for field in attrs.fields(cls)}:
                return _flat_meta(data)
            return cls(
                generation=GenerationSettings.from_json(data["generation"]),
                roles=ComponentRoles.from_json(data["roles"]),
                model=ModelSpec.from_json(data["model"]),
                encoder_inputs={name: EncoderInputs.from_json(how) for name, how in data["encoder_inputs"].items()},
                quantization=data["quantization"],
                extra=data["extra"],
            )
        except KeyError as exc:
            msg = f"GenerationMeta.from_json: no {exc} in {dict(data)!r:.200}"
            raise ValueError(msg) from exc
        except (TypeError, ValueError, AttributeError) as exc:
            msg = f"GenerationMeta.from_json: {exc.args[0] if exc.args else exc}"  # attrs' validators add the field to args
            raise ValueError(msg) from exc


def _flat_meta(data: Mapping[str, Any]) -> GenerationMeta:
    """A ``GenerationMeta`` from the flat dict of schema 1 manifests; a key it does not know was a ``save(meta=...)`` fact."""
    flat = dict(data)
    take = flat.pop
    generation = GenerationSettings(
        config=take("generation_config", {}),
        decoder_start_token_id=take("decoder_start_token_id", None),
        is_encoder_decoder=take("is_encoder_decoder", False),
        returns_start_token=take("returns_start_token", True),
    )
    roles = ComponentRoles(
        feature_encoders=take("feature_encoders", {}),
        projectors=take("projectors", {}),
        cache_input=take("cache_input", None),
        placeholder_tokens=take("placeholder_tokens", {}),
    )
    encoder_inputs = {
        name: EncoderInputs(names=how["names"], computed={getter: entry["options"] for getter, entry in how["computed"].items()})
        for name, how in take("encoder_inputs", {}).items()
    }
    model = ModelSpec(class_name=take("model_class", ""), config=take("config", {}))
    return GenerationMeta(generation=generation, roles=roles, model=model, encoder_inputs=encoder_inputs,
                          quantization=take("quantization", {}), extra=flat)


@attrs.frozen(kw_only=True, eq=False)
class Components(Mapping[str, Any]):
    """An ordered, read-only mapping of component name to record (``Capture``, ``Exported``, a program).

    ``meta`` is what the components share and ``generate`` needs (a
    ``GenerationMeta``: the generation config, the component roles ...); it is
    saved in the manifest. ``processor`` is an optional tokenizer or processor
    saved alongside.
    """

    items_: Mapping[str, Any] = attrs.field(converter=readonly, alias="items")
    meta: GenerationMeta = attrs.field(factory=GenerationMeta, validator=attrs.validators.instance_of(GenerationMeta))
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
    """``program.module()`` without torch's per-call input-constraint hook, its outputs built with the installed classes.

    hfx's call checks the same names, dtypes, dims and bounds before the graph
    runs; torch's hook re-derives them with sympy on every call, which took
    half the time of a tiny model's decode step (measured: 2.3 ms of which
    1.1 ms in ``_check_input_constraints_pre_hook``).
    """
    from torch.export._unlift import _check_input_constraints_pre_hook

    from hfx._upstream import with_installed_fields

    module = program.module(check_guards=False)
    module._out_spec = with_installed_fields(module._out_spec)  # noqa: SLF001 - a program saved by another transformers
    for key, hook in list(module._forward_pre_hooks.items()):  # noqa: SLF001
        if hook is _check_input_constraints_pre_hook:
            del module._forward_pre_hooks[key]  # noqa: SLF001
            module._forward_pre_hooks_with_kwargs.pop(key, None)  # noqa: SLF001
    return module


def _flat_graph(program: Any, inputs: int) -> tuple[Any, Any] | None:
    """``(graph module, args(flat) -> its arguments)`` for a program that reads its weights and the ``inputs``
    flat inputs and writes nothing back; ``None`` otherwise (the unlifted module then copies the writes back).

    Called this way the graph skips the unlifted module's pytree flattening of the inputs and outputs, which
    hfx's call has done already (measured on the zoo's Llama decode: 0.9 ms of hfx's time per step before).
    """
    from torch.export.graph_signature import InputKind, OutputKind

    signature = program.graph_signature
    if any(spec.kind != OutputKind.USER_OUTPUT for spec in signature.output_specs):
        return None
    tensors = {**program.state_dict, **program.constants}
    kinds = [spec.kind for spec in signature.input_specs]
    if kinds.count(InputKind.USER_INPUT) != inputs or any(
            kind not in (InputKind.USER_INPUT, InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
            for kind in kinds):
        return None
    slots = [None if kind == InputKind.USER_INPUT else tensors[spec.target]
             for kind, spec in zip(kinds, signature.input_specs, strict=True)]

    def arguments(flat: list[Any]) -> list[Any]:
        user = iter(flat)
        return [next(user) if slot is None else slot for slot in slots]

    return program.graph_module, arguments


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

    _graph: Any = attrs.field(
        init=False, repr=False, default=attrs.Factory(lambda self: _flat_graph(self.program, len(self.io.inputs)), takes_self=True)
    )

    def __call__(self, **kwargs: Any) -> Any:
        """Run the exported program on ``kwargs`` (checked against ``io``)."""
        return call(self.io, self._run, kwargs, program=f"Exported({self.name})")

    def flat_call(self) -> FlatCall:
        """The program on flat torch tensors, nothing checked (``hfx._contract.FlatCall``): what ``hfx.generate`` runs per step."""
        return FlatCall(io=self.io, run=self._run)

    def _run(self, flat: list[Any]) -> list[Any]:
        import torch
        from torch.utils import _pytree as pytree

        if self._graph is not None:
            module, weights = self._graph
            with torch.no_grad():
                return list(module(*weights(flat)))
        _, kwargs = pytree.tree_unflatten(flat, load_spec(self.io.in_spec))
        with torch.no_grad():
            return pytree.tree_leaves(self._module(**kwargs))
