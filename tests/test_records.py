"""GenerationMeta: what ``Components`` share and ``generate`` reads; defaults, frozen, JSON round trip, schema 1 read."""

from __future__ import annotations

import json

import attrs
import pytest
import torch

import hfx
from hfx import zoo
from tests.helpers import CACHE_ARGUMENT, schema_1_meta

DECOMPOSED = ("llama", "t5", "whisper", "llava", "qwen2_vl")


@pytest.fixture(scope="module")
def metas(models):
    """The ``meta`` of each decomposed zoo model (decompose only: nothing is exported)."""
    return {name: hfx.decompose(hfx.capture(zoo.inputs(name), models(name))).meta for name in DECOMPOSED}


def test_defaults_describe_a_single_program():
    meta = hfx.GenerationMeta()
    assert dict(meta.generation.config) == {} and meta.generation.decoder_start_token_id is None
    assert not meta.generation.is_encoder_decoder and meta.generation.returns_start_token
    assert meta.roles == hfx.ComponentRoles() and meta.roles.cache_input is None and dict(meta.roles.feature_encoders) == {}
    assert meta.model.class_name == "" and dict(meta.model.config) == {}
    assert dict(meta.encoder_inputs) == {} and dict(meta.quantization) == {} and dict(meta.extra) == {}
    assert hfx.Components(items={}).meta == meta


def test_decompose_fills_each_group(metas):
    llama, whisper, llava, qwen = metas["llama"], metas["whisper"], metas["llava"], metas["qwen2_vl"]
    assert llama.model.class_name == "LlamaForCausalLM" and llama.model.config["model_type"] == "llama"
    assert llama.roles.cache_input == CACHE_ARGUMENT and not llama.generation.is_encoder_decoder
    assert whisper.generation.is_encoder_decoder and not whisper.generation.returns_start_token
    assert metas["t5"].generation.returns_start_token and metas["t5"].generation.decoder_start_token_id == 0
    assert dict(llava.roles.feature_encoders) == {"image_encoder": "image"} and dict(llava.roles.projectors) == {"image": "projector"}
    assert dict(qwen.encoder_inputs["image_encoder"].computed["get_vision_attention_seqlens"]) == {"merge_temporal": False}


def test_the_record_and_its_mappings_are_frozen():
    given = {"eos_token_id": 2}
    settings = hfx.GenerationSettings(config=given)
    given["eos_token_id"] = 3
    assert settings.config["eos_token_id"] == 2  # a private copy
    meta = hfx.GenerationMeta(generation=settings)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        meta.extra = {"x": 1}  # type: ignore[misc]
    with pytest.raises(TypeError):
        meta.generation.config["eos_token_id"] = 3  # type: ignore[index]
    inputs = hfx.EncoderInputs(names={"grid_thw": "image_grid_thw"}, computed={"get_vision_attention_seqlens": {"merge_temporal": False}})
    with pytest.raises(TypeError):
        inputs.computed["get_vision_attention_seqlens"]["merge_temporal"] = True  # type: ignore[index]


@pytest.mark.parametrize("name", DECOMPOSED)
def test_to_json_round_trips_through_a_json_file(metas, name):
    meta = attrs.evolve(metas[name], quantization={"stage": "quantize_onnx", "mode": "static"}, extra={"model_id": name})
    written = json.loads(json.dumps(meta.to_json()))
    assert hfx.GenerationMeta.from_json(written) == meta
    assert set(written) == {"generation", "roles", "model", "encoder_inputs", "quantization", "extra"}


@pytest.mark.parametrize("name", DECOMPOSED)
def test_the_flat_dict_of_schema_1_manifests_reads_as_the_same_record(metas, name):
    meta = attrs.evolve(metas[name], quantization={"stage": "quantize_pt2e"}, extra={"model_id": name})
    # prompts_the_decoder came after schema 1: an old manifest reads as False, the default
    meta = attrs.evolve(meta, generation=attrs.evolve(meta.generation, prompts_the_decoder=False))
    assert hfx.GenerationMeta.from_json(schema_1_meta(meta.to_json())) == meta


def test_a_schema_1_dict_written_by_the_old_decompose_reads_field_by_field():
    old = {  # hfx 0.1's decompose of the zoo's Qwen2-VL (configs cut short), plus a save(meta=...) fact
        "generation_config": {"eos_token_id": 2, "pad_token_id": None}, "is_encoder_decoder": False,
        "decoder_start_token_id": None, "model_class": "Qwen2VLForConditionalGeneration", "config": {"model_type": "qwen2_vl"},
        "cache_input": "past_key_values", "returns_start_token": True, "feature_encoders": {"image_encoder": "image"},
        "projectors": {}, "placeholder_tokens": {"image": 255},
        "encoder_inputs": {"image_encoder": {
            "names": {"grid_thw": "image_grid_thw", "hidden_states": "pixel_values"},
            "computed": {"get_vision_position_ids": {"options": {"spatial_merge_size": 2, "include_temporal": False}},
                         "get_vision_attention_seqlens": {"options": {"merge_temporal": False}}}}},
        "quantization": {"stage": "quantize_ov", "mode": "int8"},
        "model_id": "tiny-qwen",
    }
    meta = hfx.GenerationMeta.from_json(old)
    assert meta.generation.config["eos_token_id"] == 2 and meta.generation.returns_start_token
    assert meta.model == hfx.ModelSpec(class_name="Qwen2VLForConditionalGeneration", config={"model_type": "qwen2_vl"})
    assert meta.roles == hfx.ComponentRoles(feature_encoders={"image_encoder": "image"}, cache_input="past_key_values",
                                            placeholder_tokens={"image": 255})
    encoder = meta.encoder_inputs["image_encoder"]
    assert dict(encoder.names) == {"grid_thw": "image_grid_thw", "hidden_states": "pixel_values"}
    assert dict(encoder.computed["get_vision_position_ids"]) == {"spatial_merge_size": 2, "include_temporal": False}
    assert dict(meta.quantization) == {"stage": "quantize_ov", "mode": "int8"} and dict(meta.extra) == {"model_id": "tiny-qwen"}
    assert hfx.GenerationMeta.from_json({}) == hfx.GenerationMeta()  # a single program's manifest


def test_bad_values_are_named():
    with pytest.raises(TypeError, match="is_encoder_decoder"):
        hfx.GenerationSettings(is_encoder_decoder="yes")
    with pytest.raises(TypeError, match="placeholder_tokens"):
        hfx.ComponentRoles(placeholder_tokens={"image": "<image>"})
    with pytest.raises(TypeError, match="feature_encoders"):
        hfx.ComponentRoles(feature_encoders="image_encoder")
    with pytest.raises(TypeError, match=r"GenerationMeta\.extra must hold JSON values only"):
        hfx.GenerationMeta(extra={"mean": torch.zeros(2)})
    with pytest.raises(TypeError, match="'meta' must be <class 'hfx._records.GenerationMeta'>"):
        hfx.Components(items={}, meta={"generation_config": {}})
    written = hfx.GenerationMeta().to_json()
    written["generation"]["is_encoder_decoder"] = "no"
    with pytest.raises(ValueError, match=r"GenerationMeta\.from_json: 'is_encoder_decoder' must be"):
        hfx.GenerationMeta.from_json(written)
    with pytest.raises(ValueError, match=r"GenerationMeta\.from_json: .*'cache_input' must be"):
        hfx.GenerationMeta.from_json({"cache_input": 3})  # schema 1
    with pytest.raises(ValueError, match="takes a dict, got list"):
        hfx.GenerationMeta.from_json([])


class _Counter(torch.nn.Module):
    """Writes into its buffer on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * self.calls


def test_an_exported_program_runs_its_graph_on_the_flat_inputs_unless_it_returns_writes():
    linear = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
    assert linear._graph is not None  # noqa: SLF001 - weights and flat inputs straight into the graph module
    with torch.no_grad():
        want = linear.program.module()(input=torch.ones(5, 3))
    assert torch.equal(linear(input=torch.ones(5, 3)), want)
    # Decomposed, the write to the buffer becomes an output that the unlifted module copies back.
    counter = hfx.export(hfx.capture({"x": torch.ones(2)}, _Counter()))
    functional = attrs.evolve(counter, program=counter.program.run_decompositions())
    assert functional._graph is None  # noqa: SLF001
    assert [float(functional(x=torch.ones(2))[0]) for _ in range(2)] == [1.0, 2.0]
