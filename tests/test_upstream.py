"""Differences between the releases of the tested window: graph names, output fields, exports saved by the other release."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree
from transformers.modeling_outputs import CausalLMOutputWithPast

import hfx
from hfx import zoo
from hfx._pytree import leaf_name
from hfx._upstream import CACHE_NAMES, output_cache, with_installed_fields
from tests.helpers import CAPTURE_SHAPE, NEW_TOKENS, eager_tokens

FIELDS = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
INSTALLED = next(name for name in CACHE_NAMES if name in FIELDS)  # "cache" from transformers 5.24, else "past_key_values"
OTHER = "past_key_values" if INSTALLED == "cache" else "cache"  # what the other end of the window names it


def test_graph_names_keep_past_key_values_for_the_5_24_cache_argument():
    assert leaf_name((pytree.MappingKey("cache"), pytree.GetAttrKey("layers"), pytree.SequenceKey(0))) == "past_key_values.layers.0"
    assert leaf_name((pytree.MappingKey("past_key_values"),)) == "past_key_values"
    assert leaf_name((pytree.MappingKey("logits"),)) == "logits"


def test_an_output_spec_of_the_other_release_names_the_installed_field():
    spec = pytree.TreeSpec(CausalLMOutputWithPast, ["logits", OTHER], [pytree.LeafSpec(), pytree.LeafSpec()])
    installed = with_installed_fields(spec)
    assert installed.context == ["logits", INSTALLED]
    rebuilt = pytree.tree_unflatten([torch.ones(1), torch.zeros(1)], installed)
    assert torch.equal(output_cache(rebuilt), torch.zeros(1))
    same = pytree.tree_structure(CausalLMOutputWithPast(logits=torch.ones(1)))
    assert with_installed_fields(same) is same  # already the installed names: untouched


def _as_saved_by_the_other_release(directory) -> None:
    """Rewrite an ONNX export's manifest as the other end of the window writes it: the cache named ``OTHER``."""
    path = directory / "hfx.json"
    manifest = json.loads(path.read_text())

    def renamed(node):
        if isinstance(node, dict):
            if isinstance(node.get("context"), str) and INSTALLED in node["context"]:
                node["context"] = node["context"].replace(f'"{INSTALLED}"', f'"{OTHER}"')
            for child in node.get("children_spec", []):
                renamed(child)

    for entry in manifest["components"].values():
        for key in ("in_spec", "out_spec"):
            version, root = json.loads(entry["io"][key])
            renamed(root)
            entry["io"][key] = json.dumps([version, root])
    if manifest["meta"]["roles"].get("cache_input") == INSTALLED:
        manifest["meta"]["roles"]["cache_input"] = OTHER
    path.write_text(json.dumps(manifest))


def test_an_export_saved_by_the_other_release_loads_and_generates_eager_tokens(tmp_path):
    pytest.importorskip("onnxruntime")
    model = zoo.build("llama")
    prompt = zoo.inputs("llama", **CAPTURE_SHAPE)
    parts = hfx.lower_to_onnx(hfx.export(hfx.decompose(hfx.capture(prompt, model))))
    directory = hfx.save(tmp_path / "llama", parts)
    _as_saved_by_the_other_release(directory)
    assert OTHER in (directory / "hfx.json").read_text()
    loaded = hfx.load(directory)
    assert loaded.meta.roles.cache_input == OTHER
    tokens = hfx.generate(prompt, loaded, max_new_tokens=NEW_TOKENS["llama"])
    assert torch.equal(tokens, eager_tokens(model, prompt, NEW_TOKENS["llama"]))


def test_a_release_outside_the_window_warns_once_naming_package_version_and_window(monkeypatch):
    from hfx import _upstream

    monkeypatch.setattr(_upstream.importlib.metadata, "version", lambda name: "9.1.0")
    _upstream.check_window.cache_clear()
    try:
        with pytest.warns(hfx.UntestedVersionWarning, match=r"tested with transformers 5\.22 to 5\.24\.x; 9\.1\.0 is installed"):
            assert _upstream.check_window("transformers") == "9.1.0"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _upstream.check_window("transformers")  # once per process
    finally:
        _upstream.check_window.cache_clear()


def test_the_installed_releases_are_inside_the_window():
    from hfx import _upstream

    for distribution in _upstream.WINDOW:
        installed = importlib.metadata.version(distribution)
        oldest, newest = _upstream.WINDOW[distribution]
        assert _upstream._release(oldest) <= _upstream._release(installed) <= _upstream._release(newest), distribution


def test_pyproject_declares_the_window():
    from hfx import _upstream

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    for distribution, (oldest, newest) in _upstream.WINDOW.items():
        assert f'"{distribution}>={oldest},<{_upstream._next(newest)}"' in text, distribution
