"""Decompositions hfx gives runtimes that have no kernel or conversion rule for an ATen op.

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

``polynomial_erfinv``: ``aten.erfinv``, which is not core ATen, has no ExecuTorch
kernel ("Operator torch._ops.aten.erfinv.default is not in Core ATen opset").
Gemma 3n's MLP computes the threshold of its activation sparsity with
``torch.distributions.Normal(0, 1).icdf(...)`` (``Gemma3nTextMLP._gaussian_topk``,
transformers 5.22-5.24), which is ``erfinv``, inside the graph. ``giles_erfinv``
computes it with two polynomials; ONNX's translation of the op
(``hfx.backends._onnx_translations``) is the same function over ONNX ops.

``cropping_constant_pad``: ``aten.constant_pad_nd`` with a negative entry (a crop, RWKV's token
shift) as a pad and a slice, for ExecuTorch, whose kernel refuses negative padding.

``frame_wise_convolution``: a 3-D ``aten.convolution`` (VideoMAE and ViViT's tubelet embedding) as 2-D
convolutions over frames, for ExecuTorch, whose kernel and XNNPACK take none.

``prefix_cummax``, ``prefix_cummin`` and ``counting_searchsorted``: Grounding DINO and MM Grounding
DINO take running extremes of their special tokens' positions and bucket positions with
``searchsorted`` (transformers 5.22-5.24). ExecuTorch 1.5.1 has no kernel for any of them ("Operator
torch._ops.aten.cummax.default is not in Core ATen opset") and OpenVINO 2026.4.1's frontend no
conversion rule ("No conversion rule found for operations: aten.cummax.default, aten.cummin.default");
ONNX has translations of the same algorithms (``hfx.backends._onnx_translations``).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

# reduce -> (identity of the reduction over the masked-out entries, the reduction over the last axis, how the
# result combines with self's value under include_self; mean then divides by the count)
_REDUCTIONS = {
    "sum": (0.0, lambda values: values.sum(-1), torch.add),
    "mean": (0.0, lambda values: values.sum(-1), torch.add),
    "prod": (1.0, lambda values: values.prod(-1), torch.mul),
    "amax": (-float("inf"), lambda values: values.amax(-1), torch.maximum),
    "amin": (float("inf"), lambda values: values.amin(-1), torch.minimum),
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
    identity, reduction, combine = _REDUCTIONS[reduce]
    base = self.movedim(dim, -1)  # [..., out]
    positions = torch.arange(base.shape[-1], device=self.device)
    mask = index.movedim(dim, -1).unsqueeze(-2) == positions.unsqueeze(-1)  # [..., out, in]
    values = src.movedim(dim, -1).unsqueeze(-2).to(self.dtype)
    reduced = reduction(torch.where(mask, values, torch.full_like(values, identity)))
    counts = mask.sum(-1)
    named = counts > 0
    if include_self:
        reduced = combine(base, reduced)
    if reduce == "mean":
        total = counts + 1 if include_self else counts
        reduced = reduced / total.clamp(min=1).to(self.dtype)
    return torch.where(named, reduced, base).movedim(-1, dim)


def _prefix_extreme(self: torch.Tensor, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.cummax`` (``largest``) or ``torch.cummin`` of ``self`` along ``dim`` over a ``length x length`` prefix
    mask: each position's extreme over the positions up to it, and the last of those that holds it (torch's index
    for ties). The first element fills the masked entries (it is in every prefix), so no dtype's bound is needed."""
    if self.ndim == 0:
        return self.clone(), torch.zeros_like(self, dtype=torch.long)
    rows = self.movedim(dim, -1).unsqueeze(-2)  # [..., 1, j]
    positions = torch.arange(rows.shape[-1], device=self.device)
    prefix = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [i, j]: j <= i
    filled = torch.where(prefix, rows, rows[..., :1])
    values = filled.amax(-1) if largest else filled.amin(-1)
    holds = prefix & (rows == values.unsqueeze(-1))
    indices = torch.where(holds, positions, torch.full_like(positions, -1)).amax(-1)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def prefix_cummax(self: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.cummax(self, dim)`` without a scan (``_prefix_extreme``).

    Example:
        >>> x = torch.tensor([[1, 3, 2, 3, 0]])
        >>> [t.tolist() for t in prefix_cummax(x, 1)] == [t.tolist() for t in torch.cummax(x, 1)]
        True
    """
    return _prefix_extreme(self, dim, largest=True)


def prefix_cummin(self: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.cummin(self, dim)`` without a scan (``_prefix_extreme``)."""
    return _prefix_extreme(self, dim, largest=False)


def counting_searchsorted(sorted_sequence: torch.Tensor, self: torch.Tensor, *, out_int32: bool = False,
                          right: bool = False, side: str | None = None, sorter: torch.Tensor | None = None) -> Any:
    """``torch.searchsorted(sorted_sequence, self, ...)`` as a count of the entries below each value (``right``: not
    above it), one broadcast comparison over the last dims; ``NotImplemented`` with a ``sorter``.

    Example:
        >>> edges, values = torch.tensor([1, 3, 5, 7]), torch.tensor([0, 3, 6, 9])
        >>> counting_searchsorted(edges, values).tolist() == torch.searchsorted(edges, values).tolist()
        True
    """
    if sorter is not None:
        return NotImplemented
    entries, asked = sorted_sequence.unsqueeze(-2), self.unsqueeze(-1)  # [..., 1, N], [..., M, 1]
    below = entries <= asked if right or side == "right" else entries < asked
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


# The coefficients of Giles' single-precision erfinv, highest degree first: for w < 5 in (w - 2.5), else in
# (sqrt(w) - 3).
_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
            -0.00417768164, 0.246640727, 1.50140941)
_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
         0.00943887047, 1.00167406, 2.83297682)


def giles_erfinv(x: Any, ops: Any) -> Any:
    """``erfinv(x)`` by Giles' single-precision approximation, written with the functions of ``ops``.

    M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2010): two
    polynomials in ``w = -log(1 - x^2)``, within 3.7e-7 relative of the exact value;
    ``+-inf`` at ``+-1`` and NaN outside ``[-1, 1]``, as ``torch.erfinv`` gives. ``ops``
    has ``add, mul, sub, neg, log, sqrt, abs, less, equal, where`` and ``const(value, like)``:
    torch's (``TORCH_OPS``) for a decomposition, ONNX's for a translation.

    Example:
        >>> x = torch.tensor([-0.5, 0.0, 0.9, 1.0])
        >>> torch.testing.assert_close(giles_erfinv(x, TORCH_OPS), torch.erfinv(x), rtol=1e-6, atol=1e-7)
    """
    one = ops.const(1.0, x)
    w = ops.neg(ops.log(ops.mul(ops.sub(one, x), ops.add(one, x))))
    central = _polynomial(ops, ops.sub(w, ops.const(2.5, x)), _CENTRAL)
    tail = _polynomial(ops, ops.sub(ops.sqrt(w), ops.const(3.0, x)), _TAIL)
    inside = ops.mul(ops.where(ops.less(w, ops.const(5.0, x)), central, tail), x)
    return ops.where(ops.equal(ops.abs(x), one), ops.mul(x, ops.const(float("inf"), x)), inside)


def _polynomial(ops: Any, w: Any, coefficients: tuple[float, ...]) -> Any:
    """``coefficients`` evaluated at ``w`` by Horner's rule."""
    result = ops.const(coefficients[0], w)
    for coefficient in coefficients[1:]:
        result = ops.add(ops.mul(result, w), ops.const(coefficient, w))
    return result


def _torch_const(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), value, dtype=like.dtype, device=like.device)


# torch's functions under the names ``giles_erfinv`` calls.
TORCH_OPS = types.SimpleNamespace(add=torch.add, mul=torch.mul, sub=torch.sub, neg=torch.neg, log=torch.log,
                                  sqrt=torch.sqrt, abs=torch.abs, less=torch.lt, equal=torch.eq, where=torch.where,
                                  const=_torch_const)


def polynomial_erfinv(self: torch.Tensor) -> Any:
    """``aten.erfinv`` as ``giles_erfinv`` in core ATen ops (floating tensors; ``NotImplemented`` otherwise)."""
    return giles_erfinv(self, TORCH_OPS) if self.is_floating_point() else NotImplemented


def crops(pad: Any) -> bool:
    """Whether a ``constant_pad_nd`` padding is all ints with a negative entry: the pads ``cropping_constant_pad``
    rewrites (it returns the op as it is for any other).

    Example:
        >>> crops([1, -1]), crops([1, 1])
        (True, False)
    """
    return all(isinstance(p, int) for p in pad) and min(pad, default=0) < 0


def cropping_constant_pad(self: torch.Tensor, pad: list[int], value: float = 0.0) -> Any:
    """``aten.constant_pad_nd`` with negative entries (a crop) as a pad of the positive ones, then slices;
    ``NotImplemented`` (the op as it is) when no entry is a negative int.

    RWKV shifts its tokens with ``nn.ZeroPad2d((0, 0, 1, -1))`` (transformers 5.22-5.24): one row of zeros
    before, the last row cropped. ExecuTorch 1.5.1's ``constant_pad_nd`` kernel refuses negative
    padding ("Padding values must be non-negative", kernel_ops_util.cpp), and the method fails to run.

    Example:
        >>> cropping_constant_pad(torch.arange(4.0)[None], [1, -1]).tolist()
        [[0.0, 0.0, 1.0, 2.0]]
    """
    if not crops(pad):
        return NotImplemented
    positive = [max(p, 0) for p in pad]
    output = torch.ops.aten.constant_pad_nd.default(self, positive, value) if any(positive) else self
    for pair in range(len(pad) // 2):  # pairs run from the last dim backwards
        dim = self.dim() - 1 - pair
        before, after = pad[2 * pair], pad[2 * pair + 1]
        if before < 0 or after < 0:
            end = output.shape[dim] + min(after, 0)
            output = torch.ops.aten.slice.Tensor(output, dim, -min(before, 0), end)
    return output


def _crops_node(node: torch.fx.Node) -> bool:
    """Whether ``cropping_constant_pad`` rewrites this ``constant_pad_nd`` call of a graph (its padding crops)."""
    return crops(node.args[1])


def frame_wise_convolution(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int], padding: list[int],  # noqa: A002
    dilation: list[int], transposed: bool, output_padding: list[int], groups: int,
) -> Any:
    """A 3-D ``aten.convolution`` as the sum, over the kernel's frames, of 2-D convolutions of the input's frames it
    reads; ``NotImplemented`` (the op as it is) for any other convolution.

    Video transformers embed tubelets with ``nn.Conv3d`` (VideoMAE, ViViT; transformers 5.22-5.24).
    XNNPACK takes no 3-D convolution and ExecuTorch 1.5.1's portable kernel refuses a 5-D input
    ("Expect input tensor to be 3-D or 4-D, but got, 5", kernel_ops_util.cpp): the method fails with
    InvalidArgument. The 2-D convolutions run in XNNPACK, each on every output frame at once.

    Example:
        >>> x, w = torch.randn(2, 3, 5, 8, 8), torch.randn(4, 3, 2, 3, 3)
        >>> want = torch.nn.functional.conv3d(x, w, stride=(2, 1, 1), padding=(1, 1, 1))
        >>> got = frame_wise_convolution(x, w, None, [2, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
        >>> got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
        True
    """
    if transposed or input.dim() != 5:
        return NotImplemented
    aten = torch.ops.aten
    frames_stride, frames_padding, frames_dilation = stride[0], padding[0], dilation[0]
    if frames_padding:
        input = aten.constant_pad_nd.default(input, [0, 0, 0, 0, frames_padding, frames_padding])  # noqa: A001
    batch, frames = input.shape[0], input.shape[2]
    taps = weight.shape[2]
    out_frames = (frames - frames_dilation * (taps - 1) - 1) // frames_stride + 1
    total = None
    for tap in range(taps):
        start = tap * frames_dilation
        read = aten.slice.Tensor(input, 2, start, start + (out_frames - 1) * frames_stride + 1, frames_stride)
        read = aten.permute.default(read, [0, 2, 1, 3, 4])
        read = aten.reshape.default(read, [batch * out_frames, *read.shape[2:]])
        tapped = aten.convolution.default(read, aten.select.int(weight, 2, tap), None, stride[1:], padding[1:],
                                          dilation[1:], False, [0, 0], groups)
        total = tapped if total is None else aten.add.Tensor(total, tapped)
    if bias is not None:
        total = aten.add.Tensor(total, aten.reshape.default(bias, [-1, 1, 1]))
    total = aten.reshape.default(total, [batch, out_frames, *total.shape[1:]])
    return aten.permute.default(total, [0, 2, 1, 3, 4])


def _convolves_frames(node: torch.fx.Node) -> bool:
    """Whether ``frame_wise_convolution`` rewrites this ``convolution`` call of a graph (a 3-D one)."""
    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return not node.args[6] and getattr(value, "ndim", 0) == 5


frame_wise_convolution.applies_to = _convolves_frames  # type: ignore[attr-defined]


# Which calls the entry rewrites: a pass that asks whether a table would change a graph reads it
# (``hfx.backends._executorch_retraces.decomposes_nothing``); on every other call the entry is the op as it is.
cropping_constant_pad.applies_to = _crops_node  # type: ignore[attr-defined]


# The decompositions of the ATen ops that OpenVINO's frontend or ExecuTorch's kernels lack (module docstring).
DENSE_DECOMPOSITIONS = {torch.ops.aten.scatter_reduce.two: dense_scatter_reduce,
                        torch.ops.aten.erfinv.default: polynomial_erfinv,
                        torch.ops.aten.cummax.default: prefix_cummax,
                        torch.ops.aten.cummin.default: prefix_cummin,
                        torch.ops.aten.searchsorted.Tensor: counting_searchsorted}
# op -> the name of the ExecuTorch kernel that would run it.
_EXECUTORCH_KERNELS = {torch.ops.aten.scatter_reduce.two: "aten::scatter_reduce.two_out",
                       torch.ops.aten.erfinv.default: "aten::erfinv.out",
                       torch.ops.aten.cummax.default: "aten::cummax.out",
                       torch.ops.aten.cummin.default: "aten::cummin.out",
                       torch.ops.aten.searchsorted.Tensor: "aten::searchsorted.Tensor_out"}


def executorch_decompositions() -> dict[Any, Any]:
    """The entries of ``DENSE_DECOMPOSITIONS`` whose op has no kernel registered with ExecuTorch's runtime."""
    from executorch.extension.pybindings import portable_lib

    registered = set(portable_lib._get_operator_names())
    return {op: function for op, function in DENSE_DECOMPOSITIONS.items() if _EXECUTORCH_KERNELS[op] not in registered}


def openvino_decompositions(ops: Any = None) -> dict[Any, Any]:
    """The entries of ``DENSE_DECOMPOSITIONS`` whose op OpenVINO's PyTorch frontend cannot convert, among ``ops``
    (a graph's call targets; all by default). Each op is probed once per process, only when asked about."""
    wanted = DENSE_DECOMPOSITIONS if ops is None else [op for op in DENSE_DECOMPOSITIONS if op in set(ops)]
    return {op: DENSE_DECOMPOSITIONS[op] for op in wanted if _openvino_refuses(op)}


class _OneOp(torch.nn.Module):
    """A graph of one op call, for the frontend probe."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self.call = call

    def forward(self, *args: torch.Tensor) -> Any:
        return self.call(*args)


# op -> (a call of it, example inputs): what ``_openvino_refuses`` tries to convert.
_PROBES = {
    torch.ops.aten.scatter_reduce.two: (lambda out, index, src: out.scatter_reduce(0, index, src, "amin", include_self=False),
                                        (torch.zeros(3), torch.tensor([0, 2, 0]), torch.ones(3))),
    torch.ops.aten.erfinv.default: (torch.erfinv, (torch.zeros(3),)),
    torch.ops.aten.cummax.default: (lambda x: torch.cummax(x, 0), (torch.zeros(3),)),
    torch.ops.aten.cummin.default: (lambda x: torch.cummin(x, 0), (torch.zeros(3),)),
    torch.ops.aten.searchsorted.Tensor: (torch.searchsorted, (torch.arange(3.0), torch.zeros(2))),
}


@functools.cache
def _openvino_refuses(op: Any) -> bool:
    """Whether ``convert_model`` refuses a graph of ``op`` alone (its ``_PROBES`` call; OpenVINO 2026.4.1 converts
    ``erfinv`` and ``searchsorted``, not ``scatter_reduce``, ``cummax`` or ``cummin``)."""
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    call, probe = _PROBES[op]
    module = torch.export.export(_OneOp(call), probe).module()
    try:
        openvino.convert_model(TorchFXPythonDecoder(module, dynamic_shapes=True))
    except Exception:  # noqa: BLE001 - any refusal means the frontend lacks the op
        return True
    return False
