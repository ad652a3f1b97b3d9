"""MBart-style ``shift_tokens_right`` without in-place writes, for runtimes that mis-convert them.

MBart, PLBart and PP-FormulaNet (transformers 5.22-5.24) build the decoder inputs of a forward
without ``decoder_input_ids`` by rotating each row's last non-pad token to the front, in place:
``prev_output_tokens[:, 1:] = prev_output_tokens[:, :-1].clone()`` then
``prev_output_tokens[:, 0] = ...gather(1, index_of_eos).squeeze()``. OpenVINO 2026.4 compiles the
traced writes into a model that fails at another batch ("ParameterMismatch: Can not clone with new
dims. Descriptor's shape: {1} is incompatible with provided dimensions: {3}").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from hfx.patches._core import defining_modules, source_contains, swap_item

_PATTERN = "prev_output_tokens[:, 0] = decoder_start_tokens"


def rotated_decoder_inputs(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Each row's last non-pad token, then the row without its last token: MBart's ``shift_tokens_right``.

    >>> rotated_decoder_inputs(torch.tensor([[5, 6, 2, 1]]), pad_token_id=1)
    tensor([[2, 5, 6, 2]])
    """
    if pad_token_id is None:
        msg = "self.model.config.pad_token_id has to be defined."  # transformers' own message
        raise ValueError(msg)
    tokens = input_ids.masked_fill(input_ids == -100, pad_token_id)  # labels' ignored positions
    last = (tokens.ne(pad_token_id).sum(dim=1) - 1).unsqueeze(-1)
    return torch.cat([tokens.gather(1, last), tokens[:, :-1]], dim=1)


@contextlib.contextmanager
def patch_functional_token_shift(model: torch.nn.Module) -> Iterator[None]:
    """Run MBart-style ``shift_tokens_right`` as ``rotated_decoder_inputs`` (no in-place writes) in the block.

    Model pattern: a module-level ``shift_tokens_right`` that writes the rotated token into
    ``prev_output_tokens[:, 0]`` (MBart, PLBart, PP-FormulaNet; transformers 5.22-5.24). The same
    tokens; a no-op for other models. Delete when OpenVINO converts the in-place form.

    Args:
        model: the model to export; the modules that define its classes are patched.
    """
    spaces = [vars(module) for module in defining_modules(model)
              if source_contains(vars(module).get("shift_tokens_right"), _PATTERN)]
    with contextlib.ExitStack() as stack:
        for space in spaces:
            stack.enter_context(swap_item(space, "shift_tokens_right", rotated_decoder_inputs))
        yield
