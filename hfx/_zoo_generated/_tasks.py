"""The generated zoo's tasks: which auto mapping each reads and which model class a name builds."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Task:
    """A task of the generated zoo: the auto mapping it reads, the Auto class that builds it, whether it generates."""

    name: str
    mapping: str  # a ``*_MAPPING_NAMES`` of ``transformers.models.auto.modeling_auto``
    auto_class: str
    generative: bool = False


TASKS: tuple[Task, ...] = (
    Task(name="causal-lm", mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", auto_class="AutoModelForCausalLM",
         generative=True),
    Task(name="masked-lm", mapping="MODEL_FOR_MASKED_LM_MAPPING_NAMES", auto_class="AutoModelForMaskedLM"),
    Task(name="sequence-classification", mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         auto_class="AutoModelForSequenceClassification"),
    Task(name="seq2seq-lm", mapping="MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", auto_class="AutoModelForSeq2SeqLM",
         generative=True),
    Task(name="speech-seq2seq", mapping="MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
         auto_class="AutoModelForSpeechSeq2Seq", generative=True),
    Task(name="ctc", mapping="MODEL_FOR_CTC_MAPPING_NAMES", auto_class="AutoModelForCTC"),
    Task(name="image-classification", mapping="MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
         auto_class="AutoModelForImageClassification"),
    Task(name="image-text-to-text", mapping="MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
         auto_class="AutoModelForImageTextToText", generative=True),
    Task(name="object-detection", mapping="MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
         auto_class="AutoModelForObjectDetection"),
    Task(name="semantic-segmentation", mapping="MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
         auto_class="AutoModelForSemanticSegmentation"),
    Task(name="feature-extraction", mapping="MODEL_MAPPING_NAMES", auto_class="AutoModel"),
)
_TASKS_BY_NAME: Mapping[str, Task] = MappingProxyType({task.name: task for task in TASKS})


def task(name: str) -> Task:
    """The task called ``name``; ``KeyError`` lists the known ones."""
    if name not in _TASKS_BY_NAME:
        msg = f"the generated zoo has no task {name!r}; known: {list(_TASKS_BY_NAME)}"
        raise KeyError(msg)
    return _TASKS_BY_NAME[name]


def task_mapping(name: str) -> Mapping[str, str]:
    """``{model_type: model class name}`` of task ``name``, read from this transformers' auto mapping.

    Example:
        >>> task_mapping("causal-lm")["llama"]
        'LlamaForCausalLM'
    """
    from transformers.models.auto import modeling_auto

    classes = getattr(modeling_auto, task(name).mapping)
    # A type can map to several classes (DeiT with and without its teacher): the first is the Auto class's.
    return MappingProxyType({t: c[0] if isinstance(c, (tuple, list)) else c for t, c in classes.items()})


def names(tasks: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Every generated entry name ``<task>:<model_type>``, for ``tasks`` (default: all), in mapping order.

    Example:
        >>> "causal-lm:llama" in names(("causal-lm",))
        True
    """
    return tuple(f"{t}:{model_type}" for t in (tasks or tuple(_TASKS_BY_NAME)) for model_type in task_mapping(t))


def split_name(name: str) -> tuple[Task, str]:
    """``(task, model_type)`` of a generated name; ``KeyError`` when it is not one."""
    task_name, _, model_type = name.partition(":")
    if not model_type:
        msg = f"{name!r} is not a generated zoo name (<task>:<model_type>)"
        raise KeyError(msg)
    if model_type not in task_mapping(task_name):
        msg = f"transformers has no {model_type!r} for task {task_name!r}"
        raise KeyError(msg)
    return task(task_name), model_type


def model_class(name: str, /) -> Any:
    """The transformers model class the task's Auto class builds for a generated name."""
    import transformers

    spec, model_type = split_name(name)
    return getattr(transformers, task_mapping(spec.name)[model_type])
