"""save/load: a manifest plus runtime files; atomic; components kept."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from toolz import pipe

import hfx
from hfx._save import MANIFEST, SCHEMA_VERSION
from tests.helpers import new_inputs, schema_1_meta
from tests.tolerances import FP32_PARITY


def test_round_trip_of_an_exported_program(exported, tmp_path):
    path = hfx.save(tmp_path / "llama", exported("llama"))
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["components"]["model"]["runtime"] == "pt2"
    assert sorted(p.name for p in path.iterdir()) == [MANIFEST, "model.pt2"]
    loaded = hfx.load(path)
    assert loaded.io == exported("llama").io
    assert torch.equal(loaded(**new_inputs("llama")).logits, exported("llama")(**new_inputs("llama")).logits)


def test_components_round_trip(exported, tmp_path):
    parts = hfx.Components(items={"text": exported("bert"), "image": exported("vit")})
    loaded = hfx.load(hfx.save(tmp_path / "two", parts))
    assert isinstance(loaded, hfx.Components) and list(loaded) == ["text", "image"]


def test_existing_directory_is_refused_unless_overwrite(exported, tmp_path):
    target = tmp_path / "x"
    target.mkdir()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        hfx.save(target, exported("bert"))
    hfx.save(target, exported("bert"), overwrite=True)
    assert (target / MANIFEST).exists()


def test_a_failed_save_leaves_nothing(tmp_path):
    with pytest.raises(TypeError, match="cannot save"):
        hfx.save(tmp_path / "bad", hfx.Components(items={"a": object()}))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_overwrite_keeps_the_old_directory(exported, tmp_path):
    target = hfx.save(tmp_path / "keep", exported("bert"))
    with pytest.raises(TypeError):
        hfx.save(target, hfx.Components(items={"a": object()}), overwrite=True)
    assert hfx.load(target).io == exported("bert").io
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


def test_load_gives_each_program_the_threads_asked_for(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    pytest.importorskip("executorch")
    from hfx.backends._executorch_threads import pool_threads

    linear = torch.nn.Linear(8, 4)
    exported = pipe(linear, hfx.capture({"input": torch.randn(2, 8)}), hfx.export)
    sessions = hfx.Components(items={"onnx": hfx.lower_to_onnx(exported), "ov": hfx.lower_to_ov(exported)})
    loaded = hfx.load(hfx.save(tmp_path / "sessions", sessions), threads=1)
    assert [program.threads for program in loaded.values()] == [1, 1]
    assert loaded["onnx"]._session.get_session_options().intra_op_num_threads == 1
    assert int(loaded["ov"]._compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    # ExecuTorch has one pool per process: this worker's other programs live on it, so load at its size.
    pte = hfx.load(hfx.save(tmp_path / "pte", hfx.lower_to_pte(exported)), threads=pool_threads())
    assert pte.threads == pool_threads()
    inputs = {"input": torch.randn(3, 8)}
    with torch.no_grad():
        want = linear(**inputs)
    for program in (*loaded.values(), pte):
        torch.testing.assert_close(program(**inputs), want, atol=FP32_PARITY, rtol=0)
    with pytest.raises(ValueError, match=r"load: threads must be a positive int .* got 0"):
        hfx.load(tmp_path / "sessions", threads=0)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not written by hfx.save"):
        hfx.load(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"schema_version": 99, "components": {}}))
    with pytest.raises(ValueError, match="Upgrade hfx"):
        hfx.load(tmp_path)


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(100)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def test_generation_components_keep_meta_and_tokenizer(generative, tmp_path):
    model, parts = generative("llama")
    tokenizer = _tiny_tokenizer()
    path = hfx.save(tmp_path / "gen", parts, processor=tokenizer)
    loaded = hfx.load(path)
    assert list(loaded) == list(parts)
    assert loaded.meta == parts.meta and loaded.meta.generation.config["eos_token_id"] == 2
    assert loaded.processor("w1 w2 w3")["input_ids"] == tokenizer("w1 w2 w3")["input_ids"]
    inputs = hfx.zoo.inputs("llama", batch=2, sequence=6)
    assert torch.equal(hfx.generate(inputs, loaded, max_new_tokens=8), hfx.generate(inputs, parts, max_new_tokens=8))


def test_multimodal_parts_reload_and_generate_the_same_tokens(generative, tmp_path):
    model, parts = generative("llava")
    loaded = hfx.load(hfx.save(tmp_path / "llava", parts))
    assert list(loaded) == list(parts) and loaded.meta == parts.meta
    inputs = hfx.zoo.inputs("llava", batch=2, sequence=4)
    assert torch.equal(hfx.generate(inputs, loaded, max_new_tokens=6), hfx.generate(inputs, parts, max_new_tokens=6))


def test_meta_given_to_save_is_kept_with_a_single_program(exported, tmp_path):
    path = hfx.save(tmp_path / "bert", exported("bert"), meta={"model_id": "tiny-bert"})
    written = json.loads((path / MANIFEST).read_text())["meta"]
    assert written == hfx.GenerationMeta(extra={"model_id": "tiny-bert"}).to_json()
    assert isinstance(hfx.load(path), hfx.Exported)


def test_meta_given_to_save_joins_the_components_extra_facts(generative, tmp_path):
    _, parts = generative("llama")
    parts = attrs.evolve(parts, meta=attrs.evolve(parts.meta, extra={"model_id": "tiny", "license": "mit"}))
    loaded = hfx.load(hfx.save(tmp_path / "facts", parts, meta={"license": "apache-2.0"}))
    assert dict(loaded.meta.extra) == {"model_id": "tiny", "license": "apache-2.0"}
    assert loaded.meta.generation == parts.meta.generation and dict(parts.meta.extra)["license"] == "mit"


def test_an_export_saved_with_the_flat_meta_of_schema_1_still_loads_and_generates(generative, tmp_path):
    _, parts = generative("llava")
    path = hfx.save(tmp_path / "old", parts)
    manifest = json.loads((path / MANIFEST).read_text())
    old = {**manifest, "schema_version": 1, "meta": schema_1_meta(manifest["meta"])}
    assert "generation_config" in old["meta"] and "roles" not in old["meta"]
    (path / MANIFEST).write_text(json.dumps(old))
    loaded = hfx.load(path)
    assert loaded.meta == parts.meta
    inputs = hfx.zoo.inputs("llava", batch=2, sequence=4)
    assert torch.equal(hfx.generate(inputs, loaded, max_new_tokens=6), hfx.generate(inputs, parts, max_new_tokens=6))


def test_save_directory_is_a_stage_that_pipes(exported, tmp_path):
    path = pipe(exported("bert"), hfx.save(tmp_path / "piped", overwrite=False))
    assert path == tmp_path / "piped" and hfx.load(path).io == exported("bert").io


def test_the_old_argument_order_is_a_type_error_and_writes_nothing(exported, tmp_path):
    with pytest.raises(TypeError, match=r"program \(the last argument\) must be a program or Components, got PosixPath; "
                                        r"call save\(directory, program\)"):
        hfx.save(exported("bert"), tmp_path / "swapped")
    with pytest.raises(TypeError, match=r"directory must be a path \(str or os.PathLike\), got Exported"):
        hfx.save(exported("bert"), exported("bert"))
    assert list(tmp_path.iterdir()) == []
