"""A patch of torch's SDPA decomposition that ``lower_to_pte`` enters while ExecuTorch decomposes a program.

Nothing here imports executorch; the patch swaps an entry of torch's own decomposition table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm

from hfx.patches import swap_item

_FLASH_FOR_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def laid_out_like(tensor: torch.Tensor, like: torch.Tensor, /) -> torch.Tensor:
    """``tensor``'s values in the memory layout ``torch.empty_like(like)`` has (its dims in the same stride order).

    Example:
        >>> like = torch.zeros(2, 7, 4, 16).transpose(1, 2)
        >>> laid_out_like(torch.ones(2, 4, 7, 16), like).stride() == like.stride()
        True
    """
    physical, _ = compute_elementwise_output_logical_to_physical_perm(like)
    logical = [physical.index(dim) for dim in range(len(physical))]
    return tensor.permute(physical).contiguous().permute(logical)


def flash_attention_for_cpu_like_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,  # noqa: FBT001, FBT002 - the op's own schema
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` decomposed to the math kernel, output laid out like ``query``.

    The kernel and its meta function return ``empty_like(query)``; torch's own
    decomposition (torch/_decomp/decompositions.py) returns the layout of
    ``nn.MultiheadAttention``'s queries, (L, N, H, E), whatever the query's is.
    """
    torch._check(dropout_p == 0.0, lambda: f"dropout probability must be zero, got {dropout_p}")
    output, attn = torch.ops.aten._scaled_dot_product_attention_math.default(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        dropout_mask=None,
        scale=scale,
        enable_gqa=query.size(1) != key.size(1),
    )
    return laid_out_like(output, query), attn


@contextlib.contextmanager
def patch_sdpa_decomposition_layout() -> Iterator[None]:
    """Decompose CPU flash attention into a tensor laid out as the kernel lays it out, while ExecuTorch lowers.

    ExecuTorch's ``to_edge`` (executorch 1.5.1) decomposes
    ``scaled_dot_product_attention`` through ``_scaled_dot_product_flash_attention_for_cpu``,
    whose decomposition in torch 2.13 (torch/_decomp/decompositions.py) returns an
    (L, N, H, E) memory layout, while the kernel and its meta function (what
    ``torch.export`` traced) lay the output out like the query. Hugging Face
    attention views (N, L, H, E) as (N, H, L, E), so ``transpose(1, 2).contiguous()``
    after SDPA was a no-op at export and left no node, and a later ``view`` is legal
    on the traced layout only: ``transformers.pytorch_utils.Conv1D``
    (``x.view(-1, x.size(-1))``; GPT-2, ImageGPT, OpenAI GPT, Decision Transformer,
    CLVP) failed with "Cannot view a tensor with shape [batch, sequence, 64] and
    strides (64, 64*batch, 1)" (pytorch/pytorch#141107, #136543); models that
    ``reshape`` instead (Llama) lowered. This swaps the table entry, which
    ExecuTorch reads when it builds its table, for one whose output follows the
    query's layout as the kernel's does (for ``nn.MultiheadAttention``'s queries that
    is torch's layout). Delete when torch's decomposition keeps the kernel's layout.
    """
    from torch._decomp import decomposition_table

    with swap_item(decomposition_table, _FLASH_FOR_CPU, flash_attention_for_cpu_like_query):
        yield

