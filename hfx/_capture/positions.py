"""Position ids for each generate step, as transformers' ``generate()`` computes them.

Text models count the unpadded tokens (``mask.cumsum - 1``). Models with
multimodal rotary positions (Qwen2-VL's M-RoPE: ``[sections, batch, sequence]``)
give an image's tokens temporal / height / width positions, which the model's
own ``get_rope_index`` computes in Python from the image grids; that method
reads only the model's config, so it runs on a weightless copy of the model
built on the ``meta`` device from the config ``decompose`` saved.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hfx._records import ModelSpec


def text_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from a 2D mask, as generate computes them (left padding starts at 0)."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 0)


def model_class(class_name: str) -> type:
    """The transformers model class a saved manifest names; only a ``PreTrainedModel`` subclass is taken.

    Raises:
        ValueError: ``class_name`` is not a transformers model class.
    """
    import transformers

    cls = getattr(transformers, class_name, None) if class_name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        msg = (f"the manifest's model class {class_name!r} is not a transformers model class; hfx builds only "
               "those from a saved export. Export the model again with hfx.")
        raise ValueError(msg)
    return cls


@functools.lru_cache(maxsize=4)
def _weightless(class_name: str, config_json: str) -> torch.nn.Module:
    """The model class built from its config on the ``meta`` device: its methods, no weights."""
    cls = model_class(class_name)
    config = cls.config_class.from_dict(json.loads(config_json))
    with torch.device("meta"):
        return cls(config)


def prompt_positions(model: ModelSpec, sections: int, inputs: Mapping[str, Any], mask: torch.Tensor) -> torch.Tensor:
    """The prompt's M-RoPE position ids, ``[sections, batch, sequence]`` (text row first when ``sections`` is 4).

    ``model``: the class and config ``decompose`` saved. Without image or video
    grids every section holds the text positions, as in transformers.
    """
    text = text_positions(mask)
    if has_media_grids(inputs):
        rope = multimodal_positions(_weightless(model.class_name, json.dumps(dict(model.config), sort_keys=True)),
                                    {**inputs, "attention_mask": mask})
    else:
        rope = text[None].expand(3, -1, -1)
    return torch.cat([text[None], rope], dim=0) if sections == 4 else rope


def has_media_grids(inputs: Mapping[str, Any]) -> bool:
    """Whether ``inputs`` hold image or video grids and the token types that place them (what M-RoPE reads)."""
    grids = [inputs.get(k) for k in ("image_grid_thw", "video_grid_thw")]
    return any(grid is not None for grid in grids) and inputs.get("mm_token_type_ids") is not None


def multimodal_positions(model: torch.nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
    """The M-RoPE position ids ``[3, batch, sequence]`` the model's own ``get_rope_index`` gives for ``inputs``.

    ``inputs`` are the processor's: ``input_ids``, ``mm_token_type_ids``, the
    image / video grids and optionally ``attention_mask``. The method reads
    only the model's config, so ``model`` may be a weightless (``meta``) copy.
    """
    base = getattr(model, "model", model)
    grids = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw") if inputs.get(k) is not None}
    rope, _ = base.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                  attention_mask=inputs.get("attention_mask"), **grids)
    return rope


def next_positions(previous: torch.Tensor, count: int = 1) -> torch.Tensor:
    """The positions of the next ``count`` tokens: one past the previous step's last, on every section.

    Example:
        >>> next_positions(torch.tensor([[[0, 1, 2]], [[0, 1, 1]]])).tolist()
        [[[3]], [[2]]]
    """
    last = previous[..., -1:]
    return last + torch.arange(1, count + 1, dtype=previous.dtype)
