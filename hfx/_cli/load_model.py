"""Load a model for the command line: a ``hfx.zoo`` name, a local ``save_pretrained`` directory, or a hub id."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import torch

from hfx import zoo
from hfx.backends._common import first_line

#: ``--task`` -> the transformers Auto class that loads the model for it.
TASKS = MappingProxyType(
    {
        "text-generation": "AutoModelForCausalLM",
        "text2text-generation": "AutoModelForSeq2SeqLM",
        "image-text-to-text": "AutoModelForImageTextToText",
        "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
        "feature-extraction": "AutoModel",
        "fill-mask": "AutoModelForMaskedLM",
        "image-classification": "AutoModelForImageClassification",
        "sequence-classification": "AutoModelForSequenceClassification",
        "token-classification": "AutoModelForTokenClassification",
    }
)

#: ``--dtype`` -> the torch dtype the model is loaded in.
DTYPES = MappingProxyType({"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16})

# A model's main input -> the zoo entry whose input builder makes inputs of that kind from any config.
_INPUT_BUILDERS = MappingProxyType(
    {"input_ids": "llama", "pixel_values": "vit", "input_features": "whisper", "input_values": "wav2vec2"}
)


@attrs.frozen(kw_only=True, eq=False)
class LoadedModel:
    """A model ready to export, where it came from, and its tokenizer or processor when it has one."""

    model: torch.nn.Module
    label: str
    zoo_name: str = ""
    processor: Any = None


def load_model(name: str | None, *, task: str | None = None, dtype: str = "float32") -> LoadedModel:
    """Load ``name`` in eval mode: a zoo name (``None`` is the zoo's default), a directory or a hub id.

    Args:
        name: a ``hfx.zoo`` name, a directory written by ``save_pretrained``, a hub id, or ``None``.
        task: a key of ``TASKS``; default: the zoo entry's class, else the config's ``architectures``.
        dtype: a key of ``DTYPES``.

    Returns:
        The model, a label for messages, its zoo name (``""`` otherwise) and its processor (or ``None``).

    Raises:
        OSError: the directory or hub id cannot be loaded; the message says why and what to pass instead.
    """
    if name is None or name in zoo.ENTRIES:
        key = name or zoo.DEFAULT
        model = zoo.build(key) if task is None else _from_zoo_config(key, task)
        return LoadedModel(model=model.to(DTYPES[dtype]), label=f"{key} (hfx.zoo, random weights)", zoo_name=key)
    config = _config(name)
    model_class = _model_class(config, task)
    model = model_class.from_pretrained(name, dtype=DTYPES[dtype]).eval()
    return LoadedModel(model=model, label=name, processor=_processor(name))


def _from_zoo_config(key: str, task: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, TASKS[task]).from_config(zoo.entry(key).config()).eval()


def _config(name: str) -> Any:
    """The model's config; ``OSError`` with a message that separates a bad directory, no network and no such id."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise OSError(_not_loadable(name, exc)) from exc


def _not_loadable(name: str, exc: BaseException) -> str:
    instead = f"Pass a directory written by save_pretrained or a built-in model name ({', '.join(zoo.names()[:6])}, ...; see `hfx zoo`)."
    if Path(name).is_dir():
        return f"{name!r} is a directory but transformers could not load a config from it ({first_line(exc)}). {instead}"
    if Path(name).suffix or name.startswith((".", "/", "~")):
        return f"{name!r} is not a directory, a built-in model name or a hub id. {instead}"
    if _is_offline(exc):
        return (f"{name!r} is not a directory or a built-in model name, and the Hugging Face Hub could not be reached "
                f"to download it (no network, or HF_HUB_OFFLINE is set). {instead}")
    return f"{name!r} is not a directory, a built-in model name or a model on the Hugging Face Hub ({first_line(exc)}). {instead}"


def _is_offline(exc: BaseException | None) -> bool:
    """Whether the hub could not be reached (huggingface_hub's ``LocalEntryNotFoundError`` or a connection error)."""
    seen = 0
    while exc is not None and seen < 10:
        if type(exc).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "ConnectError"):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _model_class(config: Any, task: str | None) -> Any:
    """The class that loads ``config``: the ``task``'s Auto class, else its architecture, else ``AutoModel``."""
    import transformers

    if task is not None:
        return getattr(transformers, TASKS[task])
    architecture = (getattr(config, "architectures", None) or [None])[0]
    found = getattr(transformers, architecture, None) if architecture else None
    return found if found is not None else transformers.AutoModel


def _processor(name: str) -> Any:
    """The tokenizer or processor saved with the model, or ``None`` when there is none."""
    from hfx._save import load_processor

    try:
        return load_processor(Path(name)) if Path(name).is_dir() else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def example_inputs(loaded: LoadedModel, *, batch: int, sequence: int, generation: bool) -> dict[str, Any]:
    """Inputs for ``loaded.model`` of the given batch size and sequence length.

    The zoo's builder for zoo models, else the builder that matches the model's
    main input, fed with the model's own config. ``generation`` gives the
    inputs ``generate`` takes; otherwise one ``forward`` call's (with the
    decoder's tokens for encoder-decoders).
    """
    model = loaded.model
    if loaded.zoo_name:
        entry, config = zoo.entry(loaded.zoo_name), zoo.entry(loaded.zoo_name).config()
    else:
        entry, config = zoo.entry(_INPUT_BUILDERS.get(model.main_input_name, "llama")), model.config
    values = entry.inputs(config, batch, sequence)
    values = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in values.items()}
    if not generation and getattr(model.config, "is_encoder_decoder", False):
        values["decoder_input_ids"] = _decoder_ids(model.config, batch, sequence)
    return values


def _decoder_ids(config: Any, batch: int, sequence: int) -> torch.Tensor:
    """The start token then ``sequence // 2`` random ids: what a seq2seq forward takes as decoder tokens."""
    generator = torch.Generator().manual_seed(batch * 1000 + sequence + 1)
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (batch, sequence // 2 + 1), generator=generator)
    ids[:, 0] = config.decoder_start_token_id
    return ids
