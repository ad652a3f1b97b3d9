"""The size conditions the model's own code branched on while torch.export traced it.

A deferred export (``prefer_deferred_runtime_asserts_over_guards``) keeps every
condition on input sizes that torch can neither prove over a dim's range nor
state as one as a runtime assert. Two kinds land there alike. torch's own
operators decide things about sizes (is this slice the whole input, is this
size 1): ``Ne(sequence, 4)`` for ``x[:, :sequence // 4 * 4]``; the graph computes
the same either way, and hfx drops them. The model's code branches on sizes
(Swin pads an odd feature map, ``if height % 2 == 1``; it shifts its windows only
above the window size): traced at 64 px, the program is Swin's at 64 px alone.
What tells them apart is where torch met the condition: the first frame outside
torch's symbolic-shape plumbing (as ``ShapeEnv._get_user_frame`` finds it) lies inside torch's
own package, or not. ``recording_branches`` records the conditions met outside.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def recording_branches() -> Iterator[list[Any]]:
    """Record, while inside, each condition on sizes torch adds as a guard or runtime assert from code outside
    torch (the model's, or a patch's): sympy expressions, in order.

    Records nothing (the list stays empty) where torch lacks what this reads
    (``ShapeEnv._log_guard``, ``uninteresting_files``: torch 2.13-2.14); hfx then treats
    every such assert as torch's own, as before.
    """
    from torch.fx.experimental import symbolic_shapes

    found: list[Any] = []
    original = symbolic_shapes.ShapeEnv.__dict__.get("_log_guard")
    plumbing = getattr(symbolic_shapes, "uninteresting_files", None)
    if original is None or plumbing is None:
        yield found
        return
    torch_dir = os.path.dirname(torch.__file__) + os.sep

    def logged(self: Any, prefix: str, condition: Any, forcing_spec: bool) -> Any:  # noqa: FBT001 - torch's
        frame = sys._getframe(1)  # noqa: SLF001 - the caller's; as ShapeEnv._get_user_frame, past the plumbing
        skipped = plumbing()
        while frame is not None and frame.f_code.co_filename in skipped:
            frame = frame.f_back
        try:
            if frame is not None and not frame.f_code.co_filename.startswith(torch_dir):
                found.append(condition)
        finally:
            del frame
        return original(self, prefix, condition, forcing_spec)

    symbolic_shapes.ShapeEnv._log_guard = logged  # noqa: SLF001
    try:
        yield found
    finally:
        symbolic_shapes.ShapeEnv._log_guard = original  # noqa: SLF001
