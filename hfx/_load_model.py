"""Load a model for export: a ``hfx.zoo`` name, a local ``save_pretrained`` directory, or a hub id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hfx import zoo


def load_model(name: str | None) -> tuple[torch.nn.Module, str]:
    """Return ``(model, zoo name or "")`` for ``name``; ``None`` is the built-in default model.

    Raises:
        OSError: the directory or hub id cannot be loaded (the message says why and what to do).
    """
    if name is None or name in zoo.ENTRIES:
        key = name or zoo.DEFAULT
        return zoo.build(key), key
    import transformers

    local = Path(name).is_dir()
    try:
        config = transformers.AutoConfig.from_pretrained(name)
    except OSError as exc:
        where = "a local directory" if local else "a hub id (this needs network access to the Hugging Face Hub)"
        msg = (
            f"could not load {name!r} as {where}: {exc}. Pass a directory written by save_pretrained, "
            f"or one of the built-in models: {', '.join(zoo.ENTRIES)}."
        )
        raise OSError(msg) from exc
    architecture = (getattr(config, "architectures", None) or [None])[0]
    model_class = getattr(transformers, architecture, None) if architecture else None
    if model_class is None:
        model_class = transformers.AutoModel
    return model_class.from_pretrained(name).eval(), ""


def example_inputs(model: torch.nn.Module, zoo_name: str, *, batch: int, sequence: int) -> dict[str, Any]:
    """Inputs for ``model``: the zoo's builder, or random ids / pixels from the model's config."""
    if zoo_name:
        return zoo.inputs(zoo_name, batch=batch, sequence=sequence)
    config = model.config
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        return zoo.ENTRIES["vit"].inputs(config, batch, sequence)
    return zoo.ENTRIES["llama"].inputs(config, batch, sequence)
