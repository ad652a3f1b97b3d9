"""The parts of a multimodal model's prefill: encoders, projectors, embedding, language model, lm_head.

``generate()`` of a vision- or audio-language model runs, for the prompt,
``get_<modality>_features`` (an encoder, feature selection, a projector), embeds
the prompt's tokens, writes the projected features over the placeholder
tokens, runs the language model and its head. ``decompose`` records each of
those calls and exports each part alone, so a runtime can run the encoders
once per image and keep the language model apart; this module finds the parts
and makes modules of the two that are not modules of the model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

_MODALITIES = ("image", "video", "audio")
# Children of a multimodal base model that map encoder features into the language model's embedding space.
_PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector", "connector", "embed_vision", "embed_audio",
                    "audio_projector", "projector", "vision_projection")
# Config attributes holding the placeholder token each modality's features replace.
_TOKEN_ATTRIBUTES = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}


def _modalities(module: torch.nn.Module) -> tuple[str, ...]:
    """``module.input_modalities`` as a tuple (transformers gives a string for one modality)."""
    declared = getattr(module, "input_modalities", ()) or ()
    return (declared,) if isinstance(declared, str) else tuple(declared)


def feature_methods(model: torch.nn.Module) -> dict[str, str]:
    """``{modality: method name}`` for the ``get_<modality>_features`` that generate runs before forward.

    A head declares its own modalities or its base model's: Qwen3.5's sequence classifier says ``"text"``
    and passes images on to its base model, which declares images and videos.
    """
    base = getattr(model, "base_model", model)
    modalities = {*_modalities(model), *_modalities(base)}
    return {m: f"get_{m}_features" for m in _MODALITIES if m in modalities and hasattr(base, f"get_{m}_features")}


def projectors(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The base model's projector children by attribute name (``multi_modal_projector`` ...)."""
    base = getattr(model, "base_model", model)
    children = dict(base.named_children())
    return {name: children[name] for name in _PROJECTOR_NAMES if isinstance(children.get(name), torch.nn.Module)}


def placeholder_tokens(model: torch.nn.Module, modalities: tuple[str, ...]) -> dict[str, int]:
    """``{modality: token id}`` of the placeholder tokens the features replace, from the model's config."""
    found = {}
    for modality in modalities:
        for attribute in _TOKEN_ATTRIBUTES[modality]:
            value = getattr(model.config, attribute, None)
            if isinstance(value, int):
                found[modality] = value
                break
    return found


def features_only(output: Any) -> Any:
    """An encoder output without its per-layer ``hidden_states`` and ``attentions``, one tensor per field.

    LLaVA-family ``get_image_features`` return a Python list with one tensor
    per image, which fixes the number of images in the graph; the language
    model concatenates that list along axis 0 first, so a one-element list
    holding the concatenation is the same input for any number of images.
    """
    if not isinstance(output, Mapping):
        return output
    kept = {k: v for k, v in output.items() if k not in ("hidden_states", "attentions")}
    for key, value in kept.items():
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            kept[key] = [torch.cat(list(value), dim=0)]
    return type(output)(**kept)


def feature_rows(features: Any) -> torch.Tensor:
    """Encoded features as one row per placeholder token: ``[tokens, hidden]`` (``pooler_output``, else
    ``last_hidden_state``; a list of per-image tensors joined)."""
    if not isinstance(features, torch.Tensor):
        pooled = features.get("pooler_output")
        features = pooled if pooled is not None else features["last_hidden_state"]
    if isinstance(features, (list, tuple)):
        features = torch.cat(list(features), dim=0)
    return features.reshape(-1, features.shape[-1])


def same_features(method_output: Any, tower_output: Any) -> bool:
    """Whether a tower's output holds the features its model's feature method returns, row for row.

    Qwen2-VL's ``get_image_features`` only splits its tower's merged output per image; DeepSeek-VL's runs
    an aligner over it (a module of no projector name), so its tower alone is not the encoder.
    """
    try:
        method_rows, tower_rows = feature_rows(method_output), feature_rows(tower_output)
    except (KeyError, TypeError, AttributeError):
        return False
    return method_rows.shape == tower_rows.shape and torch.equal(method_rows, tower_rows)


class ProjectorCall(Exception):  # noqa: N818 - control flow, not an error
    """Carries a projector's arguments out of the feature method, which then stops (see ``tapped_view``)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("projector input")
        self.args = args
        self.kwargs = kwargs

    @property
    def features(self) -> torch.Tensor:
        """The projector's first input: the selected features."""
        return self.args[0] if self.args else next(iter(self.kwargs.values()))


def _tap(*args: Any, **kwargs: Any) -> Any:
    """Stands in for a projector: stops the feature method and hands the projector's inputs to the caller.

    Stopping there keeps what the method does after the projector (LLaVA's
    ``list(image_features)``, which fixes the number of images) out of the
    graph. It is a plain function, not a module, so that the export's module
    stack never sees a call that does not return.
    """
    raise ProjectorCall(args, kwargs)


def tapped_view(owner: torch.nn.Module, projector: str) -> torch.nn.Module:
    """A shallow view of ``owner`` (same children, so shared weights) whose ``projector`` raises ``ProjectorCall``."""
    view = copy.copy(owner)  # a shallow view with its own child table
    view._modules = dict(owner._modules)  # noqa: SLF001
    del view._modules[projector]  # noqa: SLF001
    vars(view)[projector] = _tap
    return view


def is_tapped_view(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a ``tapped_view``: one of its children stands replaced by the projector's tap."""
    return any(value is _tap for value in vars(module).values())


class FeatureEncoder(torch.nn.Module):
    """A model's ``get_<modality>_features`` as a module, so it exports as a component.

    It holds a view of the model's base model (the same child modules, so the
    weights are shared and the user's model is not changed). With
    ``projector`` named, the view's projector is a tap: the encoder returns
    the selected features the projector would read (a tensor), and the
    projector is a component of its own. Without it, it returns the method's
    output without the per-layer ``hidden_states`` and ``attentions`` (see
    ``features_only``).
    """

    def __init__(self, owner: torch.nn.Module, method: str, projector: str | None = None) -> None:
        super().__init__()
        if projector is not None:
            view = tapped_view(owner, projector)
        else:
            view = copy.copy(owner)
            view._modules = dict(owner._modules)  # noqa: SLF001
        self.owner = view
        self.method = method
        self.projector = projector

    def forward(self, **kwargs: Any) -> Any:
        """Call the feature method with ``kwargs``."""
        try:
            output = getattr(self.owner, self.method)(**kwargs)
        except ProjectorCall as stop:
            return stop.features
        return features_only(output)


def modality_tower(model: torch.nn.Module, modality: str) -> torch.nn.Module | None:
    """The modality's encoder module (``get_encoder(modality=…)``), or ``None`` when the model names none."""
    get = getattr(model, "get_encoder", None)
    try:
        tower = get(modality=modality) if callable(get) else None
    except (TypeError, ValueError):
        return None
    return tower if isinstance(tower, torch.nn.Module) and tower is not model and tower is not getattr(model, "base_model", None) else None
