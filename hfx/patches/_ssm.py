"""Patches that let state-space models (Mamba and the hybrids built on its layers) export with dynamic shapes.

transformers' SSM code decides things in Python from the prompt length:
whether the conv state needs left padding, how many times to step Mamba's
selective scan, and how much to pad Mamba 2's chunked scan. ``torch.export``
turns these into guards on ``sequence`` (``sequence >= conv_kernel``,
``sequence == <traced length>``, ``sequence <= chunk_size``), and the export
then makes the axis static. These patches give the same computation a form
whose shapes do not depend on Python decisions. All are process-global while
active: do not run exports concurrently in threads.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from hfx.patches._core import Patch, swap_attr, swap_attr_on_each
from hfx.patches._lightning import patch_lightning_attention
from hfx.patches._wkv import patch_rwkv_rescale_in_place, patch_wkv_scan


def _prepadded_update_conv_state(original: Any) -> Any:
    """Wrap ``LinearAttentionLayer.update_conv_state`` so a prefill's conv input starts with ``kernel`` zeros."""

    @functools.wraps(original)
    def update_conv_state(self, conv_states, state_idx=0, conv_kernel_size=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        kernel = conv_kernel_size if conv_kernel_size is not None else self.conv_kernel_size.get(state_idx)
        if kernel is not None and not self.has_previous_state[state_idx] and not self.record_past:
            # ``length + kernel >= kernel`` for every length, so the original's ``length < kernel`` test is
            # statically false and leaves no guard; it caches the last ``kernel`` positions, zero-padded on
            # the left exactly as it pads a short prompt.
            conv_states = F.pad(conv_states, (kernel, 0))
        return original(self, conv_states, state_idx, conv_kernel_size=conv_kernel_size, **kwargs)

    update_conv_state.__wrapped__ = original
    return update_conv_state


@contextlib.contextmanager
def patch_linear_attention_conv_state() -> Iterator[None]:
    """Make the prefill's conv-state update of SSM / linear-attention cache layers traceable for any prompt length.

    ``LinearAttentionLayer.update_conv_state`` (transformers 5.x,
    ``cache_utils.py``, ``if ... full_conv_states.shape[-1] < self.conv_kernel_size[...]``)
    pads a prompt shorter than the conv kernel in a Python branch, which
    ``torch.export`` records as a ``sequence >= conv_kernel`` guard. The patch
    puts ``kernel`` zeros in front of every prefill first (``F.pad(x, (K, 0))``;
    a ``max(K - length, 0)`` pad leaves guards of its own), so the layer caches
    exactly the state it caches unpatched; the states it returns carry those
    zeros in front, and every caller in transformers 5.23 runs a causal conv
    over them and keeps the last ``length`` outputs, which are the same. Used by Mamba, Mamba 2,
    Jamba, Bamba, FalconH1, Zamba, NemotronH, LFM2, Qwen3-Next and every model
    whose cache layers derive from ``LinearAttentionLayer``. Delete when
    transformers writes that padding without a data-dependent branch. A no-op
    on transformers versions without ``LinearAttentionLayer``.
    """
    from transformers import cache_utils

    layer = getattr(cache_utils, "LinearAttentionLayer", None)
    if layer is None or "update_conv_state" not in vars(layer):
        yield
        return
    with swap_attr(layer, "update_conv_state", _prepadded_update_conv_state(vars(layer)["update_conv_state"])):
        yield


# The loop-free selective scan works in chunks of ``_CHUNK`` time steps. A prefill exported with an unbounded
# ``sequence`` takes prompts of up to ``DEFAULT_PREFIX_SCAN_LENGTH`` tokens (one more doubling step per
# doubling of it); ``hfx.export(bounds={"sequence": (1, n)})`` sets another bound.
_CHUNK = 16
DEFAULT_PREFIX_SCAN_LENGTH = 4096


def _discretized(
    hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,  # noqa: N803
    delta_bias: torch.Tensor | None, delta_softplus: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's per-step decays and inputs ``[b, d, L, n]``, and ``C`` as ``[b, L, n]``, computed as it does."""
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    discrete_A = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # noqa: N806
    discrete_B = dt[:, :, :, None] * B.transpose(1, 2)[:, None, :, :].float()  # noqa: N806
    return discrete_A, discrete_B * hidden_states[:, :, :, None].float(), C.transpose(1, 2)


def _gated(
    scan_output: torch.Tensor, hidden_states: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,  # noqa: N803
) -> torch.Tensor:
    """The reference's skip connection and gate, applied to the scan's ``[b, d, L]`` output."""
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    return scan_output


def _with_reference_signature(scan_of: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., Any]:
    """A ``mamba_selective_scan`` with transformers' signature around ``scan_of(decay, update, C, input_dtype)``.

    ``scan_of`` returns the ``[b, d, L]`` scan output and the last state; the
    discretisation before it and the skip connection and gate after it are the
    reference's own steps.
    """

    def selective_scan(
        hidden_states: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,  # noqa: N803 - transformers' names
        B: torch.Tensor,  # noqa: N803
        C: torch.Tensor,  # noqa: N803
        D: torch.Tensor | None = None,  # noqa: N803
        z: torch.Tensor | None = None,
        delta_bias: torch.Tensor | None = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        **kwargs: Any,
    ) -> Any:
        del kwargs  # use_mambapy / use_associative_scan: the reference ignores them while exporting
        discrete_A, deltaB_u, C = _discretized(hidden_states, dt, A, B, C, delta_bias, delta_softplus)  # noqa: N806
        scan_output, last_state = scan_of(discrete_A, deltaB_u, C, hidden_states.dtype)
        scan_output = _gated(scan_output, hidden_states, D, z)
        return (scan_output, last_state) if return_last_state else scan_output

    selective_scan.__name__ = selective_scan.__qualname__ = scan_of.__name__
    selective_scan.__doc__ = scan_of.__doc__
    return selective_scan


@_with_reference_signature
def scanned_selective_scan(
    discrete_A: torch.Tensor, deltaB_u: torch.Tensor, C: torch.Tensor, input_dtype: torch.dtype  # noqa: N803
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' reference ``mamba_selective_scan``, with its per-token Python loop as one ``scan`` op.

    Same arguments, same arithmetic step by step (the results are bitwise equal
    in eager torch); ``use_mambapy`` / ``use_associative_scan`` are ignored, as
    the reference does while exporting without mambapy installed. ONNX lowers
    the op to ``Scan``; ExecuTorch 1.5.1 and OpenVINO 2026.4 cannot lower it
    (see ``prefix_selective_scan``).

    Example:
        >>> b, d, n, length = 1, 2, 3, 4
        >>> out = scanned_selective_scan(torch.ones(b, d, length), torch.ones(b, d, length), -torch.ones(d, n),
        ...                              torch.ones(b, n, length), torch.ones(b, n, length))
        >>> out.shape
        torch.Size([1, 2, 4])
    """
    from torch._higher_order_ops.scan import scan

    def step(state: torch.Tensor, xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        decay, update, c = xs
        state = decay * state + update
        return state, torch.matmul(state.to(input_dtype), c.unsqueeze(-1))[:, :, 0]

    # The reference starts from zeros of the input dtype, promoted to float32 by the first step; the
    # scan's carry keeps one dtype, so it starts from the promoted zeros (the same values).
    dtype = torch.promote_types(torch.promote_types(discrete_A.dtype, input_dtype), deltaB_u.dtype)
    initial = discrete_A.new_zeros(discrete_A.shape[:2] + discrete_A.shape[3:], dtype=dtype)
    last_state, outputs = scan(step, initial, (discrete_A.permute(2, 0, 1, 3), deltaB_u.permute(2, 0, 1, 3), C.transpose(0, 1)))
    return outputs.permute(1, 2, 0), last_state


def padded_in_time(x: torch.Tensor, front: int, back: int = 0, fill: float = 0.0) -> torch.Tensor:
    """``x`` with ``front`` and ``back`` steps of ``fill`` along time (dim 2), whatever its rank."""
    return F.pad(x, (0, 0) * (x.ndim - 3) + (front, back), value=fill)


def _shifted(x: torch.Tensor, offset: int, fill: float) -> torch.Tensor:
    """``x`` moved ``offset`` steps later along time (dim 2), ``fill`` in front; the same length."""
    return padded_in_time(x, offset, fill=fill)[:, :, : x.shape[2]]


def _prefix_combined(
    decay: torch.Tensor, update: torch.Tensor, *, span: int, restart: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive scan of ``state_t = decay_t * state_{t-1} + update_t`` along dim 2 by doubling (Hillis-Steele).

    Each step combines a time step with the one ``offset`` earlier, for
    ``offset = 1, 2, 4 … < span``; ``restart`` (``[L]`` positions within a
    chunk) stops the combination at chunk starts. Returns the decay products
    and the states from a zero start.
    """
    offset = 1
    while offset < span:
        earlier_decay, earlier_update = _shifted(decay, offset, 1.0), _shifted(update, offset, 0.0)
        if restart is not None:
            same_chunk = (restart >= offset)[:, None]
            earlier_decay = torch.where(same_chunk, earlier_decay, 1.0)
            earlier_update = torch.where(same_chunk, earlier_update, 0.0)
        update = decay * earlier_update + update
        decay = decay * earlier_decay
        offset *= 2
    return decay, update


def _longest(length: int | torch.SymInt) -> int:
    """The largest value ``length`` takes: itself in eager, its export bound, else ``DEFAULT_PREFIX_SCAN_LENGTH``."""
    if not isinstance(length, torch.SymInt):
        return int(length)
    upper = length.node.shape_env.bound_sympy(length.node.expr).upper
    if not getattr(upper, "is_Integer", False):  # int_oo: the export did not bound the prompt
        torch._check(length <= DEFAULT_PREFIX_SCAN_LENGTH)  # noqa: SLF001 - the doubling steps cover this many
        return DEFAULT_PREFIX_SCAN_LENGTH
    return int(upper)


def _prefix_states(decay: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """Every state ``[b, d, L, n]`` of the recurrence from a zero start, without a loop over ``L``.

    Within chunks of ``_CHUNK`` steps, then across the chunk ends (a tensor
    ``_CHUNK`` times smaller), then each step's local state plus its decay times
    the state the previous chunks left: ``log2(_CHUNK)`` passes over the full
    tensor, and ``log2(longest / _CHUNK)`` over the chunk ends.
    """
    length = decay.shape[2]
    chunks = -(-_longest(length) // _CHUNK)  # the last chunk's carry combines the ends of all earlier ones
    position = torch.arange(length, device=decay.device)
    decay, update = _prefix_combined(decay, update, span=_CHUNK, restart=position % _CHUNK)
    # The last step of each chunk, taken from ``L + 2 * _CHUNK`` steps (identities at the end): always at
    # least two ends, as torch.export specialises a length that may be 1 (``numel() < 2`` in is_contiguous);
    # ``index_select``, as a strided slice's view guards on being contiguous too.
    ends = torch.arange(length // _CHUNK + 2, device=decay.device) * _CHUNK + (_CHUNK - 1)
    end_decay = F.pad(decay, (0, 0, 0, 2 * _CHUNK), value=1.0).index_select(2, ends)
    end_update = F.pad(update, (0, 0, 0, 2 * _CHUNK)).index_select(2, ends)
    _, end_states = _prefix_combined(end_decay, end_update, span=chunks)
    carried = F.pad(end_states, (0, 0, 1, 0)).index_select(2, position // _CHUNK)
    return update + decay * carried


@_with_reference_signature
def prefix_selective_scan(
    discrete_A: torch.Tensor, deltaB_u: torch.Tensor, C: torch.Tensor, input_dtype: torch.dtype  # noqa: N803
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' reference ``mamba_selective_scan`` as a loop-free parallel prefix scan (plain aten ops).

    The same recurrence ``h_t = exp(A dt_t) h_{t-1} + dt_t B_t x_t``,
    ``y_t = C_t . h_t``, summed in another order: within chunks of 16 steps by
    doubling, then across chunk ends (see ``_prefix_states``). The graph has no
    loop and no higher-order op, so ExecuTorch (XNNPACK) and OpenVINO lower it
    with a dynamic prompt length. The number of doubling steps follows the
    export's bound on the prompt length; an unbounded prompt gets
    ``DEFAULT_PREFIX_SCAN_LENGTH`` (4096), which the export then records.
    Results equal the reference to float rounding (~1e-6 relative), not bitwise. Memory: about six ``[b, d, L, n]`` float32
    tensors, where the reference keeps two.

    Example:
        >>> b, d, n, length = 1, 2, 3, 40
        >>> args = (torch.ones(b, d, length), torch.ones(b, d, length), -torch.ones(d, n),
        ...         torch.ones(b, n, length), torch.ones(b, n, length))
        >>> torch.allclose(prefix_selective_scan(*args), scanned_selective_scan(*args))
        True
    """
    states = _prefix_states(discrete_A, deltaB_u)
    return (states.to(input_dtype) * C[:, None]).sum(-1), states[:, :, -1]


def _modules_defining(model: torch.nn.Module, name: str) -> list[ModuleType]:
    """The Python modules of ``model``'s submodule classes that define a global ``name``, each once."""
    found: dict[str, ModuleType] = {}
    for module in model.modules():
        source = sys.modules.get(type(module).__module__)
        if source is not None and name in vars(source):
            found.setdefault(source.__name__, source)
    return list(found.values())


@contextlib.contextmanager
def patch_mamba_selective_scan(
    model: torch.nn.Module, *, selective_scan: Callable[..., Any] = prefix_selective_scan
) -> Iterator[None]:
    """Swap the per-token Python loop of Mamba's selective scan for ``selective_scan``, in ``model``'s modeling modules.

    transformers' reference ``mamba_selective_scan`` (5.x, ``modeling_mamba.py``
    ``for index in range(seq_len)``, copied into Jamba, FalconMamba and Zamba)
    unrolls over the prompt, so ``torch.export`` specialises ``sequence`` to the
    traced length (``Eq(sequence, 5)``). The default, ``prefix_selective_scan``,
    computes the recurrence as a loop-free parallel prefix scan that every hfx
    runtime lowers with a dynamic length (to float rounding of the reference);
    ``scanned_selective_scan`` keeps the reference's arithmetic bitwise in one
    ``torch.ops.higher_order.scan`` op, which only the torch program and ONNX
    (``Scan``) lower: ExecuTorch 1.5.1 fails in its edge passes, OpenVINO 2026.4
    has no conversion for ``scan``. Delete when transformers' torch path stops
    looping in Python while exporting (its ``associative_scan`` branch is
    disabled under ``torch.export``).

    Args:
        model: the model whose modeling modules define ``mamba_selective_scan``.
        selective_scan: the function swapped in (same signature as transformers').
    """
    with swap_attr_on_each(_modules_defining(model, "mamba_selective_scan"), "mamba_selective_scan", selective_scan):
        yield


def _chunk_aligned(original: Any) -> Any:
    """Wrap a ``mamba2_chunk_scan`` so it receives a whole number of chunks and never pads itself."""

    @functools.wraps(original)
    def mamba2_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,  # noqa: ANN001, N803, PLR0913
                          dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):  # noqa: ANN001, ANN003, ANN202
        # The original's own steps, done first so that the padded time steps stay exactly 0 (no decay):
        # the padding then holds the zeros the original pads with, and its ``pad_size`` is statically 0.
        if dt_bias is not None:
            dt = dt + dt_bias.to(dt.dtype)
        if dt_softplus:
            dt = F.softplus(dt)
        dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
        # Whole chunks, at least two: ``ceil(length / chunk) + 1``, written as one floor division so the
        # export can prove the padded length splits into them. A trace with one chunk would specialise to
        # it (ops test ``chunks == 1``); the all-padding chunk adds only exact zeros.
        length = hidden_states.shape[1]
        pad = (length + 2 * chunk_size - 1) // chunk_size * chunk_size - length
        hidden_states, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (hidden_states, B, C))  # noqa: N806
        result = original(hidden_states, F.pad(dt, (0, 0, 0, pad)), A, B, C, chunk_size, D=D, dt_bias=None,
                          initial_states=initial_states, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=return_final_states, **kwargs)
        # ``index_select``, not a slice: a slice's view is contiguous only when nothing was padded, and the
        # caller's ``reshape`` would guard on that.
        keep = torch.arange(length, device=hidden_states.device)
        if return_final_states:
            return result[0].index_select(1, keep), result[1]
        return result.index_select(1, keep)

    mamba2_chunk_scan.__wrapped__ = original
    return mamba2_chunk_scan


@contextlib.contextmanager
def patch_mamba2_chunk_scan(model: torch.nn.Module) -> Iterator[None]:
    """Give Mamba 2's chunked scan a prompt padded to whole chunks, in ``model``'s modeling modules.

    transformers' torch ``mamba2_chunk_scan`` (5.x, ``modeling_mamba2.py``, copied
    into Bamba, FalconH1, GraniteMoeHybrid, NemotronH and Zamba2) pads the prompt
    by ``(chunk - length % chunk) % chunk``, reshapes with ``-1`` and tests
    ``if pad_size > 0``: ``torch.export`` cannot prove the padded length divides
    into chunks and guards on the number of chunks and on ``length % chunk``.
    The wrapper applies the time-step bias, softplus and clamp as the original
    does, pads to ``ceil(length / chunk) + 1`` whole chunks (a length the export
    knows is a multiple, and never one chunk, which ops would specialise to),
    and calls the original with the padded values it would have built (padded
    steps have ``dt = 0``, so they do not decay the state). Outputs are bitwise
    the original's; the final state can differ in the last bit (one more,
    all-zero term in the inter-chunk sum). Delete when that padding is written
    without a data-dependent branch upstream.
    """
    with contextlib.ExitStack() as stack:
        for source in _modules_defining(model, "mamba2_chunk_scan"):
            stack.enter_context(swap_attr(source, "mamba2_chunk_scan", _chunk_aligned(vars(source)["mamba2_chunk_scan"])))
        yield


def prefix_rnn_scan(
    self: torch.nn.Module, hidden_states: torch.Tensor, recurrent_gate: torch.Tensor, reset: torch.Tensor,
    recurrent_states: torch.Tensor | None, acc_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RecurrentGemma's ``RecurrentGemmaRglru._rnn_scan`` as a loop-free prefix scan (``_prefix_states``).

    The same diagonal recurrence ``h_t = a_t h_{t-1} + x_t`` (``a`` zero at a reset), from
    ``recurrent_states`` or zeros, summed in another order; the results equal the reference's to float
    rounding. One form for every length: the reference's one-token branch gives the same values.

    Example:
        >>> x, a = torch.rand(2, 5, 3), torch.rand(2, 5, 3)
        >>> reset = torch.zeros(2, 5, 1, dtype=torch.bool)
        >>> states, last = prefix_rnn_scan(None, x, a, reset, None)
        >>> torch.allclose(states[:, 1], a[:, 1] * x[:, 0] + x[:, 1]) and torch.equal(last, states[:, -1])
        True
    """
    del self
    gate = (recurrent_gate * ~reset).to(acc_dtype)
    inputs = hidden_states.to(acc_dtype)
    if recurrent_states is not None:  # fold the state before the prompt into its first step (a mask: no n - 1 slice)
        first = torch.arange(inputs.shape[1], device=inputs.device)[None, :, None] == 0
        inputs = inputs + first * (gate * recurrent_states[:, None].to(gate))
    states = _prefix_states(gate.transpose(1, 2)[..., None], inputs.transpose(1, 2)[..., None])[..., 0].transpose(1, 2)
    return states.to(hidden_states.dtype), states[:, -1]


@contextlib.contextmanager
def patch_rglru_scan(model: torch.nn.Module) -> Iterator[None]:
    """Swap RecurrentGemma's per-token ``_rnn_scan`` loop for ``prefix_rnn_scan`` on ``model``'s RG-LRU classes.

    ``RecurrentGemmaRglru._rnn_scan`` (transformers 5.x, ``modeling_recurrent_gemma.py``, ``for t in
    range(hidden_states.shape[1])``) unrolls over the prompt, so ``torch.export`` makes ``sequence`` static, and
    its ``shape[1] == 1`` branch guards on it. Steps aside for a model without such a class. Delete when
    transformers' RG-LRU scans without a Python loop over time.
    """
    classes = {type(m) for m in model.modules() if "_rnn_scan" in vars(type(m)) and type(m).__name__.endswith("Rglru")}
    with contextlib.ExitStack() as stack:
        for cls in classes:
            stack.enter_context(swap_attr(cls, "_rnn_scan", prefix_rnn_scan))
        yield


def ssm_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the SSM patches for ``model``, ready for ``with_patches`` (no-ops for a model without SSM layers).

    Args:
        model: the model to export; the scan patches are bound to it.

    Returns:
        ``patch_linear_attention_conv_state``, then ``patch_mamba_selective_scan``, ``patch_mamba2_chunk_scan``,
        ``patch_rglru_scan``, ``patch_wkv_scan``, ``patch_rwkv_rescale_in_place`` and ``patch_lightning_attention``
        bound to ``model``.

    Example:
        >>> [getattr(p, "func", p).__name__ for p in ssm_patches(torch.nn.Linear(1, 1))]
        ['patch_linear_attention_conv_state', 'patch_mamba_selective_scan', 'patch_mamba2_chunk_scan', 'patch_rglru_scan', 'patch_wkv_scan', 'patch_rwkv_rescale_in_place', 'patch_lightning_attention']
    """
    bound = tuple(functools.partial(patch, model)
                  for patch in (patch_mamba_selective_scan, patch_mamba2_chunk_scan, patch_rglru_scan, patch_wkv_scan,
                                patch_rwkv_rescale_in_place, patch_lightning_attention))
    return (patch_linear_attention_conv_state, *bound)
