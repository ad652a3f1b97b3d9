"""RWKV's WKV recurrence without a Python loop over the tokens.

transformers' CPU path (``rwkv_linear_attention_cpu``, transformers 5.x) steps through the prompt
with ``for current_index in range(seq_length)``, so ``torch.export`` unrolls it and pins the
sequence length; its dispatcher also branches on ``key.size(1) == 1``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from hfx.patches._core import defining_modules, source_contains, swap_attr


def _weighted_mean(logits: torch.Tensor, values: torch.Tensor, state_logit: torch.Tensor, state_num: torch.Tensor,
                   state_den: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Numerator, denominator (both scaled by ``exp(-max)``) and the max, over ``logits (b, t, i, c)`` and a state term."""
    peak = torch.maximum(logits.amax(dim=2), state_logit)
    weights = torch.exp(logits - peak[:, :, None])
    state_weight = torch.exp(state_logit - peak)
    numerator = (weights * values[:, None]).sum(dim=2) + state_weight * state_num[:, None]
    denominator = weights.sum(dim=2) + state_weight * state_den[:, None]
    return numerator, denominator, peak


def parallel_wkv(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 state: list[torch.Tensor] | None = None, return_state: bool = False
                 ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """transformers' ``rwkv_linear_attention`` (output and ``[num, den, max]`` state) for every token at once.

    Token ``t`` reads ``sum_i exp(k_i - (t - 1 - i) w) v_i + exp(u + k_t) v_t`` over the same sum without ``v``
    (``w = exp(time_decay)``, ``u = time_first``), plus the state decayed ``t`` steps: a per-channel softmax
    over earlier tokens with a linear decay, computed as a masked ``(tokens x tokens)`` table with the
    largest exponent taken out, as transformers' loop keeps its running ``max_state``. The returned state
    has transformers' representation (numerator and denominator scaled by ``exp(-max)``). Equal to the loop
    to float rounding; it holds ``batch x tokens x tokens x channels`` floats where the loop holds one token's.
    """
    length = key.shape[1]
    key32 = key.float()
    decay = torch.exp(time_decay.float())  # w > 0: each step multiplies by exp(-w)
    given = state is not None
    if state is None:
        zeros = torch.zeros_like(key32[:, 0])
        state = [zeros, zeros, zeros - 1e38]
    num_state, den_state, max_state = state
    steps = torch.arange(length, device=key.device, dtype=torch.float32)
    distance = steps[:, None] - 1 - steps[None, :]  # (t, i): steps between token i's write and token t's read
    logits = key32[:, None] - distance[None, :, :, None] * decay  # (b, t, i, c)
    diagonal = torch.eye(length, dtype=torch.bool, device=key.device)[None, :, :, None]
    logits = torch.where(diagonal, (time_first.float() + key32)[:, :, None], logits)
    later = (distance < -1)[None, :, :, None]
    logits = logits.masked_fill(later, float("-inf"))
    state_logits = max_state[:, None] - steps[None, :, None] * decay  # (b, t, c)
    numerator, denominator, _ = _weighted_mean(logits, value.float(), state_logits, num_state, den_state)
    output = (numerator / denominator).to(key.dtype)
    if not (return_state or given):
        return output, None
    # After the last token: every token decayed to step `length`, no bonus, and the state decayed `length` steps.
    final = key32[:, None] - (length - 1 - steps)[None, None, :, None] * decay  # (b, 1, i, c)
    final_state = (max_state - length * decay)[:, None]
    num, den, peak = _weighted_mean(final, value.float(), final_state, num_state, den_state)
    return output, [num[:, 0], den[:, 0], peak[:, 0]]


def _wkv_modules(model: torch.nn.Module) -> list[object]:
    """The modules of ``model``'s classes whose ``rwkv_linear_attention_cpu`` loops over the tokens."""
    return [module for module in defining_modules(model)
            if callable(loop := vars(module).get("rwkv_linear_attention_cpu"))
            and source_contains(loop, "for current_index in range(seq_length)")]


@contextlib.contextmanager
def patch_wkv_scan(model: torch.nn.Module) -> Iterator[None]:
    """Swap RWKV's ``rwkv_linear_attention`` for ``parallel_wkv`` in the modules of ``model``'s classes.

    Model pattern: RWKV's WKV loop over the prompt (``rwkv_linear_attention_cpu``, transformers 5.22-5.24),
    which pins the sequence under ``torch.export``, behind a ``key.size(1) == 1`` branch. The CUDA kernel
    path is not taken on CPU, and ``parallel_wkv`` gives the loop's values and state for one token or many.
    A no-op for other models. Delete when transformers' CPU WKV has no Python loop over time.

    Args:
        model: the model to export; only the modules defining its classes are patched.
    """
    with contextlib.ExitStack() as stack:
        for module in _wkv_modules(model):
            stack.enter_context(swap_attr(module, "rwkv_linear_attention", parallel_wkv))
        yield


@contextlib.contextmanager
def patch_rwkv_rescale_in_place(model: torch.nn.Module) -> Iterator[None]:
    """Trace RWKV without the in-place weight rescaling its first eval-mode forward does.

    Model pattern: ``RwkvModel.forward`` calls ``_rescale_layers()`` when ``training ==
    layers_are_rescaled``, dividing each block's output weights by ``2 ** (block_id // rescale_every)``
    in place, and then halves the hidden states every ``rescale_every`` blocks (transformers 5.22-5.24;
    a guard against float16 overflow). Traced, the division is a mutation of parameters: every run of
    the program would divide again, and ExecuTorch returns the mutated weights as extra outputs. Powers
    of two scale exactly, so ``rescale_every = 0`` for the block (the model's config, restored after)
    computes the same float32 values without mutating anything; a float16 export loses the guard. A
    model that has run in eval mode already holds rescaled weights and traces as it is. An exported
    torch program shares the model's weights: an eager eval-mode forward after the export rescales them
    under it (lowered programs hold their own copy). A no-op for other models. Delete when transformers
    rescales without mutating its weights.

    Args:
        model: the model to export; its RWKV base model's config is patched.
    """
    # only where the forward would rescale: after an eval-mode run the weights are rescaled already, and the
    # forward then halves the hidden states without touching them, which traces as it is
    configs = {id(m.config): m.config for m in model.modules()
               if callable(getattr(m, "_rescale_layers", None)) and getattr(m.config, "rescale_every", 0)
               and getattr(m, "layers_are_rescaled", None) == m.training}
    with contextlib.ExitStack() as stack:
        for config in configs.values():
            stack.enter_context(swap_attr(config, "rescale_every", 0))
        yield
