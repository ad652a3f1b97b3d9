"""``quantize_pt2e``: PT2E quantization of an exported graph for XNNPACK (ExecuTorch).

The graph of ``exported.program.module()`` (a copy) is prepared with the
XNNPACK quantizer, calibrated, converted to quantize/dequantize ops around
each linear, and exported again with the same calling contract and dynamic
shapes, so ``lower_to_pte`` delegates the quantized linears to XNNPACK.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch
from toolz import curry
from torch.utils import _pytree as pytree

from hfx._lift import per_component
from hfx._records import Capture, Exported
from hfx.quantize._calibration import Calibration, graph_feeds
from hfx.quantize._common import check_choice, check_positive_int, component_samples, quantization_error, quietly, with_quantization
from hfx._serial import one_at_a_time

STAGE = "quantize_pt2e"

# scheme -> what it does; "int8" is the only one that needs calibration data.
SCHEMES: Mapping[str, str] = MappingProxyType(
    {
        "8da4w": "int8 dynamic activations, int4 weights (symmetric, per group of group_size inputs)",
        "8da8w": "int8 dynamic activations, int8 weights (symmetric, per output channel)",
        "int8": "static int8 activations (calibrated) and int8 per-channel weights",
    }
)


@curry
def quantize_pt2e(
    exported: Any, /, *, scheme: str = "8da4w", calibration: Calibration | None = None, group_size: int = 32
) -> Any:
    """Quantize an exported graph with PT2E and the XNNPACK quantizer, for ``lower_to_pte``.

    Linear layers get int8 or int4 weights; activations are quantized per call
    (``8da*``) or with ranges observed on ``calibration`` (``int8``). The result
    is an ``Exported`` with the same ``io`` and dynamic shapes: call it for a
    torch-side check, save it, or lower it (``pipe(model, capture(inputs), export,
    quantize_pt2e, lower_to_pte)``). ``exported`` and its program are not changed.

    Args:
        exported: an ``Exported``, or ``Components`` of them (from ``decompose`` + ``export``).
        scheme: ``"8da4w"``, ``"8da8w"`` or ``"int8"`` (see ``SCHEMES``).
        calibration: input dicts for the model, or ``{component: [input dicts]}``
            (``hfx.calibration_inputs``); required for ``"int8"``, optional otherwise.
        group_size: inputs per int4 weight scale for ``"8da4w"``; must divide every linear's input size.

    Returns:
        A new ``Exported`` (``Components`` of them, with ``meta.quantization``).

    Raises:
        ValueError: an unknown ``scheme``, a bad ``group_size``, or ``"int8"`` without calibration.
        ImportError: executorch or torchao is missing (install ``hfx[executorch]``).
        LoweringError: preparing, calibrating, converting or exporting again failed.

    Example:
        >>> import torch, hfx
        >>> lin = hfx.export(hfx.capture({"input": torch.ones(2, 64)}, torch.nn.Linear(64, 8)))
        >>> q = quantize_pt2e(lin, scheme="8da8w")
        >>> q(input=torch.ones(5, 64)).shape
        torch.Size([5, 8])
    """
    check_choice(STAGE, "scheme", scheme, SCHEMES)
    check_positive_int(STAGE, "group_size", group_size, "32, 64, 128")
    result = per_component(_quantize, name=STAGE)(exported, scheme=scheme, calibration=calibration, group_size=group_size)
    entry = {"stage": STAGE, "scheme": scheme, "calibrated": calibration is not None}
    return with_quantization(result, {**entry, "group_size": group_size} if scheme == "8da4w" else entry)


@one_at_a_time
def _quantize(exported: Exported, /, *, scheme: str, calibration: Calibration | None, group_size: int) -> Exported:
    """One component: prepare, calibrate, convert, export again; the contract and shapes are kept."""
    from hfx._pytree import spec_caches
    from hfx.backends._common import require

    require("executorch", "torchao", extra="executorch", stage="quantize_pt2e")
    static = "scheme 'int8'" if scheme == "int8" else None
    samples = component_samples(STAGE, exported, Exported, calibration, static=static, instead="scheme='8da8w'")
    with spec_caches(exported.io):
        feeds = graph_feeds(exported.io, samples, program=f"{STAGE}({exported.name})") if samples else None
        module = exported.program.module()  # a new GraphModule: the program's graph is not touched
        if scheme == "8da4w":
            _check_group_size(exported, module, group_size)
        with quietly("torch", "torchao", "executorch") as log:
            try:
                again = _export_again(_converted(module, exported, scheme, group_size, feeds), exported)
            except Exception as exc:
                todo = "Try scheme='8da8w', or quantize with another runtime's stage (quantize_onnx, quantize_ov)."
                raise quantization_error(STAGE, exported.source_class, exported.name, exc, todo, log.getvalue()) from exc
    return attrs.evolve(exported, program=again.program)


def _converted(
    module: torch.fx.GraphModule, exported: Exported, scheme: str, group_size: int, feeds: list[list[torch.Tensor]] | None
) -> torch.fx.GraphModule:
    """``module`` prepared, run on ``feeds`` (or on zeros, which only feeds the weight observers) and converted."""
    from executorch.backends.transforms.duplicate_dynamic_quant_chain import DuplicateDynamicQuantChainPass
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(module, _quantizer(scheme, group_size))
    spec = exported.program.call_spec.in_spec
    calls = [pytree.tree_unflatten(flat, spec)[1] for flat in feeds] if feeds else [_example_kwargs(exported)]
    with torch.no_grad():
        for kwargs in calls:
            prepared(**kwargs)
    converted = convert_pt2e(prepared)
    # One dynamic quantize chain per linear: a chain shared by q/k/v makes the XNNPACK partitioner
    # find dependency cycles ("Invalid partition, found dependency cycles"), as in ExecuTorch's LLM export.
    DuplicateDynamicQuantChainPass()(converted)
    return converted


def _quantizer(scheme: str, group_size: int) -> Any:
    """The XNNPACK quantizer for ``scheme``, with integer scalars kept integer (``keep_integer_scalars``)."""
    import dataclasses

    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    if scheme == "int8":
        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)
    else:
        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
        if scheme == "8da4w":
            config = dataclasses.replace(config, weight=_int4_group_weights(group_size))
    quantizer = XNNPACKQuantizer().set_global(config)
    quantizer.transform_for_annotation = keep_integer_scalars  # this instance only; see keep_integer_scalars
    return quantizer


def _int4_group_weights(group_size: int) -> Any:
    """Symmetric int4 weights (in int8 storage, [-8, 7]) with one scale per ``group_size`` inputs.

    torchao's affine observer converts to ``torchao.dequantize_affine`` with
    block size ``(1, group_size)``, which the XNNPACK partitioner lowers as a
    per-channel-group (blockwise) int4 linear.
    """
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.pt2e._affine_quantization import AffineQuantizedMinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationSpec
    from torchao.quantization.quant_primitives import MappingType

    observer = AffineQuantizedMinMaxObserver.with_args(
        mapping_type=MappingType.SYMMETRIC, target_dtype=torch.int8, granularity=PerGroup(group_size),
        quant_min=-8, quant_max=7, eps=2**-12, scale_dtype=torch.float32, zero_point_dtype=torch.int8,
    )
    return QuantizationSpec(dtype=torch.int8, quant_min=-8, quant_max=7, qscheme=torch.per_channel_symmetric,
                            ch_axis=0, is_dynamic=False, observer_or_fake_quant_ctr=observer)


def keep_integer_scalars(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The XNNPACK quantizer's scalar lifting, with each lifted scalar in its node's dtype.

    ``XNNPACKQuantizer.transform_for_annotation`` lifts every scalar of
    ``aten.add``/``aten.mul`` into a float32 buffer, so Hugging Face's integer
    position arithmetic (``arange(n) + 0``, used as an index into the mask)
    turns float and the prepared graph fails: "tensors used as indices must be
    long, int, byte or bool tensors" (pytorch/executorch#22062, fixed by #22065
    after executorch 1.5.1). Delete when executorch > 1.5.1 is required.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import _convert_scalars_to_attrs

    model = _convert_scalars_to_attrs(model)
    for node in model.graph.nodes:
        if node.op != "get_attr" or not node.target.startswith("_tensor_constant_") or not node.users:
            continue
        wanted = next(iter(node.users)).meta["val"].dtype
        lifted = getattr(model, node.target)
        if lifted.dtype != wanted:
            setattr(model, node.target, lifted.to(wanted))
            node.meta["val"] = node.meta["val"].to(wanted)
    return model


def _check_group_size(exported: Exported, module: torch.fx.GraphModule, group_size: int) -> None:
    """Raise ``ValueError`` unless ``group_size`` divides the input size of every linear weight."""
    sizes = sorted({
        int(node.args[1].meta["val"].shape[-1])
        for node in module.graph.nodes
        if node.target is torch.ops.aten.linear.default and "val" in getattr(node.args[1], "meta", {})
    })
    bad = [size for size in sizes if size % group_size]
    if bad:
        msg = (
            f"{STAGE}: group_size={group_size} does not divide the input size of linear layers of "
            f"{exported.name!r} ({bad}); pick a divisor of {sizes} (32 for most LLMs)"
        )
        raise ValueError(msg)


def _example_kwargs(exported: Exported) -> dict[str, Any]:
    """Zero inputs at the export's trace sizes (tracing and weight observers read only shapes)."""
    from hfx._export.example_inputs import example_kwargs

    return example_kwargs(exported, {**exported.dynamic_shapes.bounds, **exported.io.bounds})


def _export_again(converted: torch.fx.GraphModule, exported: Exported) -> Exported:
    """The converted graph exported with ``exported``'s dynamic shapes (no patches: it is a plain graph)."""
    from hfx._export.export import export

    capture = Capture(
        module=converted, source=converted, kwargs=_example_kwargs(exported),
        dynamic_shapes=exported.dynamic_shapes, is_flat=True, name=exported.name,
    )
    again = export(capture, patches=())
    lost = sorted(set(exported.dynamic_shapes.names) - set(again.dynamic_shapes.names))
    if lost:
        msg = f"the quantized graph made dim(s) {lost} static"
        raise ValueError(msg)
    return again
