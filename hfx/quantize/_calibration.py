"""Calibration data for the quantization stages: per-component inputs and the graph's flat feeds.

A calibration set is a list of input dicts for the model. A decomposed model
needs one per component: ``calibration_inputs`` runs the model's real
``generate()`` on each sample with the hooks ``decompose`` records with, so
that each component is calibrated on the calls it really serves (the prompt
for ``prefill``, every later step for ``decode``). A stage turns each input
dict into the graph's flat inputs with the program's own ``flat_inputs``, so a
static quantizer sees exactly the tensors the graph takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from toolz import curry

from hfx._errors import InputError, argument_error
from hfx._records import Capture, Components, GenerationSettings, IoSpec

Calibration = Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]]


@curry
def calibration_inputs(
    model: torch.nn.Module, samples: Sequence[Mapping[str, Any]], components: Components, /, *, max_new_tokens: int = 4
) -> dict[str, list[dict[str, Any]]]:
    """Per-component calibration inputs, recorded from ``model.generate`` on each sample.

    Each sample (generate inputs: ``input_ids``, ``attention_mask``, pixel or
    audio features ...) runs ``generate`` for ``max_new_tokens`` greedy tokens
    under ``decompose``'s recording hooks; the model is left as it was. The
    first forward call calibrates ``prefill``, every later one ``decode`` (a
    decode graph that also prefills, ``multi_token_decode``, gets the prompt
    too, over an empty cache);
    encoders and multimodal parts get their own recorded calls (a language
    model that takes the steps, and its embedding and head, get every step's). A model that
    does not generate (one component, ``"model"``) is calibrated on the samples.

    Args:
        model: the model ``components`` were decomposed from.
        samples: generate inputs, one dict per sample.
        components: what ``decompose`` returned (``Capture``, ``Exported`` or programs).
        max_new_tokens: decode steps recorded per sample.

    Returns:
        ``{component name: [input dict, ...]}``, ready for a stage's ``calibration``.
        ``calibration_inputs(model, samples)`` alone is a stage ``components -> dict``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``samples`` not a list of mappings or
            ``components`` not ``Components`` (the arguments in the wrong order).
        InputError: a component got no calibration input (the samples' generate did not call it).

    Example:
        >>> import hfx
        >>> from hfx import zoo
        >>> model = zoo.build("llama")
        >>> parts = hfx.decompose(hfx.capture(zoo.inputs("llama"), model), multi_token_decode=False)
        >>> data = calibration_inputs(model, [zoo.inputs("llama", batch=1, sequence=6)], parts, max_new_tokens=3)
        >>> {name: len(calls) for name, calls in data.items()}
        {'prefill': 1, 'decode': 2}
    """
    samples = _checked_samples(model, samples, components)
    if list(components) == ["model"]:
        return {"model": [dict(sample) for sample in samples]}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in components}
    for sample in samples:
        for name, calls in _recorded_calls(model, sample, max_new_tokens, components.meta.generation, list(components)).items():
            if name in found:
                found[name].extend(calls)
    missing = [name for name, calls in found.items() if not calls]
    if missing:
        msg = (
            f"calibration_inputs: generate() on the samples never called component(s) {missing} of "
            f"{type(model).__name__}. Give samples with the inputs those components need (images, audio)."
        )
        raise InputError(msg)
    return found


def _checked_samples(model: Any, samples: Any, components: Any) -> list[Mapping[str, Any]]:
    """``samples`` as a list; ``TypeError`` naming the argument that is not what ``calibration_inputs`` takes."""
    call = "calibration_inputs(model, samples, components)"
    if not isinstance(components, Components):
        raise argument_error(call, "components (the last argument)", "the Components of decompose", components)
    if not isinstance(model, torch.nn.Module):
        raise argument_error(call, "model", "a torch.nn.Module", model)
    listed = list(samples) if isinstance(samples, Iterable) and not isinstance(samples, Mapping) else None
    if listed is None or not all(isinstance(sample, Mapping) for sample in listed):
        raise argument_error(call, "samples", "a list of generate-input dicts", samples)
    return listed


def _recorded_calls(
    model: torch.nn.Module, sample: Mapping[str, Any], steps: int, generation: GenerationSettings,
    names: Iterable[str],
) -> dict[str, list[dict[str, Any]]]:
    """The inputs each component of ``names`` got while ``generate`` ran on ``sample`` (``decompose``'s recording)."""
    from hfx._capture.decompose import encoder_capture, part_capture, prompt_component, step_component
    from hfx._capture.recording import recorded_generate, with_padding_mask

    inputs = with_padding_mask(Capture(module=model, source=model, kwargs=sample))  # graphs were traced with a mask input
    recorded = recorded_generate(model, inputs, steps, _generation_config(model, generation))
    calls = recorded.calls
    per_component = {"prefill": calls[:1], "decode": calls[1:]}
    if prompt_component(names) == "decode":  # one graph for prompt and steps: the prompt too
        per_component["decode"] = _prompt_and_steps(calls)
    per_component.update({name: [encoder_capture(name, m, kw, packed=False).kwargs] for name, (m, kw) in recorded.encoders.items()})
    every_step = step_component(names) == "language_model"  # the split prefill's parts take every step too
    for name, (module, first) in recorded.parts.items():
        found = recorded.part_calls.get(name, [first]) if every_step else [first]
        per_component[name] = [part_capture(name, module, kwargs).kwargs for kwargs in found]
    if every_step:
        per_component["language_model"] = _prompt_and_steps(recorded.part_calls["language_model"])
    return {name: [dict(call) for call in found] for name, found in per_component.items()}


def _prompt_and_steps(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded calls as one graph for prompt and steps takes them, each multi-token: the prompt over an empty
    cache (when the cache is all full-attention layers), then every step."""
    from hfx._capture.decompose import as_multi_token_call, full_attention_cache

    prompt = [_over_an_empty_cache(calls[0], calls[1])] if len(calls) > 1 and full_attention_cache(calls) else []
    return [as_multi_token_call(call) for call in (*prompt, *calls[1:])]


def _over_an_empty_cache(prompt: Mapping[str, Any], step: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt call as a decode graph that prefills takes it: the step's full-attention cache cut to a past of 0.

    ``generate`` hands the prompt call a cache whose layers are not yet
    initialised; the graph takes initialised layers of past length 0.
    """
    import copy

    from hfx._pytree import is_cache

    name = next(key for key, value in step.items() if is_cache(value))
    empty = copy.deepcopy(step[name])
    for layer in empty.layers:
        layer.keys, layer.values = layer.keys[:, :, :0], layer.values[:, :, :0]
    return {**prompt, name: empty}


def _generation_config(model: torch.nn.Module, generation: GenerationSettings) -> Any:
    """The generation config ``decompose`` ran with (a static cache changes the decode graph's inputs); ``None`` for the model's own."""
    import json

    settings = dict(generation.config)
    if not settings or settings == json.loads(model.generation_config.to_json_string(use_diff=False)):
        return None
    from transformers import GenerationConfig

    return GenerationConfig.from_dict(settings)


def samples_for(calibration: Calibration | None, name: str, *, stage: str) -> list[Mapping[str, Any]] | None:
    """The calibration samples of component ``name``: the list itself, or its entry in a per-component mapping.

    Raises:
        ValueError: a mapping without ``name``, or an empty calibration set.
        TypeError: ``calibration`` is neither a list of dicts nor a mapping of them.
    """
    if calibration is None:
        return None
    if isinstance(calibration, Mapping) and not _is_sample(calibration):
        if name not in calibration:
            msg = (
                f"{stage}: calibration has no inputs for component {name!r} (it has {sorted(calibration)}). "
                "Build them with hfx.calibration_inputs(model, samples, components)."
            )
            raise ValueError(msg)
        calibration = calibration[name]
    if isinstance(calibration, Mapping) or not all(isinstance(s, Mapping) for s in calibration):
        msg = f"{stage}: calibration must be a list of input dicts (or {{component: list}}), got {type(calibration).__name__}"
        raise TypeError(msg)
    if not calibration:
        msg = f"{stage}: calibration for component {name!r} is empty; give at least one input dict"
        raise ValueError(msg)
    return list(calibration)


def _is_sample(mapping: Mapping[str, Any]) -> bool:
    """Whether ``mapping`` is one input dict (tensor values) rather than ``{component: [input dicts]}``."""
    return not all(isinstance(v, Sequence) and not isinstance(v, (str, torch.Tensor)) for v in mapping.values())


def graph_feeds(io: IoSpec, samples: Sequence[Mapping[str, Any]], *, program: str) -> list[list[torch.Tensor]]:
    """Each sample as the graph's flat inputs, checked by ``hfx._contract.flat_inputs`` (names, dtypes, dims, bounds)."""
    from hfx._contract import flat_inputs
    from hfx._kept_positions import KEPT_INPUT
    from hfx._pytree import spec_caches

    # a graph that keeps every position has logits_to_keep as a constant: the recorded step's positions are not its
    baked = KEPT_INPUT in io.constants
    with spec_caches(io):
        return [flat_inputs(io, {k: v for k, v in sample.items() if not (baked and k == KEPT_INPUT)}, program=program)
                for sample in samples]


def named_feeds(io: IoSpec, samples: Sequence[Mapping[str, Any]], *, program: str) -> list[dict[str, Any]]:
    """Each sample as ``{graph input name: numpy array}``, what ONNX Runtime and OpenVINO calibrate on."""
    return [
        {name: tensor.numpy() for name, tensor in zip(io.input_names, flat)}
        for flat in graph_feeds(io, samples, program=program)
    ]
