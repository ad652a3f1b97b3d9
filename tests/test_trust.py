"""Loading a stranger's export runs no code: a manifest or spec that names other classes, modules or files is refused."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

import hfx
from hfx._capture.positions import _weightless


@pytest.fixture(scope="module")
def saved(generative, tmp_path_factory):
    """The zoo Llama's exported decode step, saved once: the directory the tests copy and tamper with."""
    _, exported = generative("llama")
    return hfx.save(tmp_path_factory.mktemp("trust") / "llama", exported)


def _tampered(saved, tmp_path, change):
    """A copy of ``saved`` whose manifest ``change(manifest)`` edited."""
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    manifest = json.loads((copy / "hfx.json").read_text())
    change(manifest)
    (copy / "hfx.json").write_text(json.dumps(manifest))
    return copy


def _with_static(entry: str):
    """An edit that adds the static cache attribute ``("extra", entry)`` to the first cache node of the decode's input spec."""
    def change(manifest):
        io = manifest["components"]["decode"]["io"]
        spec = json.loads(io["in_spec"])

        def first_cache(node):
            if isinstance(node, dict):
                if "cache_utils" in str(node.get("type")):
                    return node
                return next((found for child in node.get("children_spec", []) if (found := first_cache(child))), None)
            return None

        node = first_cache(spec[1])
        context = json.loads(node["context"])
        context["static"].append(["extra", entry])
        node["context"] = json.dumps(context)
        io["in_spec"] = json.dumps(spec)
    return change


@pytest.mark.parametrize("name", ["os:system", "subprocess:Popen", "builtins:eval", "transformers.models.llama:os"])
def test_a_spec_naming_another_class_is_refused(saved, tmp_path, name):
    tampered = _tampered(saved, tmp_path, _with_static({"class": name}))
    with pytest.raises(ValueError, match=rf"hfx.json: component 'decode': .*{name!r}.*not a transformers cache class"):
        hfx.load(tampered)


def test_a_module_with_an_import_side_effect_is_never_imported(saved, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "hfx_side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Cache: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("hfx_side_effect:Cache", "transformers.models.hfx_side_effect:Cache"):
        with pytest.raises(ValueError, match="not a transformers cache class"):
            hfx.load(_tampered(saved, tmp_path / name.replace(":", "-"), _with_static({"class": name})))
    assert not marker.exists() and "hfx_side_effect" not in sys.modules


def test_a_spec_naming_a_torch_function_as_a_dtype_is_refused(saved, tmp_path):
    with pytest.raises(ValueError, match=r"names the dtype 'load', which is not a torch dtype"):
        hfx.load(_tampered(saved, tmp_path, _with_static({"dtype": "load"})))


def test_a_transformers_cache_class_is_still_resolved(saved, tmp_path):
    tampered = _tampered(saved, tmp_path, _with_static({"class": "transformers.cache_utils:DynamicLayer"}))
    assert set(hfx.load(tampered)) == {"decode"}


@pytest.mark.parametrize("file", ["../../x", "/etc/passwd", "a/../../b"])
def test_a_file_outside_the_directory_is_refused(saved, tmp_path, file):
    def change(manifest):
        manifest["components"]["decode"]["files"] = [file]
    with pytest.raises(ValueError, match=rf"component 'decode' names the file '{file}', outside the export's directory"):
        hfx.load(_tampered(saved, tmp_path, change))


def test_a_processor_outside_the_directory_is_refused(saved, tmp_path):
    def change(manifest):
        manifest["processor"] = "../elsewhere"
    with pytest.raises(ValueError, match=r"processor names the file '../elsewhere', outside"):
        hfx.load(_tampered(saved, tmp_path, change))


@pytest.mark.parametrize("name", ["pipeline", "os.system", "AutoConfig", "LlamaConfig"])
def test_only_a_transformers_model_class_is_built_from_a_manifest(name):
    with pytest.raises(ValueError, match=rf"model class {name!r} is not a transformers model class"):
        _weightless(name, "{}")


def test_a_manifest_that_is_not_json_names_the_file(saved, tmp_path):
    copy = _tampered(saved, tmp_path, lambda manifest: None)
    (copy / "hfx.json").write_text('{"schema_version": 1, "components": {"dec')  # cut short
    with pytest.raises(ValueError, match=r"hfx.json is not valid JSON .* truncated or not hfx's: save the export again"):
        hfx.load(copy)


def test_another_tools_manifest_is_named_as_such(saved, tmp_path):
    copy = _tampered(saved, tmp_path, lambda manifest: None)
    (copy / "hfx.json").write_text(json.dumps({"name": "llama", "format": "someone-else"}))
    with pytest.raises(ValueError, match=r"hfx.json has no 'components'; it is another tool's hfx.json"):
        hfx.load(copy)


def test_a_truncated_program_file_names_the_component_and_the_file(saved, tmp_path):
    copy = _tampered(saved, tmp_path, lambda manifest: None)
    (file,) = json.loads((copy / "hfx.json").read_text())["components"]["decode"]["files"]
    data = (copy / file).read_bytes()
    (copy / file).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"component 'decode' could not be read from {file}: .* copy the export again"):
        hfx.load(copy)
