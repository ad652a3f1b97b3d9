"""The sizes a generating model's components meet at run time, which their ``.pte`` bounds must cover.

ExecuTorch plans each program's memory for bounded dims (``lower_to_pte``'s
``max_sizes``, by default batch 4 and 512 elsewhere). Two sizes of a
decomposed model are fixed by the model, not by the prompt, and can pass them:

- a beam search runs ``num_beams`` sequences per prompt: FSMT's generation
  config beams 5, so two prompts decode a batch of 10;
- a decoder reads the encoder's tokens at the length the encoder makes:
  Whisper's encoder always gives 1500 (``max_source_positions``), which its
  decode reads as cross-attention keys (or its prefill as ``encoder_outputs``).

``generation_max_sizes`` reads both from the ``Components`` themselves: the
generation config in their ``meta``, and the static output sizes of the
component that feeds another's inputs. ``lower_to_pte`` lowers each component
with them, under the sizes the caller gives.
"""

from __future__ import annotations

from typing import Any

from hfx._records import Components, Exported

# Inputs a decode or prefill graph takes from the encoder component's outputs: the cross-attention cache
# (``EncoderWithCrossCache``'s second output) and the encoder's own output.
_FED = ("cross_attention_cache.", "encoder_outputs.")


def generation_max_sizes(components: Components, batch: int) -> dict[str, dict[str, int]]:
    """Per component, ``{dim: size}`` each must take: ``batch`` times the generation config's ``num_beams``
    (when it beams), and each dim whose size another component's output fixes (Whisper's 1500 encoder tokens).

    Example:
        >>> import torch, hfx
        >>> from hfx._records import GenerationMeta, GenerationSettings
        >>> one = hfx.export(hfx.capture({"input": torch.ones(2, 3)}, torch.nn.Linear(3, 4)))
        >>> meta = GenerationMeta(generation=GenerationSettings(config={"num_beams": 5}))
        >>> generation_max_sizes(hfx.Components(items={"decode": one}, meta=meta), batch=4)
        {'decode': {'batch': 20}}
    """
    beams = int(components.meta.generation.config.get("num_beams") or 1)
    sizes: dict[str, dict[str, int]] = {key: {} for key in components}
    for key, record in components.items():
        if not isinstance(record, Exported):
            continue
        if beams > 1 and "batch" in record.dynamic_shapes.names:
            sizes[key]["batch"] = batch * beams
        for dim, size in _fed_sizes(record, [other for name, other in components.items() if name != key]).items():
            sizes[key][dim] = max(size, sizes[key].get(dim, 0))
    return sizes


def _fed_sizes(record: Exported, others: list[Any]) -> dict[str, int]:
    """The static size, in an output of one of ``others``, of each dim of ``record``'s inputs fed by that output."""
    produced = {spec.name: spec.shape for other in others if isinstance(other, Exported) for spec in other.io.outputs}
    # an output's name without its position in the output tuple: "1.layers.0.keys" -> "layers.0.keys"
    by_path = {name.split(".", 1)[-1]: shape for name, shape in produced.items()}
    sizes: dict[str, int] = {}
    for spec in record.io.inputs:
        marker = next((m for m in _FED if m in spec.name), None)
        if marker is None:
            continue
        path = spec.name.split(marker, 1)[1]
        shape = produced.get(path) or by_path.get(path)
        if shape is None or len(shape) != len(spec.shape):
            continue
        for want, given in zip(spec.shape, shape):
            if isinstance(want, str) and isinstance(given, int) and "+" not in want and "-" not in want:
                sizes[want] = max(given, sizes.get(want, 0))
    return sizes


def with_generation_max_sizes(
    components: Components, key: str, options: dict[str, Any], *, batch: int
) -> dict[str, Any]:
    """``options`` of ``lower_to_pte`` for the component ``key``: ``max_sizes`` holds its
    ``generation_max_sizes`` (within the component's export bounds) under the caller's."""
    wanted = generation_max_sizes(components, batch).get(key, {})
    record = components[key]
    if not wanted or not isinstance(record, Exported):
        return options
    limits = {**record.dynamic_shapes.bounds, **record.io.bounds}
    clamped = {dim: min(size, limits[dim][1]) if limits[dim][1] is not None else size
               for dim, size in wanted.items() if dim in limits}
    return {**options, "max_sizes": {**clamped, **(options.get("max_sizes") or {})}}
