"""Helpers shared by the tests: shapes, new inputs, model-state snapshots and the install of Transformers.js."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hfx import zoo

# Capture shapes, and the different shapes every parity test uses.
CAPTURE_SHAPE = {"batch": 2, "sequence": 7}
NEW_SHAPE = {"batch": 3, "sequence": 11}
PARITY_MODELS = ("llama", "qwen3", "bert", "vit")


def memoized(make):
    """``get(name)``: ``make(name)``, made once per name (what the session and module fixtures hand out)."""
    import functools

    return functools.lru_cache(maxsize=None)(make)


def exported_by_name(models):
    """``get(name)``: ``models(name)`` exported once from capture-shaped zoo inputs."""
    import hfx

    return memoized(lambda name: hfx.export(hfx.capture(zoo.inputs(name, **CAPTURE_SHAPE), models(name))))


def decomposed_by_name(models):
    """``get(name)``: ``(models(name), its decomposed Components exported)``, made once from capture-shaped zoo inputs."""
    import hfx

    return memoized(lambda name: (models(name), hfx.export(hfx.decompose(
        hfx.capture(zoo.inputs(name, **CAPTURE_SHAPE), models(name))))))


# The config fields that count a model's layers (decoder, encoder-decoder, nested language model).
_LAYER_COUNTS = ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers")


def one_layer(name: str, **overrides) -> torch.nn.Module:
    """The zoo model ``name`` with one layer per stack (and ``overrides`` set on its config): the same graphs
    and cache structure in fewer nodes.

    ExecuTorch lowers about 12 s per decoder layer on 2 cores; the tests whose point is a path through a
    runtime (a cache kept across steps, an encoder-decoder, a vision-language model) lower this one.
    """
    import transformers

    spec = zoo.entry(name)
    config = spec.config()
    for part in (config, getattr(config, "text_config", None)):
        for field in _LAYER_COUNTS:
            if part is not None and isinstance(getattr(part, field, None), int):
                setattr(part, field, 1)
        stored = part is not None and not isinstance(getattr(type(part), "layer_types", None), property)
        if stored and isinstance(getattr(part, "layer_types", None), list):  # 5.24's Mamba derives it: a property
            part.layer_types = part.layer_types[:1]  # configs check one type per layer
    for field, value in overrides.items():
        setattr(config, field, value)
    torch.manual_seed(0)
    return getattr(transformers, spec.auto_class).from_config(config).eval()


def new_inputs(name: str) -> dict[str, torch.Tensor]:
    """Inputs of a different batch size and sequence length than the capture."""
    return zoo.inputs(name, **NEW_SHAPE)


def forward_report_at_a_new_shape(name: str, lower: Callable[[Any], Any] = lambda exported: exported) -> Any:
    """``hfx.verify``'s report for zoo model ``name`` exported at the capture shape, lowered with ``lower``, run at
    ``NEW_SHAPE``."""
    import hfx

    model = zoo.build(name)
    program = lower(hfx.export(hfx.capture(zoo.forward_inputs(name, **CAPTURE_SHAPE))(model)))
    return hfx.verify(model, zoo.forward_inputs(name, **NEW_SHAPE), program)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A deep copy of the model's parameters and buffers, to compare after a stage."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def class_forwards(model: torch.nn.Module) -> dict[type, object]:
    """Each of ``model``'s module classes with the ``forward`` it defines itself (``None`` where it inherits one)."""
    return {type(m): vars(type(m)).get("forward") for m in model.modules()}


def assert_leaves_forwards(patch: Callable[[torch.nn.Module], Any], model: torch.nn.Module) -> None:
    """While ``patch(model)`` is active, every module class of ``model`` keeps the ``forward`` it had (a no-op)."""
    before = class_forwards(model)
    with patch(model):
        assert class_forwards(model) == before


def assert_same_state(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


GENERATIVE_MODELS = ("llama", "t5", "whisper", "llava")
# What opus-mt Marian checkpoints ship (Helsinki-NLP/opus-mt-*/generation_config.json), with the zoo's token ids.
MARIAN_SHIPPED = {"num_beams": 4, "forced_eos_token_id": 2, "bad_words_ids": [[1]], "max_length": 64}
def _cache_argument(model_class: str) -> str:
    import inspect

    import transformers

    from hfx._upstream import cache_argument

    return cache_argument(inspect.signature(getattr(transformers, model_class).forward).parameters)


# The installed transformers' names for the cache argument: 5.24's ``cache``; 5.22/5.23's
# ``past_key_values`` (attention) and ``cache_params`` (state-space models).
CACHE_ARGUMENT = _cache_argument("LlamaForCausalLM")
SSM_CACHE_ARGUMENT = _cache_argument("MambaForCausalLM")

NEW_TOKENS = {"llama": 32, "t5": 16, "whisper": 16, "llava": 16}


def eager_tokens(model: torch.nn.Module, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
    """What ``model.generate`` gives greedily: the reference every runtime must match exactly."""
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)


def decomposed(name: str) -> tuple[torch.nn.Module, Any]:
    """A zoo model and its ``decompose`` from a 2 x 7 capture."""
    import hfx

    model = zoo.build(name)
    return model, hfx.decompose(hfx.capture(zoo.inputs(name, batch=2, sequence=7), model))


def assert_eager_tokens(model: torch.nn.Module, programs: Any, name: str) -> None:
    """``hfx.generate`` over ``programs`` gives eager ``generate``'s 6 tokens on a 3 x 9 prompt."""
    import hfx

    inputs = zoo.inputs(name, batch=3, sequence=9)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=6), eager_tokens(model, inputs, 6))


def packed_image_inputs(config, batch: int, text: int, grid: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """Qwen2-VL-style inputs with images of ``grid`` (t, h, w patches), row 0 left-padded by 2 when batch > 1."""
    generator = torch.Generator().manual_seed(batch * 100 + text + sum(grid))
    vision = config.vision_config
    t, h, w = grid
    block = [config.vision_start_token_id, *[config.image_token_id] * (t * h * w // vision.spatial_merge_size**2),
             config.vision_end_token_id]
    high = min(config.image_token_id, config.vision_start_token_id, config.vision_end_token_id)
    rows = [torch.cat([torch.tensor(block), torch.randint(3, high, (text,), generator=generator)]) for _ in range(batch)]
    ids = torch.stack(rows)
    mask = torch.ones_like(ids)
    if batch > 1:
        ids[0] = torch.cat([torch.zeros(2, dtype=ids.dtype), ids[0, :-2]])
        mask[0, :2] = 0
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long(),
            "pixel_values": torch.randn(batch * t * h * w, patch, generator=generator),
            "image_grid_thw": torch.tensor([list(grid)] * batch)}


class DataDependent(torch.nn.Module):
    """A runtime assert on a data-dependent size, and an input named like a Python builtin."""

    def forward(self, input):  # noqa: A002 - the name under test
        count = input.sum().to(torch.int64).item()
        torch._check(count >= 0)
        return input * 2, torch.zeros(count)


class TiedHead(torch.nn.Module):
    """Token embedding, a layer, and logits through the embedding's own weight (``tie_word_embeddings``)."""

    def __init__(self, vocab: int = 512, hidden: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layer = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.layer(self.embed(input_ids))))


class PatchGrid(torch.nn.Module):
    """RADIO's patch embedding: 8-pixel patches by ``reshape`` (a size that is not a multiple of 8 fails, in eager
    too) and a 4 x 4 position table resized to the grid. Traced at 32 px, hfx keeps the sizes 32 to 39 its branches
    allow (``h // 8 == 4``), of which 32 alone runs."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = pixel_values.shape
        rows, cols = height // 8, width // 8
        patches = pixel_values.reshape(batch, channels, rows, 8, cols, 8).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(batch, rows * cols, channels * 64)[..., :4]
        table = torch.nn.functional.interpolate(self.table.reshape(1, 4, 4, 4).permute(0, 3, 1, 2),
                                                size=(max(rows, cols),) * 2, mode="bilinear")
        if rows < table.shape[-2]:
            table = table[..., :rows, :]
        if cols < table.shape[-1]:
            table = table[..., :cols]
        return patches + table.flatten(2).permute(0, 2, 1)


class EmptyValues(torch.nn.Module):
    """A latent-attention cache layer's step (Mistral Large 4): ``values`` of width 0 grow along the past like
    the keys; the step's empty values are computed (their size-0 dim is known when the runtime converts)."""

    def forward(self, keys, values, new_keys):
        new_values = new_keys[..., :0]
        return {"keys": torch.cat([keys, new_keys], dim=-2), "values": torch.cat([values, new_values], dim=-2)}


def empty_values_step(batch: int, past: int) -> dict[str, torch.Tensor]:
    """``EmptyValues``' inputs: a past of ``past`` positions and one new one."""
    return {"keys": torch.randn(batch, 1, past, 4), "values": torch.zeros(batch, 1, past, 0),
            "new_keys": torch.randn(batch, 1, 1, 4)}


def empty_values_export() -> Any:
    """``EmptyValues`` exported at batch 2 and a past of 5, batch and past dynamic."""
    import hfx

    axes = {"keys": {0: "batch", 2: "past"}, "values": {0: "batch", 2: "past"}, "new_keys": {0: "batch"}}
    shapes = hfx.DynamicShapes(axes=axes, bounds={"batch": (1, 8), "past": (1, 64)})
    return hfx.export(hfx.capture(empty_values_step(2, 5), EmptyValues(), dynamic_shapes=shapes))


def schema_1_meta(meta: dict) -> dict:
    """A ``GenerationMeta.to_json()`` as manifests of schema 1 held it: one flat dict, ``save(meta=...)``'s facts on top."""
    generation, roles, model = meta["generation"], meta["roles"], meta["model"]
    flat = {
        "generation_config": generation["config"],
        "is_encoder_decoder": generation["is_encoder_decoder"],
        "decoder_start_token_id": generation["decoder_start_token_id"],
        "model_class": model["class_name"],
        "config": model["config"],
        "cache_input": roles["cache_input"],
        "returns_start_token": generation["returns_start_token"],
        "feature_encoders": roles["feature_encoders"],
        "projectors": roles["projectors"],
        "encoder_inputs": {
            name: {"names": how["names"], "computed": {getter: {"options": options} for getter, options in how["computed"].items()}}
            for name, how in meta["encoder_inputs"].items()
        },
        "placeholder_tokens": roles["placeholder_tokens"],
    }
    return {**flat, **({"quantization": meta["quantization"]} if meta["quantization"] else {}), **meta["extra"]}


# Transformers.js, from the npm registry, installed into a cache folder of the repo that git ignores.
TRANSFORMERS_JS = "4.3.2"
NODE_PREFIX = Path(__file__).resolve().parents[1] / ".cache" / "node"


def install_transformers_js() -> Path:
    """``NODE_PREFIX`` with ``@huggingface/transformers@TRANSFORMERS_JS`` installed (npm runs when it is absent)."""
    installed = NODE_PREFIX / "node_modules" / "@huggingface" / "transformers" / "package.json"
    if installed.is_file() and json.loads(installed.read_text())["version"] == TRANSFORMERS_JS:
        return NODE_PREFIX
    if shutil.which("npm") is None:
        msg = "the Transformers.js tests need node (>= 18) and npm on PATH to install @huggingface/transformers"
        raise RuntimeError(msg)
    # onnxruntime-node's postinstall fetches CUDA binaries from NuGet; its CPU binaries ship in the npm package.
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"}
    subprocess.run(["npm", "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund", "--loglevel=error",
                    f"@huggingface/transformers@{TRANSFORMERS_JS}"], env=env, check=True)
    return NODE_PREFIX


def whisper_speech_parts(config) -> tuple:
    """``(tokenizer, feature extractor)`` the ASR pipeline takes for a zoo Whisper (no download).

    A byte-level Whisper tokenizer whose special tokens sit at the config's ids (pad 0, start 1, EOS 2) and
    ``<|notimestamps|>`` at the last id, so no generated id reads as a timestamp; features of one 1-second chunk
    at ``config.max_source_positions * 2`` frames, the length the tiny encoder takes.
    """
    from transformers import WhisperFeatureExtractor, WhisperTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<|pad|>": 0, "<|startoftranscript|>": 1, "<|endoftext|>": 2}
    for char in bytes_to_unicode().values():
        if len(vocab) < config.vocab_size - 1:
            vocab.setdefault(char, len(vocab))
    vocab["<|notimestamps|>"] = config.vocab_size - 1
    tokenizer = WhisperTokenizer(vocab=vocab, merges=[], pad_token="<|pad|>")
    frames = config.max_source_positions * 2
    features = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=16000, chunk_length=1,
                                       hop_length=16000 // frames, n_fft=400)
    return tokenizer, features


def llava_processor(config):
    """A ``LlavaProcessor`` for a zoo LLaVA: the zoo tokenizer with ``<image>`` at the config's image token id."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    tokenizer = zoo.tokenizer()
    tokenizer.add_tokens([f"<unused{i}>" for i in range(config.image_token_index - len(tokenizer))])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    side = config.vision_config.image_size
    images = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=config.vision_config.patch_size,
                          vision_feature_select_strategy="default", image_token="<image>", num_additional_image_tokens=1)
