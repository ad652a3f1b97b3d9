"""Cache classes as pytree nodes, found by reflection and registered only while hfx needs them.

``torch.export`` flattens every input and output into tensors with
``torch.utils._pytree``; a transformers ``Cache`` (``DynamicCache``,
``StaticCache``, ``EncoderDecoderCache``, the SSM caches, a model's own cache
class) and its layers are not pytree nodes. ``registered_caches`` registers
every cache and cache-layer class it finds with one generic flatten: attributes
that hold tensors (or other caches) are children, the rest is a JSON-ready
context. It deregisters on exit what it registered, so nothing stays in torch's
registry after a stage (and nothing is registered at import).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hfx._upstream import graph_name


def _subclasses(root: type) -> list[type]:
    found = []
    for sub in root.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def cache_classes(model: torch.nn.Module | None = None) -> tuple[type, ...]:
    """Every transformers cache and cache-layer class, plus the ``*Cache`` classes of ``model``'s module."""
    from transformers import cache_utils

    roots = [cache_utils.Cache, cache_utils.CacheLayerMixin]
    roots += [getattr(cache_utils, name) for name in ("LinearAttentionCacheLayerMixin",) if hasattr(cache_utils, name)]
    classes = {cls: None for root in roots for cls in (root, *_subclasses(root))}
    if model is not None:
        module = sys.modules.get(type(model).__module__)
        for value in vars(module).values() if module else ():
            if isinstance(value, type) and value.__name__.endswith("Cache") and value.__module__ == module.__name__:
                classes[value] = None
    return tuple(classes)


def is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers cache object (or a model's own ``*Cache``)."""
    from transformers.cache_utils import Cache

    return isinstance(value, Cache) or (type(value).__name__.endswith("Cache") and hasattr(value, "__dict__"))


def _holds_nodes(value: Any, classes: frozenset[type]) -> bool:
    """Whether ``value`` contains a tensor or a cache object (so it must be a pytree child)."""
    if isinstance(value, torch.Tensor) or type(value) in classes:
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_nodes(v, classes) for v in value)
    if isinstance(value, dict):
        return any(_holds_nodes(v, classes) for v in value.values())
    return False


# Attributes that restate a tensor's batch size (``StaticLayer.batch_size``). They are not part of
# the structure: a static-cache prefill sets them to a symbolic size, and a cache of another batch
# must match the same graph. Unflattening sets them from the first tensor.
_BATCH_ATTRIBUTES = frozenset({"batch_size", "max_batch_size"})


class _Context:
    """A cache node's pytree context: child attribute names, static attributes, batch attributes."""

    __slots__ = ("batch", "children", "static")

    def __init__(self, children: tuple[str, ...], static: tuple[tuple[str, Any], ...], batch: tuple[str, ...]) -> None:
        self.children, self.static, self.batch = children, static, batch

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Context) and (self.children, self.static) == (other.children, other.static)

    def __hash__(self) -> int:
        return hash((self.children, repr(self.static)))

    def __repr__(self) -> str:
        return repr((self.children, self.static))


def _copied(value: Any) -> Any:
    """``value`` with its dicts and lists copied, so a node and its context share no mutable container."""
    # A traced forward writes into an SSM cache layer's ``has_previous_state`` / ``conv_states`` dicts;
    # shared with the context, the write would leak into the caller's cache and into the treespec.
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def _flatten(classes: frozenset[type], obj: Any) -> tuple[list[Any], Any]:
    state = vars(obj)
    children = tuple(k for k, v in state.items() if _holds_nodes(v, classes))
    batch = tuple(k for k in state if k in _BATCH_ATTRIBUTES and k not in children)
    static = tuple((k, _copied(v)) for k, v in state.items() if k not in children and k not in batch)
    symbolic = [k for k, v in static if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))]
    if symbolic:
        # The context is the graph's fixed structure: a size-dependent Python value there would be baked in.
        msg = (f"cache attribute {symbolic[0]!r} of {type(obj).__name__} is a Python number computed from an input "
               f"size ({state[symbolic[0]]}); a cache's non-tensor attributes must not change between calls. "
               "Patch the layer so the attribute stays constant (see hfx.patches.patch_sliding_window_cache).")
        raise TypeError(msg)
    return [state[k] for k in children], _Context(children, static, batch)


def _flatten_with_keys(classes: frozenset[type], obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
    values, context = _flatten(classes, obj)
    return [(pytree.GetAttrKey(k), v) for k, v in zip(context.children, values)], context


def _unflatten(cls: type, values: Iterable[Any], context: _Context) -> Any:
    obj = cls.__new__(cls)
    values = list(values)
    vars(obj).update((k, _copied(v)) for k, v in context.static)
    vars(obj).update(zip(context.children, values))
    if context.batch:
        first = next((t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor) and t.ndim), None)
        vars(obj).update(dict.fromkeys(context.batch, first.shape[0] if first is not None else None))
    return obj


def _encode(value: Any) -> Any:
    """A JSON-ready form of a context value (dtypes, devices, classes, containers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, type):
        return {"class": f"{value.__module__}:{value.__qualname__}"}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    msg = f"cannot save a cache attribute of type {type(value).__name__} ({value!r})"
    raise TypeError(msg)


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag == "dtype":
        dtype = getattr(torch, inner, None) if isinstance(inner, str) else None
        if not isinstance(dtype, torch.dtype):
            msg = f"a saved cache spec names the dtype {inner!r}, which is not a torch dtype"
            raise ValueError(msg)
        return dtype
    if tag == "device":
        return torch.device(inner)
    if tag == "class":
        return _named_cache_class(inner)
    if tag == "dict":
        return {_decode(k): _decode(v) for k, v in inner}
    items = [_decode(v) for v in inner]
    return tuple(items) if tag == "tuple" else items


def _installed_transformers_module(module: str) -> Any:
    """``module`` imported if it is a module of the installed transformers package, else None (nothing imported)."""
    if not module.startswith("transformers.") or not all(part.isidentifier() for part in module.split(".")):
        return None
    try:
        return importlib.import_module(module) if importlib.util.find_spec(module) is not None else None
    except ImportError:
        return None


def _named_cache_class(name: str) -> type:
    """The cache class a saved context names (``module:qualname``), found among transformers' cache classes only.

    A saved spec is data from a file: it may name only a transformers cache or cache-layer class (or a model's
    own ``*Cache`` class in its ``transformers.models`` module, imported from the installed package), so a
    crafted file chooses no module to import and no object to return.

    Raises:
        ValueError: ``name`` is anything else; the message names it.
    """
    known = {f"{cls.__module__}:{cls.__qualname__}": cls for cls in cache_classes()}
    if name in known:
        return known[name]
    module, _, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
    if module.startswith("transformers.models.") and qualname.isidentifier() and qualname.endswith("Cache"):
        value = vars(_installed_transformers_module(module) or object).get(qualname)
        if isinstance(value, type) and value.__module__ == module:
            return value
    msg = (f"a saved cache spec names the class {name!r}, which is not a transformers cache class; hfx resolves "
           "classes from a file only among those, so it imports nothing the file chooses. The file was not written "
           "by hfx.save, or was changed after: export the model again")
    raise ValueError(msg)


def _to_dumpable(context: _Context) -> str:
    static = [[k, _encode(v)] for k, v in context.static]
    return json.dumps({"children": list(context.children), "static": static, "batch": list(context.batch)})


def _from_dumpable(dumped: str) -> _Context:
    data = json.loads(dumped)
    static = tuple((k, _decode(v)) for k, v in data["static"])
    return _Context(tuple(data["children"]), static, tuple(data.get("batch", ())))


# Classes registered by ``registered_caches`` -> how many blocks (in any thread) are inside it. The last block
# out deregisters: a program called in one thread keeps its caches while another thread's block ends.
_HELD: dict[type, int] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def registered_caches(classes: Iterable[type] | None = None) -> Iterator[None]:
    """Register ``classes`` (default: every cache class found) as pytree nodes inside the block.

    Classes already registered (by the user or torch) are left alone; the ones
    registered here are removed when the last block holding them exits, also
    after an error. Blocks may nest and run in several threads at once.
    """
    wanted = tuple(cache_classes() if classes is None else classes)
    node_classes = frozenset(wanted)
    held = []
    try:
        for cls in wanted:
            with _HELD_LOCK:
                if cls in _HELD:
                    _HELD[cls] += 1
                elif cls in pytree.SUPPORTED_NODES:
                    continue
                else:
                    _register(cls, node_classes)
                    _HELD[cls] = 1
            held.append(cls)
        yield
    finally:
        with _HELD_LOCK:
            for cls in held:
                _HELD[cls] -= 1
                if not _HELD[cls]:
                    del _HELD[cls]
                    pytree._deregister_pytree_node(cls)  # noqa: SLF001 - the only way to undo the registration


def _register(cls: type, node_classes: frozenset[type]) -> None:
    # The Python registry only, the one _deregister_pytree_node undoes: with optree installed the
    # public register_pytree_node also registers (or queues) the class in the C++ pytree for good.
    pytree._private_register_pytree_node(  # noqa: SLF001
        cls,
        functools.partial(_flatten, node_classes),
        functools.partial(_unflatten, cls),
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=_to_dumpable,
        from_dumpable_context=_from_dumpable,
        flatten_with_keys_fn=functools.partial(_flatten_with_keys, node_classes),
    )


def spec_caches(*ios: Any) -> contextlib.AbstractContextManager[None]:
    """A block in which the cache classes named by each ``IoSpec``'s input and output specs are pytree nodes."""
    classes = {cls: None for io in ios for spec in (io.in_spec, io.out_spec) for cls in classes_in_spec(spec)}
    return registered_caches(tuple(classes))


def classes_in_spec(serialised: str) -> tuple[type, ...]:
    """The non-builtin node classes a serialised treespec names that are cache classes (imported by name).

    The transformers modules of every class it names are imported, so that
    their ``ModelOutput`` classes are registered before the spec is loaded.
    """
    return _classes_in_spec(serialised)


@functools.lru_cache(maxsize=256)
def _classes_in_spec(serialised: str) -> tuple[type, ...]:
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                names.add(node["type"])
            for child in node.get("children_spec", []):
                walk(child)

    walk(json.loads(serialised)[1])
    for name in names:  # ModelOutput classes register themselves as pytree nodes when their module is imported
        _installed_transformers_module(name.rpartition(".")[0])
    known = {f"{c.__module__}.{c.__qualname__}": c for c in cache_classes()}
    return tuple(known[n] for n in sorted(names) if n in known)


def _children_by_name(spec: pytree.TreeSpec) -> dict[str, pytree.TreeSpec] | None:
    """A cache node's child specs by attribute name; ``None`` for any other node."""
    context = spec.context
    return dict(zip(context.children, spec.children())) if isinstance(context, _Context) else None


def _same_but_attribute_order(got: pytree.TreeSpec, want: pytree.TreeSpec) -> bool:
    """Whether ``got`` is ``want`` but for the order of some cache nodes' tensor attributes."""
    if got.type is not want.type or got.is_leaf() != want.is_leaf():
        return False
    got_children, want_children = _children_by_name(got), _children_by_name(want)
    if got_children is None or want_children is None:
        return got.context == want.context and len(got.children()) == len(want.children()) and all(
            _same_but_attribute_order(g, w) for g, w in zip(got.children(), want.children()))
    same_static = dict(got.context.static) == dict(want.context.static)
    return same_static and got_children.keys() == want_children.keys() and all(
        _same_but_attribute_order(got_children[name], spec) for name, spec in want_children.items())


def leaves_in_spec_order(tree: Any, want: pytree.TreeSpec) -> list[Any] | None:
    """``tree``'s leaves in the order ``want`` flattens them, when ``tree`` differs from ``want`` only in the order
    its cache objects' tensor attributes were set; else ``None``.

    A cache layer is flattened in the order its attributes were set, and transformers sets them in the order a
    forward first writes them: a Hymba-like layer with a sliding window and a convolution state
    (``LinearAttentionAndSlidingWindowAttentionLayer``, inkling_text) holds them in one order after ``generate``'s
    prefill and in another after a graph's, though the values are the same by name.
    """
    with_paths, got = pytree.tree_flatten_with_path(tree)
    if not _same_but_attribute_order(got, want):
        return None
    by_path = dict(with_paths)
    markers = [torch.empty(0) for _ in range(want.num_leaves)]  # tensors: a cache's children are what holds them
    wanted_paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(markers, want))
    return [by_path[path] for path, _ in wanted_paths]


def leaf_name(path: tuple[Any, ...]) -> str:
    """A dotted name for a pytree key path: ``past_key_values.layers.0.keys`` (also for transformers 5.24's ``cache``)."""
    parts: list[str] = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join([graph_name(parts[0]), *parts[1:]] if parts else parts)


def named_leaves(kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every pytree leaf of ``kwargs`` with its dotted name, in flattening order."""
    with_paths, _ = pytree.tree_flatten_with_path(dict(kwargs))
    return [(leaf_name(path), leaf) for path, leaf in with_paths]


def owned_tensors(kwargs: Mapping[str, Any]) -> list[tuple[str, torch.Tensor, tuple[type, ...]]]:
    """Every tensor in ``kwargs`` with its dotted name and the classes of the objects holding it.

    Named like ``named_leaves`` (``past_key_values.layers.0.keys``), but walking
    cache objects by their attributes so a rule can tell a static cache layer
    from a dynamic one.
    """
    found: list[tuple[str, torch.Tensor, tuple[type, ...]]] = []
    seen: set[int] = set()

    def walk(value: Any, name: str, owners: tuple[type, ...]) -> None:
        if id(value) in seen:  # objects may refer back to their owner
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append((name, value, owners))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{name}.{index}", owners)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{name}.{key}", owners)
        elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
            for key, item in vars(value).items():
                walk(item, f"{name}.{key}", (*owners, type(value)))

    for key, value in kwargs.items():
        walk(value, graph_name(key), ())
    return found
