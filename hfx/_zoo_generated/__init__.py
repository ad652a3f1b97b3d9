"""The generated zoo: a tiny config and inputs for every model type of transformers' auto mappings, per task.

As transformers' own tests do, a type's config is its class's defaults with small sizes passed to every matching
constructor parameter (``shrink``), sub-configs shrunk the same way; the inputs come from the task and the model
class's main input (``generate_inputs``, ``forward_inputs``). Names are ``<task>:<model_type>`` (``causal-lm:llama``); ``hfx.zoo.entry``
resolves them on demand, nothing is built at import. ``census`` checks one type (the tiny config builds, the eager
forward runs at two shapes); ``sample`` picks one eager-runnable type per task for a seed.

Example:
    >>> from hfx import _zoo_generated as generated
    >>> config = generated.tiny_config("llama")
    >>> (config.hidden_size, config.num_hidden_layers, config.vocab_size)
    (32, 2, 256)
"""

from __future__ import annotations

from hfx._zoo_generated._census import CENSUS_PATH, CENSUS_SHAPES, MAX_PARAMETERS, census, runnable, sample
from hfx._zoo_generated._inputs import entry_fields, forward_inputs, generate_inputs
from hfx._zoo_generated._shrink import OVERRIDES, shrink, task_config, tiny_config
from hfx._zoo_generated._sizes import LAYERS, TEXT_HIGH, VOCAB, WIDTH
from hfx._zoo_generated._tasks import TASKS, Task, model_class, names, split_name, task, task_mapping

__all__ = [
    "CENSUS_PATH", "CENSUS_SHAPES", "LAYERS", "MAX_PARAMETERS", "OVERRIDES", "TASKS", "TEXT_HIGH", "VOCAB", "WIDTH",
    "Task", "census", "entry_fields", "forward_inputs", "generate_inputs", "model_class", "names", "runnable", "sample",
    "shrink", "split_name", "task", "task_config", "task_mapping", "tiny_config",
]
