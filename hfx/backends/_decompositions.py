"""Decompositions hfx gives runtimes that have no kernel or conversion rule for a core ATen op.

``dense_scatter_reduce``: ``aten.scatter_reduce.two`` as a masked reduction over a
one-hot comparison of the index with the output positions. TAPAS reduces its
token positions per table cell with ``scatter_reduce(reduce="amin",
include_self=False)`` (``modeling_tapas._segment_reduce``, transformers 5.22-5.24).
OpenVINO 2026.4's PyTorch frontend has no FX conversion rule for the op ("No
conversion rule found for operations: aten.scatter_reduce.two") and ExecuTorch
1.5.1 has no kernel for it (the method fails to load, OperatorMissing); ONNX
lowers it to ``ScatterElements`` and needs nothing. ``lower_to_ov`` adds it to
the decomposition table it builds while its frontend refuses a graph of that op
alone (``openvino_decompositions``, probed once per process), ``lower_to_pte`` to
ExecuTorch's while its runtime registers no kernel for it
(``executorch_decompositions``, ``patch_edge_decomposition_table``). Each steps
aside by itself when the runtime gains the op; delete the module then.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# reduce -> (identity of the reduction over the masked-out entries, the reduction over the last axis)
_REDUCTIONS = {
    "sum": (0.0, lambda values: values.sum(-1)),
    "mean": (0.0, lambda values: values.sum(-1)),
    "prod": (1.0, lambda values: values.prod(-1)),
    "amax": (-float("inf"), lambda values: values.amax(-1)),
    "amin": (float("inf"), lambda values: values.amin(-1)),
}


def dense_scatter_reduce(
    self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *, include_self: bool = True
) -> Any:
    """``self.scatter_reduce(dim, index, src, reduce, include_self=...)`` without a scatter, or ``NotImplemented``.

    Each output position ``j`` along ``dim`` reduces the ``src`` entries whose
    index is ``j`` (a ``[..., out, in]`` comparison, so memory grows with the
    product of both lengths); a position no index names keeps ``self``'s value,
    as the op does. Floating tensors whose ``index`` and ``src`` have ``self``'s
    shape but along ``dim`` only; for anything else ``NotImplemented`` (the op
    stays as it is). Equal to the op up to float summation order.

    Example:
        >>> out, index, src = torch.zeros(3), torch.tensor([0, 2, 0]), torch.tensor([4.0, 5.0, 1.0])
        >>> dense_scatter_reduce(out, 0, index, src, "amin", include_self=False)
        tensor([1., 0., 5.])
        >>> out.scatter_reduce(0, index, src, "amin", include_self=False)
        tensor([1., 0., 5.])
    """
    dim = dim % max(self.ndim, 1)
    same_elsewhere = all(index.shape[d] == self.shape[d] for d in range(self.ndim) if d != dim)
    if (reduce not in _REDUCTIONS or not self.is_floating_point() or self.ndim == 0 or index.ndim != self.ndim
            or src.shape != index.shape or not same_elsewhere):
        return NotImplemented
    identity, reduction = _REDUCTIONS[reduce]
    base = self.movedim(dim, -1)  # [..., out]
    positions = torch.arange(base.shape[-1], device=self.device)
    mask = index.movedim(dim, -1).unsqueeze(-2) == positions.unsqueeze(-1)  # [..., out, in]
    values = src.movedim(dim, -1).unsqueeze(-2).to(self.dtype)
    reduced = reduction(torch.where(mask, values, torch.full_like(values, identity)))
    counts = mask.sum(-1)
    named = counts > 0
    if reduce == "mean":
        total = counts + 1 if include_self else counts
        reduced = (reduced + base if include_self else reduced) / total.clamp(min=1).to(self.dtype)
    elif include_self:
        reduced = {"sum": torch.add, "prod": torch.mul, "amax": torch.maximum, "amin": torch.minimum}[reduce](base, reduced)
    return torch.where(named, reduced, base).movedim(-1, dim)


# The decompositions of core ATen ops that OpenVINO's frontend and ExecuTorch's kernels lack (module docstring).
DENSE_DECOMPOSITIONS = {torch.ops.aten.scatter_reduce.two: dense_scatter_reduce}
# op -> the name of the ExecuTorch kernel that would run it.
_EXECUTORCH_KERNELS = {torch.ops.aten.scatter_reduce.two: "aten::scatter_reduce.two_out"}


def executorch_decompositions() -> dict[Any, Any]:
    """The entries of ``DENSE_DECOMPOSITIONS`` whose op has no kernel registered with ExecuTorch's runtime."""
    from executorch.extension.pybindings import portable_lib

    registered = set(portable_lib._get_operator_names())
    return {op: function for op, function in DENSE_DECOMPOSITIONS.items() if _EXECUTORCH_KERNELS[op] not in registered}


def openvino_decompositions() -> dict[Any, Any]:
    """The entries of ``DENSE_DECOMPOSITIONS`` whose op OpenVINO's PyTorch frontend cannot convert (probed once)."""
    return {op: DENSE_DECOMPOSITIONS[op] for op in _openvino_unconvertible()}


@functools.cache
def _openvino_unconvertible() -> tuple[Any, ...]:
    """The ops of ``DENSE_DECOMPOSITIONS`` that ``convert_model`` refuses, each tried on a graph of that op alone."""
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    class ScatterReduce(torch.nn.Module):
        def forward(self, out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
            return out.scatter_reduce(0, index, src, "amin", include_self=False)

    probe = (torch.zeros(3), torch.tensor([0, 2, 0]), torch.ones(3))
    module = torch.export.export(ScatterReduce(), probe).module()
    try:
        openvino.convert_model(TorchFXPythonDecoder(module, dynamic_shapes=True))
    except Exception:  # noqa: BLE001 - any refusal means the frontend lacks the op
        return (torch.ops.aten.scatter_reduce.two,)
    return ()
