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


class _LeavesAMark:
    """Unpickling an instance creates the file it names: what a crafted pickle could do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _with_member(saved, tmp_path, member, data):
    """A copy of ``saved`` whose ``.pt2`` has ``member`` (under the archive's root folder) replaced by ``data``."""
    import zipfile

    copy = _tampered(saved, tmp_path, lambda manifest: None)
    (file,) = json.loads((copy / "hfx.json").read_text())["components"]["decode"]["files"]
    original = (copy / file).read_bytes()
    (copy / file).unlink()
    with zipfile.ZipFile(__import__("io").BytesIO(original)) as source, zipfile.ZipFile(copy / file, "w") as target:
        root = source.namelist()[0].split("/")[0]
        for info in source.infolist():
            if info.filename != f"{root}/{member}":
                target.writestr(info, source.read(info))
        target.writestr(f"{root}/{member}", data)
    return copy


def _pickled(value) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_what_hfx_saves_holds_no_pickle(saved):
    from hfx.backends._torch import unpickled_members

    entry = json.loads((saved / "hfx.json").read_text())["components"]["decode"]
    assert unpickled_members(entry, saved) == []


def test_a_pt2_with_pickled_sample_inputs_is_refused_and_runs_nothing(saved, tmp_path):
    mark = tmp_path / "unpickled"
    copy = _with_member(saved, tmp_path, "data/sample_inputs/model.pt", _pickled(_LeavesAMark(mark)))
    with pytest.raises(ValueError, match=r"component 'decode': decode.pt2 holds pickled parts \(.*data/sample_inputs/"
                                         r"model.pt\).*unpickling can run any code. Pass trust=True \(CLI: --trust\)"):
        hfx.load(copy)
    assert not mark.exists()


def test_a_pt2_with_a_pickled_constant_is_refused(saved, tmp_path):
    import zipfile

    config = json.dumps({"config": {"c": {"path_name": "tensor_0", "use_pickle": True}}})
    (file,) = json.loads((saved / "hfx.json").read_text())["components"]["decode"]["files"]
    with zipfile.ZipFile(saved / file) as archive:
        (member,) = [n.split("/", 1)[1] for n in archive.namelist() if n.endswith("_constants_config.json")]
    copy = _with_member(saved, tmp_path, member, config)
    with pytest.raises(ValueError, match=r"holds pickled parts \(.*data/constants/tensor_0"):
        hfx.load(copy)


def test_trust_loads_a_pt2_with_pickled_parts(saved, tmp_path):
    import torch

    copy = _with_member(saved, tmp_path, "data/sample_inputs/model.pt", _pickled(((), {})))
    with pytest.raises(ValueError, match="holds pickled parts"):
        hfx.load(copy)
    loaded = hfx.load(copy, trust=True)
    assert isinstance(loaded["decode"].program, torch.export.ExportedProgram)


def test_hfx_run_refuses_pickled_parts_unless_trusted(saved, tmp_path, capsys):
    from hfx._cli.main import main

    copy = _with_member(saved, tmp_path, "data/sample_inputs/model.pt", _pickled(((), {})))
    command = ["run", str(copy), "--input-ids", "5,6", "--max-new-tokens", "2"]
    assert main(command) == 1
    assert "holds pickled parts" in capsys.readouterr().err
    assert main([*command, "--trust"]) == 0
    assert capsys.readouterr().out.strip().startswith("5,6,")
