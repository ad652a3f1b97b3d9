"""The Transformers.js package: ``@huggingface/transformers`` in node loads it as it is and gives eager's tokens and embeddings.

One node process runs every Transformers.js check of this file (``transformers_js_run.mjs``), on packages
built once per module; the tests read its results.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import attrs
import pytest
import torch
from toolz import pipe

import hfx
from hfx import zoo
from tests.helpers import install_transformers_js
from tests.tolerances import FP32_PARITY

# The consumers are in the test extra: a missing one is an install step (pip install -e '.[test]'), not a skip.
import onnx_ir as ir  # noqa: E402

PROMPTS = ["hello world", "models speak in tokens: numbers and words"]
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog"]
NEW_TOKENS = 8
SCRIPT = Path(__file__).with_name("transformers_js_run.mjs")


@pytest.fixture(scope="module")
def wordpiece():
    """A tiny BERT WordPiece tokenizer trained in-process (the zoo has none); trained once, as two trainings
    of equally frequent pieces may number them differently."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials, show_progress=False)
    tokenizer.train_from_iterator([*PROMPTS, *TEXTS] * 8, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return BertTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")


@pytest.fixture(scope="module")
def bert():
    return zoo.build("bert")


@pytest.fixture(scope="module")
def parts(llama):
    prompt = zoo.tokenizer()(["hello world, export once", "the quick brown fox"], return_tensors="pt", padding=True)
    return pipe(llama, hfx.capture(dict(prompt)), hfx.decompose(multi_token_decode=True))


@pytest.fixture(scope="module")
def decode(parts):
    from hfx._package.transformers_js import lowered_for_node

    return lowered_for_node(parts["decode"])  # what the writer lowers an Exported to; given here already lowered


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("transformers-js")


@pytest.fixture(scope="module")
def llama_dir(parts, decode, root):
    lowered = attrs.evolve(parts, items={"decode": decode})  # the bert package is given a Capture
    return hfx.package(root / "llama", lowered, consumer="transformers.js", tokenizer=zoo.tokenizer(), variants=("q8", "q4"))


@pytest.fixture(scope="module")
def bert_dir(bert, wordpiece, root):
    inputs = wordpiece(TEXTS, return_tensors="pt", padding=True)  # input_ids, token_type_ids, attention_mask
    encoder = hfx.decompose(hfx.capture(dict(inputs), bert))
    return hfx.package(root / "bert", encoder, consumer="transformers.js", tokenizer=wordpiece)


@pytest.fixture(scope="module")
def node(llama_dir, bert_dir, root):
    """What Transformers.js produced on both packages: one node process for the whole module."""
    prefix = install_transformers_js()
    job = {
        "root": str(root),
        "generate": [{"key": dtype, "path": str(llama_dir), "dtype": dtype, "prompts": PROMPTS, "new_tokens": NEW_TOKENS}
                     for dtype in ("fp32", "q8", "q4")],
        "extract": [{"key": "bert", "path": str(bert_dir), "texts": TEXTS}],
    }
    (root / "job.json").write_text(json.dumps(job))
    run = subprocess.run(["node", str(SCRIPT), str(prefix), str(root / "job.json")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _eager_new_tokens(model, prompt: str) -> list[int]:
    ids = zoo.tokenizer()(prompt, return_tensors="pt")
    with torch.no_grad():
        # min_new_tokens: a random model may say EOS early; Transformers.js is asked for the same count.
        out = model.generate(**ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_text_generation_gives_the_eager_greedy_tokens(llama, node, index):
    assert node["generate"]["fp32"][index] == _eager_new_tokens(llama, PROMPTS[index])


def test_the_pipeline_text_is_the_eager_text(llama, node):
    want = [zoo.tokenizer().decode(_eager_new_tokens(llama, prompt), skip_special_tokens=True) for prompt in PROMPTS]
    assert node["text"]["fp32"] == want


def test_feature_extraction_gives_the_eager_last_hidden_state(bert, wordpiece, node):
    inputs = wordpiece(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        want = bert(**inputs).last_hidden_state
    got = node["extract"]["bert"]
    assert got["dims"] == list(want.shape)
    # fp32 through ONNX Runtime's kernels (fused LayerNorm, other summation orders): ~1e-6 off, well under 1e-4.
    torch.testing.assert_close(torch.tensor(got["data"]).reshape(want.shape), want, atol=FP32_PARITY, rtol=FP32_PARITY)


@pytest.mark.parametrize(("dtype", "stem", "ops"), [("q8", "model_quantized", {"MatMulInteger", "DynamicQuantizeLinear"}),
                                                    ("q4", "model_q4", {"MatMulNBits"})])
def test_each_quantized_variant_is_hfx_quantize_onnx_and_generates_its_tokens(llama_dir, node, dtype, stem, ops):
    from hfx.backends._onnx import load_files

    quantized = ir.load(llama_dir / "onnx" / f"{stem}.onnx")
    assert ops <= {node.op_type for node in quantized.graph}
    # Transformers.js's quantized tokens are those of the same file run by hfx (ONNX Runtime in Python), not eager's.
    loaded = hfx.load(llama_dir)
    program = load_files({"files": [f"onnx/{stem}.onnx"]}, llama_dir, name="decode", io=loaded["decode"].io)
    for prompt, tokens in zip(PROMPTS, node["generate"][dtype], strict=True):
        ids = dict(zoo.tokenizer()(prompt, return_tensors="pt"))
        # No EOS stop: Transformers.js was asked for min_new_tokens, and none of these argmaxes is EOS.
        out = hfx.generate(ids, attrs.evolve(loaded, items={"decode": program}), max_new_tokens=NEW_TOKENS, eos_token_id=None)
        assert out[0, ids["input_ids"].shape[1]:].tolist() == tokens


def test_the_package_has_transformers_js_names_and_files(llama_dir, bert_dir, llama):
    names = {path.relative_to(llama_dir).as_posix() for path in llama_dir.rglob("*") if path.is_file()}
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_quantized.onnx", "onnx/model_quantized.onnx_data",
            "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "hfx.json"} <= names
    assert not any(name.endswith(".onnx.data") for name in names)  # the weights are stored once, in Transformers.js's name
    model = ir.load(llama_dir / "onnx" / "model.onnx")
    layers = range(llama.config.num_hidden_layers)
    assert [v.name for v in model.graph.inputs] == [
        "input_ids", *(f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")), "position_ids", "attention_mask"]
    assert [v.name for v in model.graph.outputs] == ["logits", *(f"present.{i}.{kv}" for i in layers for kv in ("key", "value"))]
    assert str(model.graph.inputs[1].shape[0]) == "batch_size"  # Transformers.js sizes its empty cache by this name
    config = json.loads((llama_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["transformers.js_config"] == {
        "dtype": "fp32", "use_external_data_format": {"model.onnx": 1, "model_quantized.onnx": 1, "model_q4.onnx": 1}}
    assert None not in json.loads((llama_dir / "generation_config.json").read_text()).values()
    encoder = ir.load(bert_dir / "onnx" / "model.onnx")
    assert [v.name for v in encoder.graph.inputs] == ["input_ids", "token_type_ids", "attention_mask"]
    assert encoder.graph.outputs[0].name == "last_hidden_state"
    assert json.loads((bert_dir / "config.json").read_text())["model_type"] == "bert"
    assert not (bert_dir / "generation_config.json").exists()


def test_hfx_loads_the_package_and_generates_the_eager_tokens(llama, llama_dir):
    loaded = hfx.load(llama_dir)
    assert list(loaded) == ["decode"]
    assert loaded["decode"].io.input_names[1] == "past_key_values.0.key"
    prompt = zoo.tokenizer()(["hello world", "the lazy dog jumps over"], return_tensors="pt", padding=True)
    want = llama.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(hfx.generate(dict(prompt), loaded, max_new_tokens=6), want)


def test_hfx_inspect_reads_the_package(llama_dir):
    from hfx._cli.inspect import describe

    component = describe(llama_dir)["components"]["decode"]
    assert list(component["files"]) == ["onnx/model.onnx", "onnx/model.onnx_data"]
    assert None not in component["files"].values()
    assert component["inputs"][1]["name"] == "past_key_values.0.key"


def test_renaming_returns_a_new_program_and_leaves_the_given_one(parts, decode):
    from hfx._package.transformers_js import transformers_js_names

    program = decode
    before = [v.name for v in program.model.graph.inputs]
    renamed = transformers_js_names(program)
    assert [v.name for v in program.model.graph.inputs] == before and program.io.input_names == tuple(before)
    assert renamed.io.input_names[1:3] == ("past_key_values.0.key", "past_key_values.0.value")
    prompt = dict(zoo.tokenizer()("hello world", return_tensors="pt"))
    assert torch.equal(hfx.generate(prompt, hfx.Components(items={"decode": renamed}, meta=parts.meta), max_new_tokens=4),
                       hfx.generate(prompt, hfx.Components(items={"decode": program}, meta=parts.meta), max_new_tokens=4))


def test_transformers_js_refuses_what_it_cannot_load(parts, bert, tmp_path):
    package = hfx.package(consumer="transformers.js", tokenizer=zoo.tokenizer())
    split = pipe(zoo.build("llama"), hfx.capture(zoo.inputs("llama")), hfx.decompose(multi_token_decode=False))
    with pytest.raises(ValueError, match=r"transformers.js: .*one graph.*multi_token_decode=True"):
        package(tmp_path / "a", split)
    t5 = pipe(zoo.build("t5"), hfx.capture(zoo.inputs("t5")), hfx.decompose(multi_token_decode=True))
    with pytest.raises(ValueError, match=r"transformers.js: .*encoder-decoder"):
        package(tmp_path / "b", t5)
    gqa = hfx.lower_to_onnx(parts["decode"])  # ORT_FUSIONS: ONNX Runtime 1.32's GroupQueryAttention
    fused = hfx.Components(items={"decode": gqa}, meta=parts.meta)
    with pytest.raises(ValueError, match=r"transformers.js: .*GroupQueryAttention.*onnxruntime-node \(1.30\) cannot load"):
        package(tmp_path / "f", fused)
    with pytest.raises(ValueError, match=r"transformers.js: no variants \['int3'\]; transformers.js takes \['q4', 'q8'\]"):
        hfx.package(tmp_path / "d", parts, consumer="transformers.js", tokenizer=zoo.tokenizer(), variants=("int3",))
    with pytest.raises(ValueError, match=r"openvino-genai: no variants \['q8'\]; openvino-genai takes none"):
        hfx.package(tmp_path / "e", parts, consumer="openvino-genai", tokenizer=zoo.tokenizer(), variants=("q8",))
    positions = {**zoo.inputs("bert"), "position_ids": torch.arange(7).expand(2, 7)}
    with pytest.raises(ValueError, match=r"transformers.js: the graph takes \['position_ids'\].*encoder_forward"):
        package(tmp_path / "f", hfx.decompose(hfx.capture(positions, bert)))
    by_hand = hfx.Components(items={"model": hfx.capture(zoo.inputs("bert"), bert)})
    with pytest.raises(ValueError, match=r"transformers.js: no model config.*hfx.decompose"):
        package(tmp_path / "g", by_hand)
    assert not any(tmp_path.iterdir())  # a refused package writes nothing
