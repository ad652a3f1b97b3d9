"""Property tests: random tiny configs of three families, exported once, match eager on every runtime at a random shape.

Hypothesis draws a config (Llama-like: layers, heads, KV heads, head dim, rope variant, tied embeddings; BERT-like;
ViT-like), builds the model with random weights, captures it at one shape, exports it and lowers it to the runtime
of the test (the Exported itself, ONNX Runtime, ExecuTorch, OpenVINO); the program must then give eager's outputs on
inputs of another, drawn, batch size and sequence length (with left padding for the text families), within the
float32 bounds of tests/tolerances.py.

``HFX_PROPERTY_EXAMPLES`` sets the examples per family and runtime. By default (the README's test command) each
runtime gets 2 (hypothesis's first is the simplest config, the second a random one) and ExecuTorch 1, the simplest:
its lowering takes ~15 s per random config here, and the random ones of every family reach it in ``.ci/run``'s own
step, 10 per family and runtime (120 in all); ``HFX_PROPERTY_EXAMPLES=200 pytest tests/test_properties.py`` searches
longer.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import hfx  # noqa: E402
from tests.tolerances import FP32_PARITY, FP32_PARITY_RTOL  # noqa: E402

CAPTURE = {"batch": 2, "sequence": 6}


def examples(runtime: str) -> int:
    """How many configs hypothesis draws per family on ``runtime`` (the module's docstring)."""
    asked = os.environ.get("HFX_PROPERTY_EXAMPLES")
    return int(asked) if asked else 1 if runtime == "pte" else 2


def check_property(runtime: str, check: Callable[..., None], **strategies: Any) -> None:
    """Run ``check(**drawn)`` on ``examples(runtime)`` draws of ``strategies``."""
    run = settings(max_examples=examples(runtime), deadline=None, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(given(**strategies)(check))
    run()


# runtime -> (package the runtime needs, the lowering of an Exported; None: the Exported program itself)
RUNTIMES: dict[str, tuple[str, Callable[[hfx.Exported], Any] | None]] = {
    "torch": ("torch", None),
    "onnx": ("onnxruntime", hfx.lower_to_onnx),
    "pte": ("executorch", hfx.lower_to_pte),
    "ov": ("openvino", hfx.lower_to_ov),
}

ROPE_VARIANTS = (
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
    {"rope_type": "default", "partial_rotary_factor": 0.5},
)


@st.composite
def llama_configs(draw) -> Any:
    """A Llama config: 1-2 layers, grouped or multi-head attention, a head dim of its own, a rope variant."""
    from transformers import LlamaConfig

    kv_heads = draw(st.sampled_from((1, 2)))
    heads = kv_heads * draw(st.sampled_from((1, 2, 3)))
    rope = {"rope_theta": draw(st.sampled_from((10000.0, 500000.0))), **draw(st.sampled_from(ROPE_VARIANTS))}
    return LlamaConfig(
        # transformers 5.24 checks hidden_size % heads == 0 even when head_dim is given
        vocab_size=draw(st.integers(32, 160)), hidden_size=heads * draw(st.sampled_from((4, 8, 16))),
        intermediate_size=draw(st.sampled_from((16, 40, 64))), num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=draw(st.sampled_from((4, 8, 16))),
        tie_word_embeddings=draw(st.booleans()), attention_bias=draw(st.booleans()),
        max_position_embeddings=64, rope_parameters=rope, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


@st.composite
def bert_configs(draw) -> Any:
    """A BERT config: 1-2 layers, 1-4 heads of 4 or 8, one or two token types, an activation."""
    from transformers import BertConfig

    heads = draw(st.sampled_from((1, 2, 4)))
    return BertConfig(
        vocab_size=draw(st.integers(32, 160)), hidden_size=heads * draw(st.sampled_from((4, 8))),
        num_hidden_layers=draw(st.integers(1, 2)), num_attention_heads=heads,
        intermediate_size=draw(st.sampled_from((16, 40, 64))), type_vocab_size=draw(st.sampled_from((1, 2))),
        hidden_act=draw(st.sampled_from(("gelu", "relu", "gelu_new", "silu"))), max_position_embeddings=64,
        pad_token_id=0,
    )


@st.composite
def vit_configs(draw) -> Any:
    """A ViT config: a square image of 2 to 4 patches a side, 1 or 3 channels, 1-2 layers."""
    from transformers import ViTConfig

    heads = draw(st.sampled_from((1, 2, 4)))
    patch = draw(st.sampled_from((4, 8)))
    return ViTConfig(
        image_size=patch * draw(st.integers(2, 4)), patch_size=patch, num_channels=draw(st.sampled_from((1, 3))),
        hidden_size=heads * draw(st.sampled_from((4, 8))), num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=heads, intermediate_size=draw(st.sampled_from((16, 40))),
        qkv_bias=draw(st.booleans()), num_labels=draw(st.integers(2, 5)),
    )


def text_inputs(config: Any, batch: int, sequence: int, *, padding: list[int], token_types: bool) -> dict:
    """Random token ids with row ``i`` left-padded by ``padding[i]`` (at least one real token per row)."""
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    ids = torch.randint(3, config.vocab_size, (batch, sequence), generator=generator)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    for row, pad in enumerate(padding):
        mask[row, :pad] = 0
        ids[row, :pad] = config.pad_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        inputs["token_type_ids"] = torch.randint(0, config.type_vocab_size, (batch, sequence), generator=generator)
    return inputs


def image_inputs(config: Any, batch: int) -> dict:
    generator = torch.Generator().manual_seed(batch)
    return {"pixel_values": torch.randn(batch, config.num_channels, config.image_size, config.image_size,
                                        generator=generator)}


@st.composite
def text_shapes(draw) -> tuple[int, int, list[int]]:
    """(batch, sequence, left padding per row): another shape than the capture's, padding below the length."""
    batch, sequence = draw(st.integers(1, 4)), draw(st.integers(1, 16))
    hypothesis.assume((batch, sequence) != (CAPTURE["batch"], CAPTURE["sequence"]))
    return batch, sequence, draw(st.lists(st.integers(0, sequence - 1), min_size=batch, max_size=batch))


def model_of(auto_class: str, config: Any) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, auto_class).from_config(config, attn_implementation="sdpa").eval()


def assert_matches_eager(runtime: str, model: torch.nn.Module, capture: dict, check: dict) -> None:
    """Export ``model`` at ``capture`` and lower it to ``runtime``: the program gives eager's outputs on ``check``."""
    package, lower = RUNTIMES[runtime]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    exported = hfx.export(hfx.capture(capture, model))
    program = exported if lower is None else lower(exported)
    with torch.no_grad():
        scale = float(model(**check)[0].abs().max())
    report = hfx.verify(model, check, program, atol=FP32_PARITY + FP32_PARITY_RTOL * scale)
    assert report.passed, f"{runtime}: {model.config}\ncheck shapes {({k: tuple(v.shape) for k, v in check.items()})}: {report}"


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_a_llama_like_config_matches_eager(runtime):
    def check(config, shape):
        batch, sequence, padding = shape
        model = model_of("AutoModelForCausalLM", config)
        capture = text_inputs(config, **CAPTURE, padding=[0, 2], token_types=False)
        assert_matches_eager(runtime, model, capture, text_inputs(config, batch, sequence, padding=padding,
                                                                 token_types=False))

    check_property(runtime, check, config=llama_configs(), shape=text_shapes())


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_a_bert_like_config_matches_eager(runtime):
    def check(config, shape, head):
        batch, sequence, padding = shape
        model = model_of(head, config)
        types = config.type_vocab_size > 1
        capture = text_inputs(config, **CAPTURE, padding=[0, 2], token_types=types)
        assert_matches_eager(runtime, model, capture, text_inputs(config, batch, sequence, padding=padding,
                                                                 token_types=types))

    check_property(runtime, check, config=bert_configs(), shape=text_shapes(),
                   head=st.sampled_from(("AutoModel", "AutoModelForMaskedLM", "AutoModelForSequenceClassification")))


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_a_vit_like_config_matches_eager(runtime):
    def check(config, batch, head):
        model = model_of(head, config)
        assert_matches_eager(runtime, model, image_inputs(config, CAPTURE["batch"]), image_inputs(config, batch))

    check_property(runtime, check, config=vit_configs(), batch=st.sampled_from((1, 3, 4)),
                   head=st.sampled_from(("AutoModel", "AutoModelForImageClassification")))
