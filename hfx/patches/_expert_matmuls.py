"""The one matmul every dense expert patch runs: each expert's weight on its own rows, in one ``bmm``."""

from __future__ import annotations

import torch


def experts_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   *, transposed: bool = False) -> torch.Tensor:
    """``inputs (E, T, in)`` times each expert's ``weight`` (``(E, out, in)``, or ``(E, in, out)`` transposed).

    Expert ``e``'s ``F.linear`` on row ``e`` of ``inputs``, with its ``bias`` (``(E, out)``) where given.

    >>> experts_linear(torch.ones(2, 3, 4), torch.ones(2, 5, 4)).shape
    torch.Size([2, 3, 5])
    """
    weight = weight.to(inputs.dtype)
    output = torch.bmm(inputs, weight if transposed else weight.transpose(1, 2))
    return output if bias is None else output + bias.to(inputs.dtype)[:, None]
