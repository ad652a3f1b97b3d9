"""Patches of ExecuTorch's XNNPACK partitioner that ``lower_to_pte`` enters while it lowers a program."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches import swap_attr


def _dynamic_dims(node: torch.fx.Node) -> int:
    """How many dims of ``node``'s output are symbolic."""
    val = node.meta.get("val")
    return sum(isinstance(size, torch.SymInt) and not size.node.is_constant() for size in getattr(val, "shape", ()))


def _output_has_one_dynamic_dim(node: torch.fx.Node) -> bool:
    """Whether XNNPACK can serialise ``node`` as a static reshape: at most one dynamic dim in its output."""
    return _dynamic_dims(node) <= 1


def _is_conv1d(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a 1-D convolution (its weight is 3-D, the test ExecuTorch's ``Conv1dUnsqueezePass`` makes)."""
    weight = node.args[1] if len(node.args) > 1 else None
    return isinstance(weight, torch.fx.Node) and len(getattr(weight.meta.get("val"), "shape", ())) == 3


def _conv1d_reshapes_have_one_dynamic_dim(node: torch.fx.Node) -> bool:
    """Whether the reshapes XNNPACK wraps a 1-D convolution in have one dynamic dim at most (other convs have none)."""
    data = node.args[0]
    return not _is_conv1d(node) or (_dynamic_dims(node) <= 1 and _dynamic_dims(data) <= 1)


def _is_exact_gelu(node: torch.fx.Node) -> bool:
    """Whether ``node`` is the erf GELU (``approximate="none"``), the only one XNNPACK computes."""
    return node.kwargs.get("approximate", "none") == "none"


def _refusing(original: Any, accepts: Callable[[torch.fx.Node], bool]) -> Any:
    """Wrap a config's ``check_constraints`` so it also refuses a node that ``accepts`` rejects."""

    @functools.wraps(original)
    def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:  # noqa: ANN001
        return original(self, node, ep) and accepts(node)

    check_constraints.__wrapped__ = original
    return check_constraints


@contextlib.contextmanager
def patch_xnnpack_unsqueeze_dynamic_dims() -> Iterator[None]:
    """Keep ``unsqueeze_copy`` with more than one dynamic output dim out of XNNPACK (ExecuTorch runs it itself).

    executorch 1.5.1's ``UnsqueezeCopyConfig.check_constraints``
    (backends/xnnpack/partition/config/generic_node_configs.py) accepts any
    trailing unsqueeze, but the serialiser (``operators/op_squeeze.py``) then
    fails on an output with two symbolic dims: "XNNPACK reshape only supports 1
    dynamic dimension". Mamba 2's chunked scan unsqueezes ``[batch, chunks, …]``
    tensors (Mamba 2, Bamba, FalconH1, Zamba2 …). The view-copy config already
    refuses such shapes; this adds the same check to unsqueeze. Delete when the
    partitioner checks it itself.
    """
    from executorch.backends.xnnpack.partition.config.generic_node_configs import UnsqueezeCopyConfig

    original = vars(UnsqueezeCopyConfig)["check_constraints"]
    with swap_attr(UnsqueezeCopyConfig, "check_constraints", _refusing(original, _output_has_one_dynamic_dim)):
        yield


@contextlib.contextmanager
def patch_xnnpack_conv1d_dynamic_dims() -> Iterator[None]:
    """Keep a 1-D convolution with more than one dynamic dim out of XNNPACK (ExecuTorch's portable kernel runs it).

    XNNPACK has no 1-D convolution: executorch 1.5.1's ``Conv1dUnsqueezePass``
    (backends/xnnpack/_passes/conv1d_unsqueeze_pass.py) rewrites it as
    ``unsqueeze_copy(-1) -> 2-D convolution -> squeeze_copy(-1)``, and the
    serialiser (``operators/op_squeeze.py``) fails on those reshapes when the
    3-D activation has two symbolic dims: "XNNPACK reshape only supports 1
    dynamic dimension". ``ConvolutionConfig.check_constraints``
    (partition/config/gemm_configs.py) does not check it. Audio encoders hit it
    in the feature extractor and the positional convolution over ``[batch,
    channels, frames]`` (wav2vec2, HuBERT, WavLM, Data2VecAudio, SEW …). Delete
    when the partitioner checks it itself.
    """
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig

    original = vars(ConvolutionConfig)["check_constraints"]
    with swap_attr(ConvolutionConfig, "check_constraints", _refusing(original, _conv1d_reshapes_have_one_dynamic_dim)):
        yield


@contextlib.contextmanager
def patch_xnnpack_tanh_gelu() -> Iterator[None]:
    """Keep the tanh-approximated GELU out of XNNPACK (ExecuTorch's portable kernel computes it as asked).

    executorch 1.5.1's ``GeluConfig.check_constraints``
    (backends/xnnpack/partition/config/generic_node_configs.py) accepts
    ``gelu(approximate="tanh")``, but its serialiser (``operators/op_gelu.py``)
    drops ``approximate`` and XNNPACK computes the erf GELU: the tiny Gemma 2's
    logits then differ from eager by 8.7e-4 at logits of magnitude 1 (5e-4 at
    every position, 2.9e-6 once this patch keeps the op out). Models with
    ``hidden_act="gelu_pytorch_tanh"`` hit it (Gemma, Gemma 2/3, PaliGemma …).
    Delete when the partitioner checks ``approximate``.
    """
    from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig

    original = vars(GeluConfig)["check_constraints"]
    with swap_attr(GeluConfig, "check_constraints", _refusing(original, _is_exact_gelu)):
        yield


@contextlib.contextmanager
def patch_xnnpack_partitioner() -> Iterator[None]:
    """Enter every patch of this module: XNNPACK is given no reshape with two dynamic dims and only the erf GELU."""
    with patch_xnnpack_unsqueeze_dynamic_dims(), patch_xnnpack_conv1d_dynamic_dims(), patch_xnnpack_tanh_gelu():
        yield
