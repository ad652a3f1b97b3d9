"""hfx/_pytree.py: cache classes found by reflection, registered as pytree nodes only inside the block, their
flatten / unflatten and JSON context, and the leaf names every program's contract uses."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree
from transformers import cache_utils
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.mimi.modeling_mimi import MimiConv1dPaddingCache

from hfx import zoo
from hfx._pytree import (
    _Context,
    _from_dumpable,
    _to_dumpable,
    cache_classes,
    classes_in_spec,
    is_cache,
    leaf_name,
    leaves_in_spec_order,
    named_leaves,
    owned_tensors,
    registered_caches,
    spec_caches,
)
from hfx._records import IoSpec

_PROMPT = {"batch": 2, "sequence": 5}


class TinyPaddingCache:
    """A model's own cache class, as Mimi's ``MimiConv1dPaddingCache``: not a ``Cache``, named ``*Cache``."""

    def __init__(self) -> None:
        self.padding = torch.zeros(2, 3)


class TinyModel(torch.nn.Module):
    """A model whose module (this one) defines ``TinyPaddingCache`` and imports another model's ``*Cache``."""


class _Outer:
    class Inner:
        """A nested class, named ``_Outer.Inner`` in a context."""


def _filled(model: torch.nn.Module, name: str, **kwargs) -> cache_utils.Cache:
    """The cache a zoo model's forward fills from a 5-token prompt (batch 2)."""
    with torch.no_grad():
        out = model(**zoo.inputs(name, **_PROMPT), use_cache=True, **kwargs)
    return out.get("past_key_values", out.get("cache_params"))


@pytest.fixture(scope="module")
def caches(models) -> dict[str, cache_utils.Cache]:
    """A filled cache of each kind: dynamic, static, encoder-decoder and SSM (``LinearAttentionLayer``s)."""
    llama = models("llama")
    static = cache_utils.StaticCache(config=llama.config, max_cache_len=12)
    generator = torch.Generator().manual_seed(0)
    self_attention, cross_attention = cache_utils.DynamicCache(), cache_utils.DynamicCache()
    for layer in range(2):
        self_attention.update(*torch.randn(2, 2, 2, 3, 4, generator=generator), layer)
        cross_attention.update(*torch.randn(2, 2, 2, 6, 4, generator=generator), layer)
    return {
        "dynamic": _filled(llama, "llama"),
        "static": _filled(llama, "llama", past_key_values=static),
        "encoder_decoder": cache_utils.EncoderDecoderCache(self_attention, cross_attention),
        "ssm": _filled(models("mamba"), "mamba"),
    }


def _assert_same(got, want, where: str = "cache") -> None:
    """``got`` is ``want`` rebuilt: same types, equal tensors, equal attributes, all the way down."""
    assert type(got) is type(want), where
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}.{index}")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif hasattr(want, "__dict__") and not isinstance(want, type):
        assert vars(got).keys() == vars(want).keys(), where
        for key in vars(want):
            _assert_same(vars(got)[key], vars(want)[key], f"{where}.{key}")
    else:
        assert got == want, where


def _spec(value) -> str:
    """The serialised treespec of ``value``, its caches registered."""
    with registered_caches():
        return pytree.treespec_dumps(pytree.tree_structure(value))


def _io(in_spec: str, out_spec: str) -> IoSpec:
    return IoSpec(inputs=(), outputs=(), in_spec=in_spec, out_spec=out_spec)


# --- cache_classes and is_cache ---------------------------------------------------------------


def test_cache_classes_finds_the_caches_and_their_layers():
    found = cache_classes()
    expected = {cache_utils.DynamicCache, cache_utils.StaticCache, cache_utils.EncoderDecoderCache,
                cache_utils.DynamicLayer, cache_utils.StaticLayer, cache_utils.DynamicSlidingWindowLayer,
                cache_utils.LinearAttentionLayer, cache_utils.Cache, cache_utils.CacheLayerMixin}
    assert expected <= set(found)
    assert len(found) == len(set(found))
    assert TinyPaddingCache not in found


def test_cache_classes_adds_the_cache_classes_the_models_own_module_defines():
    found = cache_classes(TinyModel())
    assert TinyPaddingCache in found
    assert MimiConv1dPaddingCache not in found  # named *Cache and imported here, but Mimi's own
    assert set(cache_classes()) <= set(found)


def test_is_cache():
    assert is_cache(cache_utils.DynamicCache())
    assert is_cache(TinyPaddingCache())
    assert not is_cache(cache_utils.DynamicLayer())  # a layer is part of a cache, not one
    assert not is_cache(torch.zeros(1))
    assert not is_cache({"past_key_values": None})


# --- registered_caches ------------------------------------------------------------------------


def test_registered_inside_the_block_and_deregistered_on_exit():
    classes = cache_classes()
    assert not any(cls in pytree.SUPPORTED_NODES for cls in classes)
    with registered_caches():
        assert all(cls in pytree.SUPPORTED_NODES for cls in classes)
        assert all(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[f"{c.__module__}.{c.__qualname__}"] is c for c in classes)
    assert not any(cls in pytree.SUPPORTED_NODES or cls in pytree.SUPPORTED_SERIALIZED_TYPES for cls in classes)


def test_registers_only_the_classes_it_is_given():
    with registered_caches([cache_utils.StaticCache]):
        assert cache_utils.StaticCache in pytree.SUPPORTED_NODES
        assert cache_utils.DynamicCache not in pytree.SUPPORTED_NODES
    assert cache_utils.StaticCache not in pytree.SUPPORTED_NODES


def test_deregistered_after_an_exception():
    with pytest.raises(KeyError, match="inside"), registered_caches():
        raise KeyError("inside")
    assert not any(cls in pytree.SUPPORTED_NODES for cls in cache_classes())


def test_an_already_registered_class_is_left_alone():
    cls = cache_utils.DynamicCache
    pytree.register_pytree_node(cls, lambda c: ([], None), lambda values, context: cls(),
                                serialized_type_name="the user's DynamicCache")
    try:
        node = pytree.SUPPORTED_NODES[cls]
        with registered_caches():
            assert pytree.SUPPORTED_NODES[cls] is node
            assert cache_utils.StaticCache in pytree.SUPPORTED_NODES
        assert pytree.SUPPORTED_NODES[cls] is node
        assert pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE["the user's DynamicCache"] is cls
    finally:
        pytree._deregister_pytree_node(cls)


def test_nothing_is_left_queued_for_the_cxx_pytree(monkeypatch):
    # With optree installed, torch's register_pytree_node also queues each class for the C++ pytree
    # (or registers it there); _deregister_pytree_node undoes the Python registry only.
    monkeypatch.setattr(pytree, "_cxx_pytree_exists", True)
    monkeypatch.setattr(pytree, "_cxx_pytree_imported", False)
    monkeypatch.setattr(pytree, "_cxx_pytree_pending_imports", [])
    with registered_caches():
        pass
    assert pytree._cxx_pytree_pending_imports == []


# --- flatten and unflatten --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dynamic", "static", "encoder_decoder", "ssm"])
def test_flatten_unflatten_round_trip(caches, kind):
    cache = caches[kind]
    with registered_caches():
        leaves, spec = pytree.tree_flatten(cache)
        rebuilt = pytree.tree_unflatten(leaves, spec)
        rebuilt_leaves = pytree.tree_leaves(rebuilt)
        again = pytree.treespec_loads(pytree.treespec_dumps(spec))
    assert leaves and all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    assert len(rebuilt_leaves) == len(leaves) and all(a is b for a, b in zip(rebuilt_leaves, leaves))
    assert again == spec  # through the JSON context too
    _assert_same(rebuilt, cache)


def test_the_layers_tensors_are_leaves_and_their_other_attributes_the_context(caches):
    layer = caches["dynamic"].layers[0]
    with registered_caches():
        leaves, spec = pytree.tree_flatten(layer)
    assert [leaf.shape for leaf in leaves] == [layer.keys.shape, layer.values.shape]
    assert spec.context.children == ("keys", "values")
    # transformers 5.24's DynamicLayer keeps no dtype of its own: the context holds what the installed layer has
    wanted = {"is_initialized": True, "dtype": torch.float32, "device": torch.device("cpu")}
    assert dict(spec.context.static) == {key: value for key, value in wanted.items() if key in vars(layer)}


def test_batch_attributes_follow_the_first_tensor(caches):
    cache = caches["static"]
    with registered_caches():
        leaves, spec = pytree.tree_flatten(cache)
        wider = pytree.tree_unflatten([torch.cat([leaf, leaf[:1]]) if leaf.ndim else leaf for leaf in leaves], spec)
    assert [layer.batch_size for layer in cache.layers] == [2, 2]
    assert [layer.batch_size for layer in wider.layers] == [3, 3]
    assert spec.children_specs[0].children_specs[0].context.batch == ("batch_size",)


def test_a_rebuilt_cache_shares_no_mutable_attribute_with_the_original(caches):
    cache = caches["ssm"]
    with registered_caches():
        leaves, spec = pytree.tree_flatten(cache)
        rebuilt = pytree.tree_unflatten(leaves, spec)
        rebuilt.layers[0].has_previous_state[0] = False  # what a traced forward writes
        assert pytree.tree_unflatten(leaves, spec).layers[0].has_previous_state[0] is True
    assert cache.layers[0].has_previous_state[0] is True


def test_a_symbolic_attribute_is_a_type_error_naming_it():
    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=3)
    layer.cumulative_length = ShapeEnv().create_unbacked_symint()
    with registered_caches(), pytest.raises(TypeError, match="attribute 'cumulative_length' of "
                                                              "DynamicSlidingWindowLayer is a Python number"):
        pytree.tree_flatten(layer)


# --- the JSON context ---------------------------------------------------------------------------


def test_the_context_round_trips_through_json():
    static = (("dtype", torch.float16), ("device", torch.device("cpu")), ("layer", cache_utils.DynamicLayer),
              ("sizes", (1, 2)), ("names", ["a", "b"]),
              ("flags", {0: True, "k": (torch.int64, None)}), ("scale", 1.5), ("none", None))
    context = _Context(("keys", "values"), static, ("batch_size",))
    dumped = _to_dumpable(context)
    loaded = _from_dumpable(dumped)
    assert isinstance(json.loads(dumped), dict)
    assert loaded == context and loaded.batch == ("batch_size",)
    values = dict(loaded.static)
    assert values["layer"] is cache_utils.DynamicLayer
    assert type(values["sizes"]) is tuple and type(values["names"]) is list
    assert values["flags"] == {0: True, "k": (torch.int64, None)} and type(values["flags"]["k"]) is tuple


def test_a_context_naming_a_class_that_is_no_cache_class_is_refused_when_loaded():
    # Any class is written (a model's own cache layer may hold one), but only cache classes are read back:
    # a saved context is data from a file and must not choose what gets imported (tests/test_trust.py).
    dumped = _to_dumpable(_Context(("keys",), (("nested", _Outer.Inner),), ()))
    with pytest.raises(ValueError, match=r"'tests.test_pytree:_Outer.Inner', which is not a transformers cache class"):
        _from_dumpable(dumped)


def test_a_context_value_json_cannot_hold_is_a_type_error():
    context = _Context((), (("handle", object()),), ())
    with pytest.raises(TypeError, match="cannot save a cache attribute of type object"):
        _to_dumpable(context)


# --- specs --------------------------------------------------------------------------------------


def test_classes_in_spec_names_the_cache_classes_only(caches):
    output = CausalLMOutputWithPast(logits=torch.zeros(2, 5, 8), past_key_values=caches["dynamic"])
    assert classes_in_spec(_spec({"out": output})) == (cache_utils.DynamicCache, cache_utils.DynamicLayer)
    assert classes_in_spec(_spec({"cache": caches["ssm"]})) == (cache_utils.DynamicCache,
                                                                 cache_utils.LinearAttentionLayer)
    assert classes_in_spec(_spec({"input_ids": torch.zeros(1)})) == ()


def test_classes_in_spec_imports_the_modules_of_the_transformers_classes_it_names(caches, monkeypatch):
    imported = []
    import_module = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name: imported.append(name) or import_module(name))
    serialised = _spec({"output": CausalLMOutputWithPast(logits=torch.ones(1), past_key_values=caches["static"])})
    classes_in_spec(serialised)
    assert {"transformers.modeling_outputs", "transformers.cache_utils"} <= set(imported)


def test_spec_caches_registers_the_classes_every_spec_names_inside_the_block(caches):
    decode = _io(_spec({"past_key_values": caches["dynamic"]}), _spec({"logits": torch.zeros(1)}))
    static = _io(_spec({"input_ids": torch.zeros(1)}), _spec({"past_key_values": caches["static"]}))
    named = {cache_utils.DynamicCache, cache_utils.DynamicLayer, cache_utils.StaticCache, cache_utils.StaticLayer}
    with spec_caches(decode, static):
        assert all(cls in pytree.SUPPORTED_NODES for cls in named)
        assert cache_utils.EncoderDecoderCache not in pytree.SUPPORTED_NODES
    assert not any(cls in pytree.SUPPORTED_NODES for cls in named)


# --- leaf names ---------------------------------------------------------------------------------


def test_leaf_name_joins_the_keys_with_dots():
    path = (pytree.MappingKey("past_key_values"), pytree.GetAttrKey("layers"), pytree.SequenceKey(0),
            pytree.GetAttrKey("keys"))
    assert leaf_name(path) == "past_key_values.layers.0.keys"
    assert leaf_name((pytree.MappingKey("pixel_values"),)) == "pixel_values"
    assert leaf_name(("plain",)) == "plain"


def test_named_leaves_names_every_leaf_in_flattening_order(caches):
    cache = caches["dynamic"]
    ids = torch.zeros(2, 5, dtype=torch.long)
    with registered_caches():
        named = named_leaves({"input_ids": ids, "past_key_values": cache})
    assert [name for name, _ in named] == ["input_ids", "past_key_values.layers.0.keys",
                                           "past_key_values.layers.0.values", "past_key_values.layers.1.keys",
                                           "past_key_values.layers.1.values"]
    assert named[0][1] is ids and named[1][1] is cache.layers[0].keys
    assert [name for name, _ in named_leaves({"past_key_values": cache})] == ["past_key_values"]  # not registered


def test_owned_tensors_walks_caches_by_attribute_and_names_their_owners(caches):
    ssm = caches["ssm"]
    found = {name: (tensor, owners) for name, tensor, owners in owned_tensors({
        "input_ids": torch.zeros(1), "cache": ssm, "linear": torch.nn.Linear(2, 2)})}
    assert found["input_ids"][1] == ()
    tensor, owners = found["past_key_values.layers.0.conv_states.0"]  # transformers 5.24's `cache`, as graphs name it
    assert tensor is ssm.layers[0].conv_states[0]
    assert owners == (cache_utils.DynamicCache, cache_utils.LinearAttentionLayer)
    assert not any(name.startswith("linear") for name in found)  # modules are not walked


def test_owned_tensors_lists_a_shared_tensor_once_and_survives_a_cycle():
    class Holder:
        pass

    holder, tensor = Holder(), torch.zeros(2)
    holder.itself, holder.first, holder.second = holder, tensor, tensor
    assert [(name, owners) for name, _, owners in owned_tensors({"holder": holder})] == [("holder.first", (Holder,))]


# --- leaves_in_spec_order ------------------------------------------------------------------------


def _swapped_layer(layer):
    """A copy of ``layer`` with the same attributes set in the reverse order (its tensors flatten reversed)."""
    copied = type(layer).__new__(type(layer))
    vars(copied).update(reversed(list(vars(layer).items())))
    return copied


def test_a_cache_whose_attributes_were_set_in_another_order_gives_its_leaves_in_the_captured_order(caches):
    # Hymba-like hybrid layers (inkling_text) set their tensors in another order after generate's prefill than
    # after a graph's: the same values by name, another flattening order.
    cache = caches["dynamic"]
    swapped = cache_utils.DynamicCache()
    vars(swapped).update(vars(cache))
    swapped.layers = [_swapped_layer(layer) for layer in cache.layers]
    with registered_caches():
        want = pytree.tree_structure(cache)
        leaves, got = pytree.tree_flatten(swapped)
        assert got != want and leaves[0] is cache.layers[0].values  # values first: the other order
        ordered = leaves_in_spec_order(swapped, want)
        assert ordered is not None and all(a is b for a, b in zip(ordered, pytree.tree_leaves(cache), strict=True))
        assert leaves_in_spec_order(cache, want) == pytree.tree_leaves(cache)  # already in order


def test_a_cache_with_another_attribute_value_or_tensor_is_no_reordering(caches):
    cache = caches["dynamic"]
    with registered_caches():
        want = pytree.tree_structure(cache)
        other = cache_utils.DynamicCache()
        vars(other).update(vars(cache))
        other.layers = [_swapped_layer(layer) for layer in cache.layers]
        vars(other.layers[0])["is_initialized"] = False  # a static attribute differs: another structure
        assert leaves_in_spec_order(other, want) is None
        fewer = cache_utils.DynamicCache()
        vars(fewer).update(vars(cache))
        fewer.layers = cache.layers[:1]
        assert leaves_in_spec_order(fewer, want) is None
        assert leaves_in_spec_order({"a": torch.zeros(1)}, want) is None
