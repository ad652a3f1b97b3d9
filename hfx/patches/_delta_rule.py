"""Gated delta rules whose prompt length stays dynamic in ``torch.export`` (Qwen3-Next, Qwen3.5, Kimi-Linear ...).

transformers' torch path of the chunked gated delta rule (``torch_chunk_gated_delta_rule``,
``modeling_qwen3_next.py`` in 5.22-5.24, copied into Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid and
Qwen4-Exp) pads the prompt to whole chunks of 64 with ``(chunk - length % chunk) % chunk``
and passes the recurrent state from chunk to chunk in a Python loop,
``for i in range(num_chunks)``. ``torch.export`` cannot prove the padded length splits into
chunks, and it unrolls the loop for the traced number of chunks, so the sequence axis comes
out static (``axis 1 of input 'input_ids' is static 7, got 11``). The patch swaps in
``prefix_chunk_gated_delta_rule``: the same chunked algorithm, with the prompt padded to a
length the export knows is whole chunks and the loop over chunks replaced by a parallel
prefix scan over the chunks' affine state updates. Kimi-Linear's and Bailing-Hybrid's
``chunk_kimi_delta_attention``, the same rule with one decay per key channel, has the same
padding and loop, and its prefix form ``prefix_chunk_kimi_delta_attention``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import swap_attr_on_each
from hfx.patches._ssm import _longest, _modules_defining, _shifted, padded_in_time


def _l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x`` over the root of its squared last axis plus ``eps``, as transformers' ``l2norm`` (the FLA library's)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def unit_lower_inverse(strict: torch.Tensor) -> torch.Tensor:
    """The inverse of ``I + strict`` for strictly lower triangular ``[..., C, C]`` matrices, by repeated squaring.

    ``strict`` is nilpotent (``strict ** C == 0``), so ``(I + strict)^-1 = sum_k (-strict)^k = (I + N)(I + N^2)
    (I + N^4) ...`` with ``N = -strict``: ``2 log2(C)`` matrix products, where transformers' export path runs a
    forward substitution of ``C - 1`` row updates and its eager path ``torch.linalg.solve_triangular``.

    Example:
        >>> strict = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [0.25, -1.0, 0.0]])
        >>> eye = torch.eye(3)
        >>> torch.allclose(unit_lower_inverse(strict) @ (eye + strict), eye)
        True
    """
    size = strict.shape[-1]
    eye = torch.eye(size, dtype=strict.dtype, device=strict.device)
    power = -strict
    inverse = eye + power
    span = 2
    while span < size:
        power = power @ power
        inverse = inverse @ (eye + power)
        span *= 2
    return inverse


def chunk_states(transition: torch.Tensor, update: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """The state ``[b, h, n, dk, dv]`` that enters each chunk of ``S_{i+1} = transition_i @ S_i + update_i``.

    ``transition`` ``[b, h, n, dk, dk]``, ``update`` ``[b, h, n, dk, dv]``, ``S_0 = initial``. An inclusive scan by
    doubling (Hillis-Steele) over the chunk axis: ``log2`` of the most chunks the export allows steps, whatever
    the prompt's length; each combines a chunk with the one ``offset`` earlier, ``(A, B) . (A', B') = (A A', A B' + B)``.

    Example:
        >>> a, b, s = torch.rand(1, 1, 5, 2, 2), torch.rand(1, 1, 5, 2, 3), torch.rand(1, 1, 2, 3)
        >>> states, loop = chunk_states(a, b, s), [s]
        >>> for i in range(4):
        ...     loop.append(a[:, :, i] @ loop[-1] + b[:, :, i])
        >>> torch.allclose(states, torch.stack(loop, dim=2))
        True
    """
    chunks = transition.shape[2]
    eye = torch.eye(transition.shape[-1], dtype=transition.dtype, device=transition.device)
    index = torch.arange(chunks, device=eye.device)[:, None, None]
    # The first chunk starts from ``initial``: fold it into its update, then every state is an update. Masks
    # over all ``n`` chunks, not slices of ``n - 1``: the export would guard on ``n - 1 != 1``.
    update = update + (index == 0) * (transition @ initial[:, :, None])
    offset = 1
    while offset < _longest(chunks):
        # Chunks before ``offset`` have nothing earlier: the identity transition and no update.
        earlier_transition = _shifted(transition, offset, 0.0) + eye * (index < offset)
        update = transition @ _shifted(update, offset, 0.0) + update
        transition = transition @ earlier_transition
        offset *= 2
    # Entering chunk i is the state after chunk i - 1.
    return _shifted(update, 1, 0.0) + (index == 0) * initial[:, :, None]


def _chunked_inputs(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    chunk_size: int, normalize: bool,
) -> tuple[torch.Tensor, ...]:
    """The references' first steps: heads first in float32, query and key normalised (when asked), the query scaled,
    the prompt padded to ``ceil(L / chunk) + 1`` whole chunks (see ``prefix_chunk_gated_delta_rule``) and split
    into them. Returns ``query``, ``key``, ``k_beta``, ``v_beta`` ``[b, h, n, C, d]`` and ``g`` ``[b, h, n, C(, dk)]``."""
    length = key.shape[1]
    query, key, value, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
    if normalize:
        query, key = _l2_normalized(query), _l2_normalized(key)
    query = query * query.shape[-1] ** -0.5
    pad = (length + 2 * chunk_size - 1) // chunk_size * chunk_size - length
    query, key, value, beta, g = (padded_in_time(x, 0, pad) for x in (query, key, value, beta, g))
    v_beta, k_beta = value * beta[..., None], key * beta[..., None]
    chunked = (x.reshape(x.shape[0], x.shape[1], -1, chunk_size, *x.shape[3:]) for x in (query, key, k_beta, v_beta, g))
    return tuple(chunked)


def _initial_state(initial_state: torch.Tensor | None, like: torch.Tensor, value_dim: int) -> torch.Tensor:
    """The state before the prompt: the given one in float32, else zeros ``[b, h, dk, dv]``."""
    if initial_state is not None:
        return initial_state.to(like)
    return like.new_zeros(like.shape[0], like.shape[1], like.shape[-1], value_dim)


def _outputs(
    core: torch.Tensor, states: torch.Tensor, length: int, dtype: torch.dtype, final_state: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked output ``[b, h, n, C, dv]`` as the references return it, ``[b, L, h, dv]`` in ``dtype``, and the
    state the prompt leaves (the one entering the last chunk, all padding) when asked."""
    # ``index_select``, not a slice: a slice's view is contiguous only when nothing was padded.
    keep = torch.arange(length, device=core.device)
    core = core.reshape(core.shape[0], core.shape[1], -1, core.shape[-1]).index_select(2, keep)
    return core.transpose(1, 2).to(dtype).contiguous(), states[:, :, -1] if final_state else None


def _with_reference_signature(core: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., Any]:
    """A chunked delta rule with transformers' signature around ``core(query, key, k_beta, v_beta, decay, initial)``.

    ``core`` gets the chunked inputs of ``_chunked_inputs`` and the state before the prompt, and returns the chunked
    output and the state entering each chunk; the steps before and after it are the references' own.
    """

    def rule(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        chunk_size: int = 64,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        del kwargs  # cu_seqlens: the references' torch paths ignore it too
        dtype, length = query.dtype, query.shape[1]
        # transformers 5.24's gated delta rule takes one query / key head per group of value heads and repeats
        # them itself; 5.22 and 5.23 repeat them before the call, so this is a no-op there.
        groups = value.shape[2] // key.shape[2]
        if groups > 1:
            query, key = query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2)
        chunked = _chunked_inputs(query, key, value, g, beta, chunk_size, use_qk_l2norm_in_kernel)
        core_output, states = core(*chunked, _initial_state(initial_state, chunked[1], value.shape[-1]))
        return _outputs(core_output, states, length, dtype, output_final_state)

    rule.__name__ = rule.__qualname__ = core.__name__
    rule.__doc__ = core.__doc__
    return rule


@_with_reference_signature
def prefix_chunk_gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, k_beta: torch.Tensor, v_beta: torch.Tensor, decay: torch.Tensor,
    initial: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``torch_chunk_gated_delta_rule`` with a prompt length ``torch.export`` keeps dynamic.

    Same arguments and results (to float32 rounding): ``query`` / ``key`` ``[b, L, h, dk]``, ``value``
    ``[b, L, h, dv]``, ``g`` (log decay) and ``beta`` ``[b, L, h]``, ``chunk_size``, ``initial_state``,
    ``output_final_state``, ``use_qk_l2norm_in_kernel``; returns the output ``[b, L, h, dv]`` and, with
    ``output_final_state``, the state ``[b, h, dk, dv]``. The reference's steps, in another form:

    * the prompt is padded to ``ceil(L / chunk) + 1`` whole chunks, one floor division the export can prove
      divisible (the ``+ 1``: a trace with one chunk would specialise to it); padded steps have ``beta = 0``
      and ``g = 0``, so they neither write nor decay the state, as the reference's zero padding;
    * the intra-chunk system ``I + strict`` is inverted by repeated squaring (``unit_lower_inverse``);
    * the loop over chunks, ``S_{i+1} = S_i d_i + K_i^T (U_i - W_i S_i)``, is the affine recurrence
      ``S_{i+1} = (d_i I - K_i^T W_i) S_i + K_i^T U_i`` scanned in parallel (``chunk_states``).

    Example:
        >>> b, length, h, dk, dv = 1, 5, 2, 4, 3
        >>> q, k, v = torch.randn(b, length, h, dk), torch.randn(b, length, h, dk), torch.randn(b, length, h, dv)
        >>> g, beta = -torch.rand(b, length, h), torch.rand(b, length, h)
        >>> out, state = prefix_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=2, output_final_state=True)
        >>> (out.shape, state.shape)
        (torch.Size([1, 5, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    chunk_size = query.shape[-2]
    cum_decay = decay.cumsum(dim=-1)  # one decay per head: [b, h, n, C]
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise_decay = (cum_decay[..., :, None] - cum_decay[..., None, :]).masked_fill(upper, float("-inf")).exp()
    inverse = unit_lower_inverse(((k_beta @ key.transpose(-1, -2)) * pairwise_decay).tril(-1))
    intra_chunk = (query @ key.transpose(-1, -2)) * pairwise_decay
    new_values, k_cumdecay = inverse @ v_beta, inverse @ (k_beta * cum_decay.exp()[..., None])
    key_t = (key * (cum_decay[..., -1:] - cum_decay).exp()[..., None]).transpose(-1, -2)
    eye = torch.eye(key.shape[-1], dtype=key.dtype, device=key.device)
    states = chunk_states(cum_decay[..., -1].exp()[..., None, None] * eye - key_t @ k_cumdecay, key_t @ new_values, initial)
    core = (query * cum_decay.exp()[..., None]) @ states + intra_chunk @ (new_values - k_cumdecay @ states)
    return core, states


@_with_reference_signature
def prefix_chunk_kimi_delta_attention(
    query: torch.Tensor, key: torch.Tensor, k_beta: torch.Tensor, v_beta: torch.Tensor, decay: torch.Tensor,
    initial: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``chunk_kimi_delta_attention`` (Kimi-Linear, Bailing-Hybrid) with a dynamic prompt length.

    The gated delta rule with one decay per key channel, ``g`` ``[b, L, h, dk]``: the steps of
    ``prefix_chunk_gated_delta_rule``, with the chunk's state transition ``diag(d_i) - K_i^T W_i``.

    Example:
        >>> b, length, h, dk, dv = 1, 5, 2, 4, 3
        >>> q, k, v = torch.randn(b, length, h, dk), torch.randn(b, length, h, dk), torch.randn(b, length, h, dv)
        >>> g, beta = -torch.rand(b, length, h, dk), torch.rand(b, length, h)
        >>> out, state = prefix_chunk_kimi_delta_attention(q, k, v, g, beta, chunk_size=2, output_final_state=True)
        >>> (out.shape, state.shape)
        (torch.Size([1, 5, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    chunk_size = query.shape[-2]
    cum_decay = decay.cumsum(dim=-2)  # one decay per key channel: [b, h, n, C, dk]
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise_decay = (cum_decay[..., :, None, :] - cum_decay[..., None, :, :]).masked_fill(upper[..., None], float("-inf")).exp()
    inverse = unit_lower_inverse((k_beta[..., :, None, :] * key[..., None, :, :] * pairwise_decay).sum(-1).tril(-1))
    intra_chunk = (query[..., :, None, :] * key[..., None, :, :] * pairwise_decay).sum(-1)
    new_values, k_cumdecay = inverse @ v_beta, inverse @ (k_beta * cum_decay.exp())
    key_t = (key * (cum_decay[..., -1:, :] - cum_decay).exp()).transpose(-1, -2)
    eye = torch.eye(key.shape[-1], dtype=key.dtype, device=key.device)
    chunk_decay = cum_decay[..., -1, :].exp()[..., :, None] * eye  # diag(d)
    states = chunk_states(chunk_decay - key_t @ k_cumdecay, key_t @ new_values, initial)
    core = (query * cum_decay.exp()) @ states + intra_chunk @ (new_values - k_cumdecay @ states)
    return core, states


# The reference functions, by module-level name, and what the patch swaps in for each.
PREFIX_FORMS: dict[str, Any] = {
    "torch_chunk_gated_delta_rule": prefix_chunk_gated_delta_rule,
    "chunk_kimi_delta_attention": prefix_chunk_kimi_delta_attention,
}


@contextlib.contextmanager
def patch_gated_delta_rule_chunk_scan(model: torch.nn.Module) -> Iterator[None]:
    """Swap the chunked gated delta rules in ``model``'s modeling modules for their prefix forms (``PREFIX_FORMS``).

    ``torch_chunk_gated_delta_rule`` (Qwen3-Next and its copies) and ``chunk_kimi_delta_attention``
    (Kimi-Linear, Bailing-Hybrid): the module's docstring says why. Outputs equal the references' to float32
    rounding, not bitwise (another order of the same sums). Delete when transformers' torch paths pad without
    ``length % chunk`` and stop looping over chunks in Python while exporting.
    """
    with contextlib.ExitStack() as stack:
        for name, prefix_form in PREFIX_FORMS.items():
            stack.enter_context(swap_attr_on_each(_modules_defining(model, name), name, prefix_form))
        yield


def delta_rule_patches(model: torch.nn.Module) -> tuple[Any, ...]:
    """``patch_gated_delta_rule_chunk_scan`` bound to ``model``, ready for ``with_patches``."""
    return (functools.partial(patch_gated_delta_rule_chunk_scan, model),)
