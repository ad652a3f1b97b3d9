"""The decode loop's calls of one program: checked while the loop learns its steps, then flat.

``hfx.generate`` calls its decode program once per new token. The program's own
call (``program(**kwargs)``, ``hfx._contract.call``) checks every input against
the ``IoSpec``, flattens the cache through pytree, converts it to the runtime's
form and builds the ``ModelOutput`` and its cache again: on a small model that
takes longer than the runtime's call. From one step of a loop to the next only
sizes change, and each grows by the same amount every step. ``DecodeSteps``
therefore makes the first ``CHECKED_STEPS`` calls through the program's own
call. From their checks it learns how much each named dim grows per step and
how many more steps stay within the program's bounds. Those steps run the
program's ``FlatCall`` (``program.flat_call()``) on the values a ``StepPlan``
picks: the loop's new tensors, and the outputs of the step before (a KV cache)
as they are, in the runtime's own buffers. The step after the last one the
checks cover is a checked call again, so an input beyond a bound raises the
program's own error, which names the dim.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch.utils import _pytree as pytree

from hfx._contract import FlatCall, checked_inputs, input_keys, load_spec
from hfx._errors import InputError
from hfx._upstream import cache_argument, output_cache

if TYPE_CHECKING:
    from hfx._records import IoSpec, TensorSpec

#: Calls checked before the flat ones: two, to measure how much each dim grows per step.
CHECKED_STEPS = 2


def step_inputs(program: Any, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``program`` takes, picked from the loop's state.

    Raises:
        InputError: the state lacks one; names the component and the inputs.
    """
    keys = input_keys(program.io)
    missing = [k for k in keys if k not in values]
    if missing:
        msg = f"generate: component {name!r} takes {missing}, which generate cannot build; pass them as inputs"
        raise InputError(msg)
    return {k: values[k] for k in keys}


@attrs.frozen(kw_only=True, eq=False)
class StepPlan:
    """Where each flat input of a step comes from, and which output the loop reads.

    ``fed``: ``(key, first position, leaves)`` of each keyword argument taken from
    the loop's state. ``carried``: ``(input position, output position)`` pairs, each
    an output that is an input's value at the next step (a dynamic cache's
    ``present.*`` for its ``past_key_values.*``, a static cache's ``updated.*``);
    a key whose leaves are all carried is not fed. ``cache``: the cache's key, first
    position and spec, to build the cache object again (``None`` without a cache).
    ``logits``: the position of the output the next token is picked from.
    ``dtypes``: each input's dtype.
    """

    fed: tuple[tuple[str, int, int], ...]
    carried: tuple[tuple[int, int], ...]
    logits: int
    dtypes: tuple[torch.dtype, ...]
    cache: tuple[str, int, pytree.TreeSpec] | None = None


def step_plan(io: IoSpec) -> StepPlan | None:
    """The ``StepPlan`` of a program's steps, or ``None`` when its outputs cannot be its next inputs as they are.

    The outputs fed back must have the structure (for a cache) and each the dtype,
    rank and static sizes of the inputs they become.

    Example:
        >>> import torch, hfx
        >>> linear = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> step_plan(linear.io)
        StepPlan(fed=(('input', 0, 1),), carried=(), logits=0, dtypes=(torch.float32,), cache=None)
    """
    arguments = load_spec(io.in_spec).child(1)
    keys = list(arguments.context)
    starts = list(itertools.accumulate((child.num_leaves for child in arguments.children()), initial=0))
    outputs = load_spec(io.out_spec)
    logits = _logits_position(outputs)
    if starts[-1] != len(io.inputs) or logits is None or io.constant_outputs:  # constants: leaf != graph output
        return None
    key = cache_argument(keys)
    index = keys.index(key) if key is not None else None
    carried = _cache_pairs(arguments, outputs, index, starts) + _update_pairs(io, outputs.num_leaves)
    cache = None if index is None else (key, starts[index], arguments.child(index))
    inside = range(starts[index], starts[index + 1]) if index is not None else range(0)
    if not all(i in inside and _same_form(io.inputs[i], io.outputs[o]) for i, o in carried):
        return None
    fed_positions = set(range(len(io.inputs))) - {i for i, _ in carried}
    fed = tuple((k, starts[n], starts[n + 1] - starts[n]) for n, k in enumerate(keys)
                if fed_positions & set(range(starts[n], starts[n + 1])))
    return StepPlan(fed=fed, carried=carried, logits=logits, cache=cache,
                    dtypes=tuple(getattr(torch, spec.dtype) for spec in io.inputs))


def _named_children(spec: pytree.TreeSpec) -> list[str]:
    """The field names of a ``ModelOutput`` (or dict) node's children; ``[]`` for any other node."""
    context = spec.context
    return list(context) if isinstance(context, list) and all(isinstance(k, str) for k in context) else []


def _logits_position(outputs: pytree.TreeSpec) -> int | None:
    """The flat position of the logits: the one output of a tensor-valued graph, or the ``logits`` field."""
    if outputs.is_leaf():
        return 0
    names = _named_children(outputs)
    if "logits" not in names or not outputs.child(names.index("logits")).is_leaf():
        return None
    return sum(outputs.child(n).num_leaves for n in range(names.index("logits")))


def _cache_pairs(arguments: pytree.TreeSpec, outputs: pytree.TreeSpec, index: int | None,
                 starts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``(input, output)`` positions of a cache the graph returns with the structure it takes."""
    names = _named_children(outputs)
    field = cache_argument(names)
    if index is None or field is None or outputs.child(names.index(field)) != arguments.child(index):
        return ()
    first = sum(outputs.child(n).num_leaves for n in range(names.index(field)))
    count = starts[index + 1] - starts[index]
    return tuple(zip(range(starts[index], starts[index] + count), range(first, first + count), strict=True))


def _update_pairs(io: IoSpec, returned: int) -> tuple[tuple[int, int], ...]:
    """``(input, output)`` positions of the inputs a graph writes, returned after its outputs (``io.updates``)."""
    trailing = len(io.outputs) - returned
    if not trailing or trailing != len(io.updates):
        return ()
    names = io.input_names
    return tuple((names.index(name), returned + n) for n, name in enumerate(io.updates))


def _same_form(given: TensorSpec, taken: TensorSpec) -> bool:
    """Whether an output of spec ``given`` can be an input of spec ``taken``: dtype, rank and static sizes."""
    return given.dtype == taken.dtype and len(given.shape) == len(taken.shape) and all(
        a == b for a, b in zip(given.shape, taken.shape, strict=True) if isinstance(a, int) or isinstance(b, int))


def steps_within_bounds(bounds: Mapping[str, tuple[int, int | None]], first: Mapping[str, int],
                        second: Mapping[str, int]) -> int:
    """How many steps after ``second`` keep every named dim within ``bounds``, each growing as from ``first`` to ``second``.

    A dim that shrank (the steps are not alike) gives 0.

    Example:
        >>> steps_within_bounds({"past": (0, 10), "batch": (1, None)}, {"past": 4, "batch": 2}, {"past": 5, "batch": 2})
        5
    """
    if first.keys() != second.keys():
        return 0
    left = sys.maxsize
    for dim, size in second.items():
        growth = size - first[dim]
        if growth < 0:
            return 0
        high = bounds.get(dim, (0, None))[1]
        if growth and high is not None:
            left = min(left, max(high - size, 0) // growth)
    return left


def flat_step(plan: StepPlan, call: FlatCall, state: Mapping[str, Any], carried: Sequence[Any],
              converted: dict[str, tuple[Any, list[Any]]]) -> tuple[torch.Tensor, list[Any]]:
    """One step on the flat path: ``(logits as a torch tensor, the values carried to the next step)``.

    ``state`` holds the step's keyword arguments, ``carried`` the values of
    ``plan.carried``'s inputs (the outputs of the step before, in the runtime's
    form). ``converted`` keeps, per key, the last object converted and its runtime
    values: an object the loop did not replace is not converted again. Nothing is
    checked: ``DecodeSteps`` calls it only on steps its checks cover.
    """
    values: list[Any] = [None] * len(plan.dtypes)
    for key, start, count in plan.fed:
        values[start:start + count] = _runtime_values(plan, call, key, start, count, state[key], converted)
    for (position, _), value in zip(plan.carried, carried, strict=True):
        values[position] = value
    outputs = call.run(values)
    return call.to_torch(outputs[plan.logits]), [outputs[position] for _, position in plan.carried]


def _runtime_values(plan: StepPlan, call: FlatCall, key: str, start: int, count: int, value: Any,
                    converted: dict[str, tuple[Any, list[Any]]]) -> list[Any]:
    last = converted.get(key)
    if last is not None and last[0] is value:
        return last[1]
    if isinstance(value, torch.Tensor) and count == 1:  # the loop's new tensors, every step: the short way
        runtime = [call.to_runtime(_as_input(value, plan.dtypes[start]))]
    else:
        leaves = [value] if isinstance(value, torch.Tensor) else pytree.tree_leaves(value)
        if len(leaves) != count:
            msg = f"generate: input {key!r} has {len(leaves)} tensors at this step, {count} at the steps before"
            raise InputError(msg)
        runtime = [call.to_runtime(_as_input(leaf, plan.dtypes[start + n])) for n, leaf in enumerate(leaves)]
    converted[key] = (value, runtime)
    return runtime


def _as_input(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` as the program's own call hands it to the runtime: its input's dtype, contiguous."""
    return (tensor if tensor.dtype == dtype else tensor.to(dtype)).contiguous()


class DecodeSteps:
    """``steps(state) -> logits``: the decode loop's calls of one program, its cache handed from step to step.

    The first ``CHECKED_STEPS`` calls are ``run(**kwargs)``, ``run`` being the
    program or its session (every check; the returned cache goes into
    ``state[cache_key]``). Their checks tell how much each named dim grows per
    step and so how many more steps stay within the program's bounds; those run
    ``flat_step`` on ``run.flat_call()``, the cache carried in the runtime's form.
    The step after them builds the cache object into ``state`` again and is
    checked, as is every later one: a dim beyond its bound raises the program's
    own ``InputError``. A program without ``flat_call``, or whose outputs are not
    its next inputs as they are (``step_plan`` is ``None``), is always checked.
    It holds the loop's state between steps: one object per loop, not shared.
    """

    __slots__ = ("_carried", "_converted", "_flat", "_left", "_sizes", "cache_key", "name", "plan", "program", "run")

    def __init__(self, program: Any, run: Any, *, cache_key: str | None, name: str = "decode") -> None:
        self.program, self.run, self.cache_key, self.name = program, run, cache_key, name
        self.plan = step_plan(program.io)
        flat_call = getattr(run, "flat_call", None)
        self._flat: FlatCall | None = flat_call() if self.plan is not None and flat_call is not None else None
        self._sizes: list[dict[str, int]] = []
        self._left: int | None = None  # flat steps the checks cover; None while checking
        self._carried: list[Any] = []
        self._converted: dict[str, tuple[Any, list[Any]]] = {}

    @property
    def is_flat(self) -> bool:
        """Whether the next step runs flat."""
        return bool(self._left)

    def __call__(self, state: dict[str, Any]) -> torch.Tensor:
        """Run one step on ``state`` (the loop's inputs of that step); its logits."""
        if self._left:
            self._left -= 1
            logits, self._carried = flat_step(self.plan, self._flat, state, self._carried, self._converted)
            return logits
        if self._left == 0:
            self._back_to_checked(state)
        kwargs = step_inputs(self.program, self.name, state)
        outputs = self.run(**kwargs)
        if self._flat is not None:
            self._learn(kwargs, outputs)
        if isinstance(outputs, torch.Tensor):
            return outputs
        # A static cache is updated in place and not returned: keep the one passed in.
        if self.cache_key is not None:
            state[self.cache_key] = output_cache(outputs) or state[self.cache_key]
        return outputs.logits

    def _learn(self, kwargs: Mapping[str, Any], outputs: Any) -> None:
        """Keep the sizes a checked call had; after ``CHECKED_STEPS``, start carrying its outputs."""
        flat, sizes = checked_inputs(self.program.io, kwargs, program=self.name)
        self._sizes.append(sizes)
        if len(self._sizes) < CHECKED_STEPS:
            return
        self._left = steps_within_bounds(self.program.io.bounds, *self._sizes[-2:])
        leaves = pytree.tree_leaves(outputs)
        # An input the graph wrote (a static cache's) holds its new value: the call copied it back.
        self._carried = [self._flat.to_runtime(_as_input(leaves[o] if o < len(leaves) else flat[i], self.plan.dtypes[i]))
                         for i, o in self.plan.carried]

    def _back_to_checked(self, state: dict[str, Any]) -> None:
        """Put the carried cache back into ``state`` as the object the checked call takes; check from now on."""
        if self.plan.cache is not None and self._carried:
            key, start, spec = self.plan.cache
            leaves = pytree.tree_leaves(state[key])
            for (position, _), value in zip(self.plan.carried, self._carried, strict=True):
                leaves[position - start] = self._flat.to_torch(value)
            state[key] = pytree.tree_unflatten(leaves, spec)
        self._flat, self._left, self._carried = None, None, []
