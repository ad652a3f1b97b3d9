"""The generated zoo: the shrinker gives small valid configs, generated entries resolve and run, the sample rotates."""

from __future__ import annotations

import pytest
import torch

from hfx import _zoo_generated as generated
from hfx import zoo


def _build(config):
    import transformers

    return transformers.AutoModel.from_config(config).eval()


def test_a_decoder_shrinks_to_a_small_valid_config_and_the_input_is_unchanged():
    from transformers import LlamaConfig, MistralConfig

    llama = LlamaConfig()
    small = generated.shrink(llama)
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads) == (32, 2, 4)
    assert (small.head_dim, small.num_key_value_heads, small.vocab_size) == (8, 4, 256)  # heads kept as many as queries
    assert small.intermediate_size <= 64 and small.max_position_embeddings <= 512
    assert (llama.hidden_size, llama.num_hidden_layers, llama.vocab_size) == (4096, 32, 32000)  # pure
    mistral = generated.shrink(MistralConfig())
    assert (mistral.num_key_value_heads, mistral.sliding_window) == (2, 4)  # grouped-query attention stays grouped
    assert mistral.num_attention_heads % mistral.num_key_value_heads == 0


def test_special_tokens_move_below_the_new_vocabulary_keeping_which_are_equal():
    from transformers import GPT2Config

    small = generated.shrink(GPT2Config())
    assert small.bos_token_id == small.eos_token_id < small.vocab_size == 256
    assert small.bos_token_id >= generated.TEXT_HIGH  # above every prompt token


def test_per_layer_lists_follow_the_new_layer_count_and_keep_both_kinds():
    from transformers import Gemma3TextConfig

    small = generated.shrink(Gemma3TextConfig())
    assert small.num_hidden_layers == 2
    assert sorted(small.layer_types) == ["full_attention", "sliding_attention"]


def test_a_pyramid_config_shrinks_its_stage_lists_together_and_runs():
    from transformers import ConvNextConfig, SwinConfig

    original = ConvNextConfig()
    small = generated.shrink(original)
    assert len(small.hidden_sizes) == len(original.hidden_sizes) and len(small.depths) == len(original.depths)
    assert max(small.hidden_sizes) == 64 and all(w % 8 == 0 for w in small.hidden_sizes)
    assert list(small.hidden_sizes) == sorted(small.hidden_sizes) and set(small.depths) == {1}
    swin = generated.shrink(SwinConfig())
    assert len(swin.num_heads) == 4 and max(swin.num_heads) <= 2 and swin.window_size == 2
    for config in (small, swin):
        with torch.no_grad():
            out = _build(config)(pixel_values=torch.randn(2, 3, config.image_size, config.image_size))
        assert torch.isfinite(out[0]).all()


def test_a_composite_config_shrinks_its_sub_configs_and_runs():
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    small = generated.shrink(LlavaConfig())
    vision, text = small.vision_config, small.text_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.image_size, vision.patch_size) == (32, 2, 32, 8)
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (32, 2, 256)
    assert generated.TEXT_HIGH <= small.image_token_index < text.vocab_size
    assert -vision.num_hidden_layers <= small.vision_feature_layer < vision.num_hidden_layers
    model = LlavaForConditionalGeneration(small).eval()
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_overrides_replace_the_shrunk_values():
    from transformers import LlamaConfig

    assert generated.shrink(LlamaConfig(), overrides={"num_hidden_layers": 3}).num_hidden_layers == 3


# One type of a few tasks: each resolves through hfx.zoo like a hand-made entry and runs eagerly at both shapes.
ENTRIES = ("causal-lm:qwen2", "masked-lm:bert", "image-classification:convnext", "ctc:hubert", "seq2seq-lm:t5",
           "image-text-to-text:llava")


@pytest.mark.parametrize("name", ENTRIES)
def test_a_generated_entry_resolves_through_the_zoo_and_runs_eagerly(name):
    spec = zoo.entry(name)
    assert spec.name == name and spec.family == name.partition(":")[0]
    assert spec.generative == generated.task(spec.family).generative
    model = zoo.build(name)
    assert not model.training and sum(p.numel() for p in model.parameters()) < generated.MAX_PARAMETERS
    assert set(zoo.inputs(name)) <= set(zoo.forward_inputs(name))
    with torch.no_grad():
        for batch, sequence in generated.CENSUS_SHAPES:
            values = zoo.forward_inputs(name, batch=batch, sequence=sequence)
            assert all(v.shape[0] == batch for k, v in values.items() if k != "pixel_values" or v.dim() == 4)
            assert torch.isfinite(model(**values)[0]).all()


def test_a_seq2seq_forward_gets_decoder_tokens_and_an_image_prompt_as_many_placeholders_as_features():
    assert zoo.forward_inputs("seq2seq-lm:t5")["decoder_input_ids"].shape[0] == 2
    assert "decoder_input_ids" not in zoo.inputs("seq2seq-lm:t5")
    config = zoo.entry("image-text-to-text:llava").config()
    ids = zoo.inputs("image-text-to-text:llava", batch=1, sequence=5)["input_ids"]
    patches = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    assert int((ids == config.image_token_index).sum()) == patches


def test_a_tower_that_inherits_the_default_main_input_gets_only_what_its_forward_names():
    # Idefics3's vision transformer keeps PreTrainedModel's main_input_name "input_ids" but takes pixel_values;
    # its **kwargs swallow input_ids eagerly, and an export refuses an input the forward does not name.
    from hfx._zoo_generated._tasks import model_class

    assert model_class("feature-extraction:idefics3_vision").main_input_name == "input_ids"
    assert set(zoo.forward_inputs("feature-extraction:idefics3_vision")) == {"pixel_values"}


def test_a_randomly_masking_model_gets_its_draw_as_an_input_so_two_runs_agree():
    name = "feature-extraction:vit_mae"
    inputs = zoo.forward_inputs(name, batch=2)
    config = zoo.entry(name).config()
    assert inputs["noise"].shape == (2, (config.image_size // config.patch_size) ** 2)
    model = zoo.build(name)
    with torch.no_grad():
        assert torch.equal(model(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


def test_an_encoder_decoder_without_a_first_decoder_token_gets_the_pad_token_and_generates():
    config = generated.task_config("seq2seq-lm:longt5")  # its default names neither a start nor a BOS token
    assert config.decoder_start_token_id == config.pad_token_id == 0
    assert generated.task_config("seq2seq-lm:t5").decoder_start_token_id == 0  # one that has it keeps it
    model = zoo.build("seq2seq-lm:encoder-decoder")
    with torch.no_grad():
        assert model.generate(**zoo.inputs("seq2seq-lm:encoder-decoder"), max_new_tokens=2, do_sample=False).shape[1] >= 2


def test_an_encoder_decoder_without_a_start_token_starts_from_bos_as_generate_does():
    import hfx

    name = "seq2seq-lm:mbart"  # MBart's config leaves decoder_start_token_id unset; generate() starts from BOS
    model = zoo.build(name)
    assert model.generation_config.decoder_start_token_id is None and model.generation_config.bos_token_id is not None
    programs = hfx.export(hfx.decompose(hfx.capture(zoo.inputs(name), model)))
    assert programs.meta.generation.decoder_start_token_id == model.generation_config.bos_token_id
    inputs = zoo.inputs(name, batch=2, sequence=9)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert torch.equal(hfx.generate(inputs, programs, max_new_tokens=4), expected)


def test_a_zero_initialised_router_gets_random_weights_so_top_k_sees_no_ties():
    import transformers

    name = "causal-lm:afmoe"
    plain = transformers.AutoModelForCausalLM.from_config(zoo.entry(name).config())
    # Canary: AFMoE's own init zeroes its router, so every expert scores the same.
    assert not plain.model.layers[1].mlp.router.gate.weight.any()
    model = zoo.build(name)
    assert all(p.any() for p in model.parameters() if p.is_floating_point() and p.numel() > 1)
    scores = []
    model.model.layers[1].mlp.router.register_forward_hook(lambda module, args, out: scores.append(out[0]))
    with torch.no_grad():
        model(**zoo.inputs(name))
    top = scores[0].sigmoid().sort(dim=-1, descending=True).values
    k = model.config.num_experts_per_tok
    assert (top[:, k - 1] > top[:, k]).all()  # the chosen experts are the same on every runtime
    assert zoo.build(name).state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(zoo.build(name).parameters(), model.parameters()))  # seeded


def test_batch_norms_scaled_near_zero_by_the_init_get_unit_scale_so_top_k_sees_no_ties():
    import transformers

    name = "object-detection:rt_detr"
    plain = transformers.AutoModelForObjectDetection.from_config(zoo.entry(name).config())
    # Canary: RT-DETR's own init draws its BatchNorm scales from N(0, 0.01).
    assert plain.model.encoder_input_proj[0][1].weight.abs().max() < 0.1
    model = zoo.build(name)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all((m.weight - 1).abs().max() < 0.2 for m in norms)
    scores = []
    model.model.enc_score_head.register_forward_hook(lambda module, args, out: scores.append(out.max(-1).values))
    with torch.no_grad():
        model(**zoo.inputs(name, batch=3))
    assert all(len(set(row.tolist())) == row.numel() for row in scores[0])  # the encoder's top-k has no ties
    assert all(torch.equal(a, b) for a, b in zip(zoo.build(name).parameters(), model.parameters()))  # seeded


def test_unknown_generated_names_raise_key_error():
    with pytest.raises(KeyError, match="no task"):
        zoo.entry("no-such-task:llama")
    with pytest.raises(KeyError, match="no 'no_such_type'"):
        zoo.entry("causal-lm:no_such_type")
    with pytest.raises(KeyError, match="hfx.zoo has no"):
        zoo.entry("no_such_arch")


def test_every_task_reads_its_mapping_and_names_are_cell_safe():
    every = generated.names()
    assert len(every) > 1000
    assert {name.partition(":")[0] for name in every} == {t.name for t in generated.TASKS}
    assert not [name for name in every if "," in name]


def test_the_census_reports_a_failure_with_its_step_and_reason():
    assert generated.census("causal-lm:llama")["status"] == "ok"
    failed = generated.census("causal-lm:no_such_type")
    assert failed["status"] == "config" and failed["reason"].startswith("KeyError")


CENSUS = {f"{task.name}:{kind}": {"status": "ok"} for task in generated.TASKS for kind in ("a", "b", "c")}
CENSUS["ctc:d"] = {"status": "eager", "reason": "RuntimeError: no"}


def test_the_sample_is_one_runnable_type_per_task_and_the_same_for_a_seed():
    first = generated.sample(7, census_results=CENSUS)
    assert first == generated.sample(7, census_results=CENSUS)
    assert [name.partition(":")[0] for name in first] == [task.name for task in generated.TASKS]
    assert "ctc:d" not in {name for seed in range(10) for name in generated.sample(seed, census_results=CENSUS)}


def test_the_sample_rotates_through_every_runnable_type_of_a_task():
    seen = {generated.sample(seed, census_results=CENSUS)[0] for seed in range(3)}
    assert seen == {"causal-lm:a", "causal-lm:b", "causal-lm:c"}
    assert generated.sample(0, census_results=CENSUS) != generated.sample(1, census_results=CENSUS)


def test_the_stored_census_gives_a_sample_when_there_is_one():
    if not generated.CENSUS_PATH.exists():
        pytest.skip("no stored census (python benchmarks/coverage.py --census)")
    chosen = zoo.sample(0)
    assert chosen and len({name.partition(":")[0] for name in chosen}) == len(chosen)
