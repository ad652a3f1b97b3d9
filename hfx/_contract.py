"""Calling a program: keyword arguments in, the model's output structure out.

Every runtime runs a flat list of tensors. These functions turn a caller's
keyword arguments into that list (checking names, dtypes and shapes against
the program's ``IoSpec`` so a bad call is a clear error, not a runtime code)
and turn the flat outputs back into the model's ``ModelOutput``. A program's
``flat_call()`` (a ``FlatCall``) skips all of that, for a loop that checked
its inputs once (``hfx._flat_steps``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch.utils import _pytree as pytree

from hfx._errors import InputError
from hfx._export.constant_outputs import with_constants
from hfx._kept_positions import KEPT_DIM, KEPT_INPUT, with_every_position
from hfx._pytree import classes_in_spec, leaves_in_spec_order, registered_caches, spec_caches
from hfx._upstream import with_installed_fields, with_taken_cache_name

if TYPE_CHECKING:  # _records imports this module: the records' calls run through it
    from hfx._records import IoSpec, TensorSpec


@functools.lru_cache(maxsize=256)
def load_spec(serialised: str) -> pytree.TreeSpec:
    """Deserialise a pytree spec (memoised: specs are immutable strings); cache classes it names are registered meanwhile.

    Output fields are named as the installed transformers names them (``hfx._upstream.with_installed_fields``).
    """
    with registered_caches(classes_in_spec(serialised)):
        return with_installed_fields(pytree.treespec_loads(serialised))


def input_keys(io: IoSpec) -> tuple[str, ...]:
    """The top-level keyword arguments a program takes, in graph order."""
    return tuple(load_spec(io.in_spec).child(1).context)


def in_spec_without(io: IoSpec, dropped: Callable[[str], bool], added: Mapping[str, torch.Tensor] | None = None) -> str:
    """``io``'s serialised ``in_spec`` without the keyword arguments ``dropped`` names and with ``added`` last."""
    with spec_caches(io):
        leaves = [torch.zeros([1] * len(spec.shape)) for spec in io.inputs]
        _, kwargs = pytree.tree_unflatten(leaves, load_spec(io.in_spec))
        kwargs = {key: value for key, value in kwargs.items() if not dropped(key)}
        kwargs.update(added or {})
        return pytree.treespec_dumps(pytree.tree_structure(((), kwargs)))


def io_without_positions(io: IoSpec, /) -> IoSpec:
    """``io`` without the ``logits_to_keep`` input (nor its dim's bounds), its outputs' ``kept`` positions those of
    ``input_ids``: the contract of a graph whose positions are computed inside; ``io`` when it takes none."""
    if KEPT_INPUT not in io.input_names:
        return io
    ids = next(spec for spec in io.inputs if spec.name == "input_ids")
    outputs = [attrs.evolve(spec, shape=tuple(ids.shape[1] if dim == KEPT_DIM else dim for dim in spec.shape))
               for spec in io.outputs]
    return attrs.evolve(io, inputs=[spec for spec in io.inputs if spec.name != KEPT_INPUT], outputs=outputs,
                        in_spec=in_spec_without(io, lambda key: key == KEPT_INPUT),
                        bounds={dim: bound for dim, bound in io.bounds.items() if dim != KEPT_DIM},
                        declared_bounds={dim: b for dim, b in io.declared_bounds.items() if dim != KEPT_DIM})


def flat_inputs(io: IoSpec, kwargs: Mapping[str, Any], *, program: str) -> list[torch.Tensor]:
    """Check ``kwargs`` against ``io`` and return the graph's flat input tensors in order.

    Raises:
        InputError: an unknown or missing input, a constant with another value
            than the one baked in, or a tensor whose dtype, rank or size the
            program cannot take; the message names the input and the axis.
    """
    return checked_inputs(io, kwargs, program=program)[0]


def checked_inputs(io: IoSpec, kwargs: Mapping[str, Any], *, program: str) -> tuple[list[torch.Tensor], dict[str, int]]:
    """``flat_inputs`` and the size each named dim had in them (``{"batch": 2, "past_sequence": 9}``).

    Raises:
        InputError: as ``flat_inputs``.
    """
    keys = input_keys(io)
    kwargs = with_every_position(keys, with_taken_cache_name(kwargs, keys))
    _check_names(io, keys, kwargs, program)
    leaves = _leaves_in_captured_order(io, {k: kwargs[k] for k in keys}, program)
    sizes: dict[str, tuple[int, str]] = {}
    tensors = [leaf for leaf in leaves if leaf is not None]  # None leaves are constants of the graph
    flat = [_checked(leaf, tensor_spec, sizes, io, program) for leaf, tensor_spec in zip(tensors, io.inputs, strict=True)]
    return flat, {dim: size for dim, (size, _) in sizes.items()}


def _leaves_in_captured_order(io: IoSpec, inputs: Mapping[str, Any], program: str) -> list[Any]:
    """The pytree leaves of ``inputs`` (the program's keyword arguments, in graph order) in the order of the
    captured structure; a cache whose tensor attributes were set in another order is read by name.

    Raises:
        InputError: the structure differs otherwise.
    """
    tree = ((), dict(inputs))
    leaves, spec = pytree.tree_flatten(tree)
    want = load_spec(io.in_spec)
    if spec == want:
        return leaves
    reordered = leaves_in_spec_order(tree, want)
    if reordered is None:
        msg = f"{program}: the structure of the inputs differs from the captured one; expected {want}, got {spec}"
        raise InputError(msg)
    return reordered


def _check_names(io: IoSpec, keys: Sequence[str], kwargs: Mapping[str, Any], program: str) -> None:
    unknown = sorted(set(kwargs) - set(keys) - set(io.constants))
    if unknown:
        msg = f"{program} does not take input(s) {unknown}; it takes {list(keys)}"
        raise InputError(msg)
    missing = [k for k in keys if k not in kwargs]
    if missing:
        msg = f"{program} needs input(s) {missing}; it takes {list(keys)} and was given {sorted(kwargs)}"
        raise InputError(msg)
    for key in set(kwargs) & set(io.constants):
        if kwargs[key] != io.constants[key]:
            msg = (
                f"{program} was exported with {key}={io.constants[key]!r} baked in; got {key}={kwargs[key]!r}. "
                f"Capture again with {key}={kwargs[key]!r} to export that variant."
            )
            raise InputError(msg)


def _checked(
    leaf: Any, spec: TensorSpec, sizes: dict[str, tuple[int, str]], io: IoSpec, program: str
) -> torch.Tensor:
    """``leaf`` as a contiguous tensor of ``spec``'s dtype, after checking its shape."""
    if not isinstance(leaf, torch.Tensor):
        msg = f"{program}: input {spec.name!r} must be a tensor, got {type(leaf).__name__}"
        raise InputError(msg)
    dtype = getattr(torch, spec.dtype)
    if leaf.dtype != dtype:
        if leaf.dtype.is_floating_point != dtype.is_floating_point or leaf.dtype == torch.bool:
            msg = f"{program}: input {spec.name!r} must be {spec.dtype}, got {str(leaf.dtype).removeprefix('torch.')}"
            raise InputError(msg)
        leaf = leaf.to(dtype)
    if leaf.ndim != len(spec.shape):
        msg = f"{program}: input {spec.name!r} must have {len(spec.shape)} dims {list(spec.shape)}, got {list(leaf.shape)}"
        raise InputError(msg)
    for axis, (want, got) in enumerate(zip(spec.shape, leaf.shape)):
        _check_axis(spec.name, axis, want, int(got), sizes, io, program)
    return leaf.detach().contiguous()


def _check_axis(
    name: str, axis: int, want: int | str, got: int, sizes: dict[str, tuple[int, str]], io: IoSpec, program: str
) -> None:
    if isinstance(want, int):
        if want != got:
            msg = f"{program}: axis {axis} of input {name!r} is static {want}, got {got}. Export with that axis dynamic."
            raise InputError(msg)
        return
    seen = sizes.setdefault(want, (got, name))
    if seen[0] != got:
        msg = f"{program}: axis {axis} of {name!r} ({want}) is {got} but {seen[0]} in {seen[1]!r}; they must agree"
        raise InputError(msg)
    lo, hi = io.bounds.get(want, (0, None))
    if got < lo or (hi is not None and got > hi):
        msg = f"{program}: axis {axis} of input {name!r} ({want}) is {got}, outside the program's bounds [{lo}, {hi}]. "
        asked_lo, asked_hi = io.declared_bounds.get(want, (lo, hi))
        if asked_lo <= got and (asked_hi is None or got <= asked_hi):
            msg += (f"It was exported with [{asked_lo}, {asked_hi}]; torch.export narrowed that while tracing the "
                    f"model's code, which branches on or reshapes by this size at the capture's size. Capture "
                    f"inputs of size {got} to export a program for it.")
        else:
            msg += f"Export again with bounds={{{want!r}: ({min(got, lo)}, {max(got, hi or got)})}} to accept it."
        raise InputError(msg)


def structured_outputs(io: IoSpec, flat: Sequence[Any]) -> Any:
    """Rebuild the model's output structure (a ``ModelOutput``) from the flat outputs (and ``io.constant_outputs``)."""
    return pytree.tree_unflatten(with_constants(flat, io.constant_outputs), load_spec(io.out_spec))


def call(io: IoSpec, run: Callable[[list[torch.Tensor]], Sequence[Any]], kwargs: Mapping[str, Any], *, program: str) -> Any:
    """Check ``kwargs``, run the flat graph with ``run`` and return the model's output structure.

    Cache classes named by the program's specs are pytree nodes for the length of the call.
    """
    with spec_caches(io):
        flat = flat_inputs(io, kwargs, program=program)
        outputs = list(run(flat))
        if len(outputs) != len(io.outputs):
            msg = f"{program} returned {len(outputs)} outputs, its spec has {len(io.outputs)}"
            raise InputError(msg)
        returned = load_spec(io.out_spec).num_leaves - len(io.constant_outputs)
        if len(outputs) > returned:
            _write_back(io, kwargs, outputs[returned:], program)
        return structured_outputs(io, outputs[:returned])


def _write_back(io: IoSpec, kwargs: Mapping[str, Any], values: Sequence[Any], program: str) -> None:
    """Give the caller's in-place inputs their new values (for runtimes that return them).

    A new value of the same dtype and shape becomes the tensor's storage
    (``set_``, no copy); anything else is copied in.
    """
    keys = input_keys(io)
    kwargs = with_taken_cache_name(kwargs, keys)
    inputs = {k: kwargs[k] for k in keys}
    leaves = [leaf for leaf in _leaves_in_captured_order(io, inputs, program) if leaf is not None]
    by_name = dict(zip(io.input_names, leaves))
    with torch.no_grad():
        for name, value in zip(io.updates, values):
            target, value = by_name[name], torch.as_tensor(value)
            if value.dtype == target.dtype and value.shape == target.shape and value.is_contiguous():
                target.set_(value)
            else:
                target.copy_(value)


def _same(value: Any) -> Any:
    return value


@attrs.frozen(kw_only=True, eq=False)
class FlatCall:
    """A program's call on flat values in its runtime's own form, with nothing checked: what a loop runs per step.

    ``run(values)`` takes the values of ``io.inputs``, in order, and returns those
    of ``io.outputs``, in order, both in the runtime's form: a torch tensor becomes
    one with ``to_runtime`` (after the program's own call checked it, or a loop
    checked its like once), and an output goes back in as an input as it is, so a
    KV cache handed from step to step stays in the runtime's buffers (ONNX Runtime
    ``OrtValue``s, OpenVINO tensors). ``to_torch`` gives an output as a torch tensor.
    A program's ``flat_call()`` makes one; the runtime's failures raise the
    ``LoweringError`` its own call raises. Unlike ``program(**kwargs)`` it checks
    nothing: a wrong value is the runtime's error, or a wrong result.

    Example:
        >>> import torch, hfx
        >>> linear = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> flat = linear.flat_call()
        >>> [flat.to_torch(out).shape for out in flat.run([flat.to_runtime(torch.ones(5, 3))])]
        [torch.Size([5, 4])]
    """

    io: IoSpec
    run: Callable[[Sequence[Any]], Sequence[Any]]
    to_runtime: Callable[[torch.Tensor], Any] = _same
    to_torch: Callable[[Any], torch.Tensor] = _same
