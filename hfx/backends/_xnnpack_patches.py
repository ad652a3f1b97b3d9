"""Patches of ExecuTorch's XNNPACK partitioner that ``lower_to_pte`` enters while it lowers a program."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches import swap_attr


def _dynamic_dims(node: torch.fx.Node) -> int:
    """How many dims of ``node``'s output are symbolic."""
    val = node.meta.get("val")
    return sum(isinstance(size, torch.SymInt) and not size.node.is_constant() for size in getattr(val, "shape", ()))


def _with_one_dynamic_dim(original: Any) -> Any:
    """Wrap a config's ``check_constraints`` so it also refuses an output with more than one dynamic dim."""

    @functools.wraps(original)
    def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:  # noqa: ANN001
        return original(self, node, ep) and _dynamic_dims(node) <= 1

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
    with swap_attr(UnsqueezeCopyConfig, "check_constraints", _with_one_dynamic_dim(original)):
        yield
