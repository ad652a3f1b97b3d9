"""The recording of one ``generate()`` run: the exact inputs of every call ``decompose`` and calibration split off.

``recorded_generate`` runs the model's own ``generate()`` with forward hooks
(and reversible instance patches on the feature methods) and returns each
encoder, projector, prefill part and forward call with deep copies of its
keyword arguments, normalised to what the exported graphs take.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch

from hfx._capture.multimodal import (
    FeatureEncoder,
    feature_methods,
    features_only,
    modality_tower,
    projectors,
    same_features,
)
from hfx._capture.vision_inputs import recording_vision_inputs
from hfx._records import Capture, EncoderInputs
from hfx.patches import patch_attention_implementation, patch_sliding_window_cache, preserve_module_state, swap_attr
from hfx._serial import one_at_a_time


@contextlib.contextmanager
def _recording(module: torch.nn.Module, calls: list[Any], running: list[str] | None = None) -> Iterator[None]:
    """Record a deep copy of the keyword arguments of every call of ``module`` inside the block.

    With ``running`` (see ``_recording_method``), each record is ``(label of the
    feature method running the call, or None, kwargs)``.
    """

    def hook(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bound = dict(kwargs)
        if args:
            names = list(inspect.signature(mod.forward).parameters)
            bound.update(zip(names, args))
        copied = copy.deepcopy(bound)
        calls.append(copied if running is None else (running[-1] if running else None, copied))

    with module.register_forward_pre_hook(hook, with_kwargs=True):  # a handle removes its hook on exit
        yield


@contextlib.contextmanager
def _first_output(module: torch.nn.Module, outputs: list[Any]) -> Iterator[None]:
    """Keep the output of ``module``'s first call inside the block (a shallow copy: a feature method may set
    its fields afterwards, as DeepSeek-VL's sets ``pooler_output``)."""

    def hook(mod: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not outputs:
            outputs.append(copy.copy(output))

    with module.register_forward_hook(hook):
        yield



def _encoder(model: torch.nn.Module) -> torch.nn.Module | None:
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    get = getattr(model, "get_encoder", None)
    return get() if callable(get) else None



@contextlib.contextmanager
def _recording_method(owner: torch.nn.Module, name: str, calls: list[dict[str, Any]], running: list[str],
                      label: str, outputs: list[Any]) -> Iterator[None]:
    """Record the keyword arguments of ``owner.name(...)`` calls, and the first call's output, inside the block
    (a reversible instance patch).

    While a call runs, ``running[-1]`` is ``label``: the modules it calls know which feature method called them.
    """
    method = getattr(owner, name)
    signature = inspect.signature(method)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        kwargs = {**dict(zip(signature.parameters, args)), **kwargs}
        calls.append(copy.deepcopy(kwargs))
        running.append(label)
        try:
            output = method(**kwargs)
        finally:
            running.pop()
        if not outputs:
            outputs.append(output)
        return output

    recorded.__signature__ = signature  # type: ignore[attr-defined]  # generate picks its kwargs by signature
    with swap_attr(owner, name, recorded):
        yield



@attrs.frozen(kw_only=True, eq=False)
class Recorded:
    """What one ``generate`` run called: encoders and prefill parts (module, kwargs), and the forward calls as the graphs take them.

    ``part_calls``: every call of each prefill part (the prompt's, then one per
    step), empty when the prefill stays whole.
    """

    encoders: dict[str, tuple[torch.nn.Module, dict[str, Any]]]
    parts: dict[str, tuple[torch.nn.Module, dict[str, Any]]]
    projectors: dict[str, str]
    encoder_inputs: dict[str, EncoderInputs]
    calls: list[dict[str, Any]]
    length: int
    part_calls: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    generating: torch.nn.Module | None = None  # whose forward ``calls`` are, when not the model's (BLIP-2's language model)



def _prefill_parts(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules a multimodal prefill runs after the encoders: embedding, language model, lm_head."""
    found = {
        "embed_tokens": model.get_input_embeddings(),
        "language_model": model.get_decoder(),
        "lm_head": model.get_output_embeddings(),
    }
    if isinstance(found["language_model"], torch.nn.Module) and any(
            m is found["lm_head"] for m in found["language_model"].modules()):
        del found["lm_head"]  # the decoder is a whole causal LM (BLIP-2's language model): its logits are the prompt's
    return {name: module for name, module in found.items() if isinstance(module, torch.nn.Module) and module is not model}



@one_at_a_time
def recorded_generate(model: torch.nn.Module, inputs: Mapping[str, Any], steps: int, generation_config: Any) -> Recorded:
    """Run ``generate`` for ``steps`` new tokens and record every encoder, projector, part and forward call."""
    calls: list[dict[str, Any]] = []
    encoder_calls: dict[str, list[dict[str, Any]]] = {}
    encoder = _encoder(model)
    base = getattr(model, "base_model", model)
    methods = feature_methods(model)
    projector_modules = projectors(model) if methods else {}
    parts = _prefill_parts(model) if methods else {}
    part_calls: dict[str, list[Any]] = {name: [] for name in [*projector_modules, *parts]}
    towers = {m: tower for m in methods if (tower := modality_tower(model, m)) is not None}
    tower_calls: dict[str, list[Any]] = {m: [] for m in towers}
    tower_outputs: dict[str, list[Any]] = {m: [] for m in towers}
    method_outputs: dict[str, list[Any]] = {}
    vision_inputs: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in towers}
    running: list[str] = []
    options = {"max_new_tokens": steps, "min_new_tokens": steps, "do_sample": False}
    if generation_config is not None:
        options["generation_config"] = generation_config
    with contextlib.ExitStack() as stack:
        stack.enter_context(preserve_module_state(model))
        stack.enter_context(patch_attention_implementation(model))  # flash attention needs a GPU and its kernels
        stack.enter_context(patch_sliding_window_cache())  # record the calls the exported graphs take
        stack.enter_context(_recording(model, calls))
        if encoder is not None:
            stack.enter_context(_recording(encoder, encoder_calls.setdefault("encoder", [])))
        for modality, method in methods.items():
            found = encoder_calls.setdefault(f"{modality}_encoder", [])
            stack.enter_context(_recording_method(base, method, found, running, modality,
                                                  method_outputs.setdefault(modality, [])))
        for name, module in projector_modules.items():
            stack.enter_context(_recording(module, part_calls[name], running))
        for name, module in parts.items():
            stack.enter_context(_recording(module, part_calls[name]))
        for modality, tower in towers.items():
            stack.enter_context(_recording(tower, tower_calls[modality], running))
            stack.enter_context(_first_output(tower, tower_outputs[modality]))
            stack.enter_context(recording_vision_inputs(tower, vision_inputs[modality]))
        child = _generating_child(model)
        child_calls: list[dict[str, Any]] = []
        if child is not None:
            stack.enter_context(_recording(child, child_calls))
        with torch.no_grad():
            output = model.generate(**copy.deepcopy(dict(inputs)), **options)
            if not calls and child_calls:  # its generate ran the child's: the steps are the child's forwards
                calls, generating = child_calls, child
                _call_unrun_feature_methods(base, methods, inputs, encoder_calls, method_outputs, running)
            else:
                generating = model
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    # The projector each feature method ran: {modality: attribute name}.
    # A prefill that stays whole reads the feature methods' own outputs: then no projector is split off either.
    split = _takes_prompt_mask(part_calls.get("language_model", []))
    ran = {label: name for name in projector_modules for label, _ in part_calls[name][:1] if label}
    used = {label: name for label, name in ran.items() if _one_tensor_input(part_calls[name][0][1])} if split else {}
    encoders = {"encoder": (encoder, encoder_calls["encoder"][0])} if encoder_calls.get("encoder") else {}
    encoder_inputs: dict[str, EncoderInputs] = {}
    for modality, method in methods.items():
        found = encoder_calls[f"{modality}_encoder"]
        own = [kwargs for label, kwargs in tower_calls.get(modality, []) if label == modality]
        if not found:
            continue
        computed = {name: entry["options"] for name, entry in vision_inputs.get(modality, {}).items()}
        # no projector, and the tower's output is the features (Qwen2-VL's merger)
        if modality not in ran and own and same_features(method_outputs[modality][0], tower_outputs[modality][0]):
            values = {k: v for entry in vision_inputs[modality].values() for k, v in entry["values"].items()}
            encoders[f"{modality}_encoder"] = (towers[modality], {**own[0], **values})
            encoder_inputs[f"{modality}_encoder"] = EncoderInputs(names=_renamed(own[0], found[0]), computed=computed)
        else:
            precomputed = _precomputed(vision_inputs.get(modality), base, method, modality)
            encoders[f"{modality}_encoder"] = (FeatureEncoder(base, method, used.get(modality)), {**found[0], **precomputed})
            if precomputed:  # the tower's getters' values go in too, computed by generate for new images
                names = {k: k for k, v in found[0].items() if isinstance(v, torch.Tensor)}
                encoder_inputs[f"{modality}_encoder"] = EncoderInputs(names=names, computed=computed)
    recorded_parts = {
        f"{modality}_projector" if len(used) > 1 else "projector": (projector_modules[name], part_calls[name][0][1])
        for modality, name in used.items()
    }
    every_call: dict[str, list[dict[str, Any]]] = {}
    if any(part_calls[name] for name in parts) and encoders and split:
        recorded_parts.update({name: (module, part_calls[name][0]) for name, module in parts.items() if part_calls[name]})
        every_call = {name: part_calls[name] for name in parts if part_calls[name]}
    projector_of = {modality: f"{modality}_projector" if len(used) > 1 else "projector" for modality in used}
    calls = [_with_step_token_types(_with_features_only(_with_2d_mask(call, inputs, index)))
             for index, call in enumerate(calls)]
    return Recorded(encoders=encoders, parts=recorded_parts, projectors=projector_of, encoder_inputs=encoder_inputs,
                     calls=calls, length=int(sequences.shape[-1]), part_calls=every_call,
                     generating=generating if generating is not model else None)



def _precomputed(recorded: Mapping[str, Mapping[str, Any]] | None, base: torch.nn.Module, method: str,
                 modality: str) -> dict[str, torch.Tensor]:
    """What a packed-image tower's getters computed, as the ``<modality>_``-prefixed keywords its feature method passes
    on to it (``accepts_precomputed_kwargs``); empty when it ran none or the method takes none.

    Model pattern: a Qwen2.5-VL-style tower followed by a projector of the model's own (HyperCLOVA X Vision v2):
    its feature method is the image encoder, and the tower's window index, positions and boundaries, computed
    in Python from the grids, would fix the image count and size in its graph.
    """
    from hfx._capture.vision_inputs import takes_precomputed

    values = {k: v for entry in (recorded or {}).values() for k, v in entry["values"].items()}
    if not values or not takes_precomputed(vars(type(base)).get(method)):
        return {}
    return {f"{modality}_{k}": v for k, v in values.items()}


def _generating_child(model: torch.nn.Module) -> torch.nn.Module | None:
    """The child whose ``generate`` the model's own ``generate`` hands its prompt to, if it has one
    (BLIP-2 and InstructBLIP: ``language_model.generate(inputs_embeds=...)`` after encoding the images)."""
    child = getattr(model, "language_model", None)
    overrides = any("generate" in vars(cls) for cls in type(model).__mro__
                    if cls.__module__.startswith("transformers.models."))
    if isinstance(child, torch.nn.Module) and child is not model and overrides and callable(getattr(child, "generate", None)):
        return child
    return None


def _call_unrun_feature_methods(base: torch.nn.Module, methods: Mapping[str, str], inputs: Mapping[str, Any],
                                encoder_calls: dict[str, list[dict[str, Any]]], method_outputs: dict[str, list[Any]],
                                running: list[str]) -> None:
    """Call each feature method ``generate`` did not (it encoded the images inline) on the generate inputs it takes,
    recording the call and its output as if ``generate`` had made it."""
    for modality, method in methods.items():
        found = encoder_calls[f"{modality}_encoder"]
        if found:
            continue
        takes = inspect.signature(getattr(base, method)).parameters
        kwargs = {k: v for k, v in inputs.items() if k in takes}
        if kwargs:
            getattr(base, method)(**copy.deepcopy(kwargs))  # recorded by the method's own patch


def _one_tensor_input(kwargs: Mapping[str, Any]) -> bool:
    """Whether a projector call takes the features alone: one that also takes what its feature method computed
    (Idefics2's connector, the patches' attention mask) stays in the feature encoder, which has its inputs."""
    return sum(isinstance(value, torch.Tensor) for value in kwargs.values()) == 1


def _takes_prompt_mask(calls: list[dict[str, Any]]) -> bool:
    """Whether the language model was called with the 2D padding mask (or none), which ``generate`` can give it.

    PaliGemma builds a 4D mask (bidirectional over the image prefix) and Gemma 3
    a mask per layer type before calling its language model; recorded so, the
    graph would take a mask only the model's forward can build. Such a prefill
    stays whole (it reads the encoded features as ``mm_encoder_outputs``).
    """
    mask = calls[0].get("attention_mask") if calls else None
    return mask is None or (isinstance(mask, torch.Tensor) and mask.ndim == 2)



def _renamed(tower_kwargs: Mapping[str, Any], method_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """``{tower input: generate input}`` for the tower's tensors that are a generate input under another name."""
    names = {}
    for key, value in tower_kwargs.items():
        if not isinstance(value, torch.Tensor):
            continue
        for source, given in method_kwargs.items():
            if isinstance(given, torch.Tensor) and given.shape == value.shape and torch.equal(given.to(value.dtype), value):
                names[key] = source
                break
    return names



def with_padding_mask(capture: Capture) -> dict[str, Any]:
    """The generate inputs, with a mask that pads the first position of the first row.

    ``generate()`` drops an all-ones ``attention_mask``, and a graph traced
    without one cannot serve a left-padded batch. Only shapes matter to the
    trace, so one padded position makes every graph take a mask input.
    """
    inputs = dict(capture.kwargs)
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[-1] < 2:
        return inputs
    mask = inputs.get("attention_mask")
    if mask is None or bool(mask.all()):
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        inputs["attention_mask"] = mask
    return inputs



def _with_step_token_types(call: dict[str, Any]) -> dict[str, Any]:
    """The call with ``mm_token_type_ids`` cut to the step's own tokens, as transformers 5.23 and newer pass it.

    transformers 5.22's ``prepare_inputs_for_generation`` slices ``token_type_ids``
    to the new tokens but passes ``mm_token_type_ids`` whole (the prompt's and every
    generated token's), so a decode step would take a growing axis the loop does not
    build. Decode reads no token types once the M-RoPE deltas are cached, so the
    step's slice gives the same numbers. Present only when the lengths differ.
    """
    types, ids = call.get("mm_token_type_ids"), call.get("input_ids")
    if not (isinstance(types, torch.Tensor) and isinstance(ids, torch.Tensor) and types.shape[-1] > ids.shape[-1]):
        return call
    return {**call, "mm_token_type_ids": types[..., -ids.shape[-1]:]}


def _with_features_only(call: dict[str, Any]) -> dict[str, Any]:
    """The call with its pre-encoded ``mm_encoder_outputs`` as the encoder components return them."""
    encoded = call.get("mm_encoder_outputs")
    if not isinstance(encoded, Mapping):
        return call
    return {**call, "mm_encoder_outputs": {k: features_only(v) for k, v in encoded.items()}}



def _with_2d_mask(call: dict[str, Any], inputs: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The call with the 2D padding mask in place of the 4D mask generate builds for static caches.

    ``forward`` builds the same 4D mask from a 2D one (and the cache), so the
    graph takes the mask every runtime's generate loop can grow by one column.
    """
    mask = call.get("attention_mask")
    prompt_mask = inputs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or not isinstance(prompt_mask, torch.Tensor):
        return call
    batch = prompt_mask.shape[0]
    grown = torch.ones(batch, index, dtype=prompt_mask.dtype)
    return {**call, "attention_mask": torch.cat([prompt_mask, grown], dim=-1)}

