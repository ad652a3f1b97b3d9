"""Patches for single architectures of the zoo, each naming the model pattern it works around.

Each patch is a context-manager factory bound to the model (``functools.partial(patch, model)``) and a
no-op for a model without the pattern. All are process-global while active: do not run exports
concurrently in threads.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from hfx.patches._core import Patch, swap_attr, swap_attr_on_each, swap_item
from hfx.patches._core import defining_modules as _defining_modules
from hfx.patches._core import source_contains as _source_contains
from hfx.patches._global_attention import patch_dense_global_attention
from hfx.patches._padded_images import patch_padded_image_batch
from hfx.patches._deepstack import patch_deepstack_gather
from hfx.patches._pixel_shuffle import patch_integer_pixel_shuffle
from hfx.patches._eos_pooling import patch_eos_pooling_gather
from hfx.patches._pooling import patch_covering_average_pool
from hfx.patches._step_positions import patch_symbolic_step_positions
from hfx.patches._chunk_loops import patch_one_chunk_loops
from hfx.patches._conv_padding import patch_integer_conv_padding
from hfx.patches._token_shift import patch_functional_token_shift
from hfx.patches._unconditional_pads import patch_unconditional_swin_pads, patch_upsampled_to_input_length


def always_interpolated_positions(self: torch.nn.Module, embeddings: torch.Tensor, height: int,
                                  width: int) -> torch.Tensor:
    """Position embeddings (class token first) resampled bicubically to the ``height x width`` patch grid.

    The same computation as DINOv2's ``interpolate_pos_encoding`` without its early return; at the
    trained size the bicubic resampling (``align_corners=False``, scale 1) is exactly the identity.
    """
    del embeddings
    positions = self.position_embeddings
    grid = positions[:, 1:]
    side = int(grid.shape[1] ** 0.5)
    patch_height, patch_width = self.patch_embeddings.patch_size
    grid = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    # Resample in float32 like transformers: bicubic in half precision shifts the embeddings.
    grid = F.interpolate(grid.to(torch.float32), size=(height // patch_height, width // patch_width),
                         mode="bicubic", align_corners=False).to(positions.dtype)
    return torch.cat((positions[:, :1], grid.permute(0, 2, 3, 1).flatten(1, 2)), dim=1)


def _interpolating_embedding_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The DINOv2-style embedding classes in ``model``: an ``interpolate_pos_encoding`` with a shortcut."""
    from transformers.models.dinov2 import modeling_dinov2

    known = (modeling_dinov2.Dinov2Embeddings,)
    return tuple({type(m) for m in model.modules() if isinstance(m, known)})


def is_interpolating_vision_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` has DINOv2-style embeddings that skip the interpolation at the trained size."""
    return bool(_interpolating_embedding_classes(model))


@contextlib.contextmanager
def patch_position_interpolation(model: torch.nn.Module) -> Iterator[None]:
    """Make DINOv2's position-embedding interpolation take any image size in one exported graph.

    ``Dinov2Embeddings.interpolate_pos_encoding`` (transformers 5.x, ``modeling_dinov2.py``,
    ``if not torch.jit.is_tracing() and num_patches == num_positions and height == width: return
    self.position_embeddings``) returns early at the trained image size. ``torch.export`` is not
    ``torch.jit`` tracing, so it records ``height == width == image_size`` as guards and the
    image axes become static: a 48 px image then fails on a program captured at 32 px. The patch
    always interpolates (exactly the identity at the trained size). A no-op for a model without
    such embeddings. Delete when transformers skips that shortcut under ``torch.export``
    (``is_torchdynamo_compiling()``) too.

    Args:
        model: the model to export; only the embedding classes it uses are patched.
    """
    with swap_attr_on_each(_interpolating_embedding_classes(model), "interpolate_pos_encoding",
                           always_interpolated_positions):
        yield


def concatenated_expand_kv(self: torch.nn.Module, kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head latent attention's ``expand_kv``, the key built by ``torch.cat`` (the same values, bitwise).

    The keys ``[batch, heads, seq, nope + rope]`` and values ``[batch, heads, seq, v]`` from the compressed
    latents ``kv_nope`` ``[batch, 1, seq, rank]`` and the shared rotary key ``k_rot`` ``[batch, 1, seq, rope]``.
    """
    batch_size, _, seq_length, _ = kv_nope.shape
    expanded = self.kv_b_proj(kv_nope).view(batch_size, seq_length, -1, self.qk_nope_head_dim + self.v_head_dim)
    k_nope, value_states = torch.split(expanded.transpose(1, 2), [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
    return torch.cat([k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)], dim=-1), value_states


# The attributes of a multi-head latent attention module whose ``expand_kv`` builds its keys in place.
_LATENT_ATTENTION = ("kv_b_proj", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _latent_attention_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The classes of ``model``'s modules that define transformers' multi-head latent attention ``expand_kv``."""
    return tuple({type(m) for m in model.modules()
                  if "expand_kv" in vars(type(m)) and all(hasattr(m, name) for name in _LATENT_ATTENTION)})


@contextlib.contextmanager
def patch_latent_attention_keys(model: torch.nn.Module) -> Iterator[None]:
    """Build multi-head latent attention's keys with ``torch.cat`` instead of writes into an empty tensor.

    ``expand_kv`` (transformers 5.22-5.24: DeepSeek-V2 and V3, Mistral 4, Kimi-Linear,
    Bailing-Hybrid, LongCat-Flash, Youtu, AXK1, HY-V4) allocates the keys with
    ``kv_nope.new_empty(batch, heads, seq, nope + rope)`` and ``copy_``s both halves into
    slices of it. ExecuTorch 1.5.1's ``MemoryFormatOpsPass`` rewrites that ``empty`` and, in
    doing so, specialises its batch and sequence sizes: the .pte is planned for the traced
    shape only and refuses any other at ``set_inputs`` ("Attempted to resize a bounded tensor").
    ``concatenated_expand_kv`` gives the same keys, bitwise. A no-op for a model without such
    modules. Delete when ExecuTorch keeps a dynamic ``empty`` dynamic.

    Args:
        model: the model to export; only the attention classes it uses are patched.
    """
    with swap_attr_on_each(_latent_attention_classes(model), "expand_kv", concatenated_expand_kv):
        yield


def real_rotary_frequencies(self: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """A complex rotary embedding's ``forward`` with its ``cos + i sin`` as real pairs ``[..., dim / 2, 2]``."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling


def rotated_pairs(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``x``'s consecutive pairs as complex numbers times ``rotation`` (real pairs), as ``view_as_real`` lays it out.

    Example:
        >>> x, angle = torch.randn(1, 3, 4), torch.rand(1, 3, 2)
        >>> complex_form = torch.view_as_real(torch.view_as_complex(x.reshape(1, 3, 2, 2)) * torch.polar(torch.ones_like(angle), angle))
        >>> torch.allclose(rotated_pairs(x, torch.stack([angle.cos(), angle.sin()], -1)), complex_form.flatten(2))
        True
    """
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    real, imaginary, cos, sin = pairs[..., 0], pairs[..., 1], rotation[..., 0], rotation[..., 1]
    return torch.stack([real * cos - imaginary * sin, real * sin + imaginary * cos], dim=-1).flatten(-2).type_as(x)


def _real_rotary(head_axis: int) -> Any:
    """An ``apply_rotary_emb(xq, xk, freqs)`` over real rotation pairs ``[batch, seq, dim / 2, 2]`` with a head axis
    inserted at ``head_axis`` (1: queries ``[batch, heads, seq, dim]``; 2: ``[batch, seq, heads, dim]``)."""

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rotation = freqs.unsqueeze(head_axis)
        return rotated_pairs(xq, rotation), rotated_pairs(xk, rotation)

    return apply_rotary_emb


# Modeling modules whose text rotary embedding is complex (``torch.polar``, ``view_as_complex``): the class that
# makes it and where ``apply_rotary_emb`` puts the head axis.
_COMPLEX_ROTARY = {
    "transformers.models.deepseek_v2.modeling_deepseek_v2": ("DeepseekV2RotaryEmbedding", 1),
    "transformers.models.llama4.modeling_llama4": ("Llama4TextRotaryEmbedding", 2),
}


@contextlib.contextmanager
def patch_complex_rotary(model: torch.nn.Module) -> Iterator[None]:
    """Compute DeepSeek-V2's and Llama 4's complex rotary embedding in real arithmetic.

    Their rotary module returns ``torch.polar(1, angle)`` and ``apply_rotary_emb`` multiplies
    ``view_as_complex`` queries and keys by it (transformers 5.22-5.24). torch.onnx has no ONNX
    function for the complex tensors' ops ("No ONNX function found for aten.unsqueeze.default"),
    ExecuTorch no kernel ("view_as_complex_copy does not support"), OpenVINO no conversion. The
    patch swaps the module's ``forward`` for ``real_rotary_frequencies`` (the same ``cos`` and ``sin``
    as real pairs) and ``apply_rotary_emb`` for the same products written out, which equal the
    complex ones to float rounding. A no-op for a model without those classes. Delete when
    transformers writes these embeddings in real arithmetic.

    Args:
        model: the model to export; only the modules and classes it uses are patched.
    """
    from transformers.modeling_rope_utils import dynamic_rope_update

    found = {type(m).__module__: type(m) for m in model.modules()
             if _COMPLEX_ROTARY.get(type(m).__module__, ("",))[0] == type(m).__name__}
    with contextlib.ExitStack() as stack:
        for module_name, rotary in found.items():
            stack.enter_context(swap_attr(rotary, "forward", dynamic_rope_update(real_rotary_frequencies)))
            stack.enter_context(swap_attr(sys.modules[module_name], "apply_rotary_emb",
                                          _real_rotary(_COMPLEX_ROTARY[module_name][1])))
        yield


def real_dft2(x: torch.Tensor) -> torch.Tensor:
    """The real part of the 2-D discrete Fourier transform of ``x`` ``[batch, seq, hidden]`` over its last two axes.

    ``Re fft2(x) = C_s x C_h - S_s x S_h`` with ``C_n[j, k] = cos(2 pi jk / n)`` and ``S_n`` the sine, both
    symmetric; the angle's ``jk`` is taken modulo ``n`` first, so its float32 rounding does not grow with the length.
    Computed in float32 and returned in ``x``'s dtype.

    Example:
        >>> x = torch.randn(2, 5, 6)
        >>> torch.allclose(real_dft2(x), torch.fft.fftn(x, dim=(1, 2)).real, atol=1e-5)
        True
    """
    def cos_sin(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.arange(n, device=x.device)
        # ``n`` as a tensor (the last index plus one): a symbolic ``n`` in ``%`` or ``2 pi / n`` is a scalar that
        # torch.onnx's remainder and OpenVINO's converter do not take.
        count = k[-1:] + 1
        angle = (torch.outer(k, k) % count).to(torch.float32) * (2 * torch.pi) / count.to(torch.float32)
        return angle.cos(), angle.sin()

    (cos_s, sin_s), (cos_h, sin_h) = cos_sin(x.shape[-2]), cos_sin(x.shape[-1])
    y = x.to(torch.float32)
    return (cos_s @ y @ cos_h - sin_s @ y @ sin_h).to(x.dtype)


def _is_full_fft(transform: Any) -> bool:
    """Whether FNet's ``fourier_transform`` is a full FFT over the sequence and hidden axes (not its TPU DFT matrices,
    which are cut to the sequence length and so are not the DFT of that length)."""
    from transformers.models.fnet import modeling_fnet

    if isinstance(transform, functools.partial):
        return transform.func is torch.fft.fftn and not transform.args and transform.keywords == {"dim": (1, 2)}
    return transform is modeling_fnet.fftn


def _real_fourier_forward(forward: Any) -> Any:
    """Wrap an FNet mixing ``forward`` so a full FFT's real part is ``real_dft2``; any other transform is ``forward``."""

    def real_fourier_mixing(self: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor]:
        if hidden_states.dim() != 3 or not _is_full_fft(self.fourier_transform):
            return forward(self, hidden_states)
        return (real_dft2(hidden_states),)

    real_fourier_mixing.__wrapped__ = forward
    return real_fourier_mixing


@contextlib.contextmanager
def patch_real_fourier_mixing(model: torch.nn.Module) -> Iterator[None]:
    """Mix FNet's tokens with real matrix products instead of a complex FFT.

    Model pattern: FNet's ``FNetBasicFourierTransform`` returns ``torch.fft.fftn(x, dim=(1, 2)).real``
    (transformers 5.22-5.24). The FFT's complex tensors have no ExecuTorch kernel ("aten._fft_c2c ...
    SpecViolationError") and no OpenVINO conversion rule. The real part of a 2-D DFT is two real
    products with cosine and sine matrices built in the graph from the (dynamic) sequence length,
    ``real_dft2``, equal to the FFT's to float32 rounding. Only a full FFT is replaced: the TPU
    variant's DFT matrices stay as they are. A no-op for a model without FNet's mixing. Delete when
    ExecuTorch and OpenVINO run complex FFTs.

    Args:
        model: the model to export; only the mixing classes it uses are patched.
    """
    classes = {type(m) for m in model.modules() if type(m).__name__ == "FNetBasicFourierTransform"
               and _is_full_fft(getattr(m, "fourier_transform", None))}
    with contextlib.ExitStack() as stack:
        for owner in classes:
            stack.enter_context(swap_attr(owner, "forward", _real_fourier_forward(owner.forward)))
        yield


@attrs.frozen
class Positions:
    """Funnel's list of token positions, ``[first, start, start + step, ..., start + (count - 1) * step]``, with a
    symbolic ``count``: what its pooling makes of ``list(range(sequence))``."""

    first: int
    start: int
    step: int
    count: Any  # an int or a torch.SymInt

    def last(self) -> Any:
        """The last position (the tail's last, which a sequence of two or more tokens has)."""
        return self.start + (self.count - 1) * self.step


def pooled_positions(positions: Positions, block_index: int, *, separate_cls: bool, truncate_seq: bool) -> Positions:
    """``FunnelAttentionStructure.stride_pool_pos`` on ``Positions``: every second position, the <cls> kept apart.

    Example:
        >>> listed = list(range(9))
        >>> pooled = pooled_positions(Positions(0, 1, 1, 8), 1, separate_cls=True, truncate_seq=True)
        >>> [pooled.first, *(pooled.start + k * pooled.step for k in range(pooled.count))] == [-1, *listed[1:-1][::2]]
        True
    """
    if separate_cls:
        count = positions.count - 1 if truncate_seq else positions.count
        return Positions(1 - 2**block_index, positions.start, 2 * positions.step, (count + 1) // 2)
    return Positions(positions.first, positions.start + positions.step, 2 * positions.step, positions.count // 2)


def relative_positions(positions: Positions, stride: int, pooled: Positions | None = None, shift: int = 1,
                       device: Any = None) -> torch.Tensor:
    """``FunnelAttentionStructure.relative_pos`` on ``Positions``: the relative distances, largest first."""
    pooled = positions if pooled is None else pooled
    max_dist = pooled.first - positions.first + shift * (1 + pooled.count) * stride
    min_dist = pooled.first - positions.last()
    return torch.arange(max_dist, min_dist - 1, -stride, dtype=torch.long, device=device)


def symbolic_position_embeds(self: torch.nn.Module, seq_len: Any, dtype: torch.dtype, device: Any) -> Any:
    """Funnel's relative-shift position embeddings for every block with the positions kept symbolic (the same
    computation as ``FunnelAttentionStructure.get_position_embeds``, whose lists of Python ints are ``Positions``)."""
    d_model = self.config.d_model
    freq_seq = torch.arange(0, d_model // 2, 1.0, dtype=torch.int64, device=device).to(dtype)
    inv_freq = 1 / (10000 ** (freq_seq / (d_model // 2)))
    rel_pos_id = torch.arange(-seq_len * 2, seq_len * 2, 1.0, dtype=torch.int64, device=device).to(dtype)
    zero_offset = seq_len * 2
    sinusoid = rel_pos_id[:, None] * inv_freq[None]
    pos_embed = torch.cat([self.sin_dropout(torch.sin(sinusoid)), self.cos_dropout(torch.cos(sinusoid))], dim=-1)

    def gathered(relative: torch.Tensor) -> torch.Tensor:
        index = (relative[:, None] + zero_offset).expand(relative.size(0), d_model)
        return torch.gather(pos_embed, 0, index)

    pos = Positions(0, 1, 1, seq_len - 1)
    embeds = []
    for block_index in range(self.config.num_blocks):
        pooling = None
        pooled = pos
        if block_index > 0:
            pooled = pooled_positions(pos, block_index, separate_cls=self.config.separate_cls,
                                      truncate_seq=self.config.truncate_seq)
            pooling = gathered(relative_positions(pos, 2 ** (block_index - 1), pooled, shift=2, device=device))
        pos = pooled
        embeds.append([gathered(relative_positions(pos, 2**block_index, device=device)), pooling])
    return embeds


def gathered_relative_shift(positional_attn: torch.Tensor, context_len: Any, shift: int) -> torch.Tensor:
    """Funnel's ``_relative_shift_gather`` as one ``gather``: the same elements, bitwise, without its two reshapes.

    The reshapes read ``[seq, rel]`` as ``[rel, seq]``, drop ``shift`` rows and read the rest as
    ``[seq, rel - shift]``: element ``(i, j)`` is the flat element ``shift * seq + i * (rel - shift) + j``.

    Example:
        >>> from transformers.models.funnel.modeling_funnel import _relative_shift_gather
        >>> attn = torch.randn(2, 3, 5, 11)
        >>> torch.equal(gathered_relative_shift(attn, 5, 1), _relative_shift_gather(attn, 5, 1))
        True
    """
    batch_size, n_head, seq_len, max_rel_len = positional_attn.shape
    rows = torch.arange(seq_len, device=positional_attn.device)[:, None] * (max_rel_len - shift)
    flat = shift * seq_len + rows + torch.arange(context_len, device=positional_attn.device)[None, :]
    index = flat.reshape(1, 1, -1).expand(batch_size, n_head, -1)
    return positional_attn.flatten(2).gather(2, index).view(batch_size, n_head, seq_len, context_len)


def _symbolic_funnel_positions(get_position_embeds: Any) -> Any:
    """Wrap Funnel's ``get_position_embeds`` so its relative-shift branch keeps the positions symbolic."""

    def position_embeds(self: torch.nn.Module, seq_len: Any, dtype: torch.dtype, device: Any) -> Any:
        if self.config.attention_type == "factorized":
            return get_position_embeds(self, seq_len, dtype, device)
        return symbolic_position_embeds(self, seq_len, dtype, device)

    position_embeds.__wrapped__ = get_position_embeds
    return position_embeds


@contextlib.contextmanager
def patch_funnel_positions(model: torch.nn.Module) -> Iterator[None]:
    """Keep Funnel's sequence dynamic: its relative positions from symbolic sizes instead of lists of Python ints.

    Model pattern: ``FunnelAttentionStructure.get_position_embeds`` (transformers 5.22-5.24) builds
    ``pos = list(range(seq_len))`` and pools that list block by block, "so the relative-position
    ``arange`` sizes stay static for export": ``range`` of a symbolic length specialises the
    sequence to the traced one, and a program captured at 7 tokens refuses 11. Only four numbers
    of each list are read (its first, second and last positions and its length), and pooling keeps
    the tail an arithmetic progression, so ``Positions`` carries them with a symbolic length and
    gives the same ``arange``s (``symbolic_position_embeds``). Its relative shift
    (``_relative_shift_gather``) then reads ``[seq, rel]`` as ``[rel, seq]`` with two reshapes, whose
    view guards on a symbolic length hold only for some lengths (``Mod(...) == 0``): the same elements
    are read with one ``gather`` (``gathered_relative_shift``). A no-op for a model without Funnel's
    attention structure. Delete when transformers computes them from the size.

    Args:
        model: the model to export; only the attention-structure classes it uses are patched.
    """
    classes = {type(m) for m in model.modules() if type(m).__name__ == "FunnelAttentionStructure"
               and callable(getattr(type(m), "get_position_embeds", None))}
    with contextlib.ExitStack() as stack:
        for owner in classes:
            stack.enter_context(swap_attr(owner, "get_position_embeds",
                                          _symbolic_funnel_positions(owner.get_position_embeds)))
            module = sys.modules[owner.__module__]
            if callable(vars(module).get("_relative_shift_gather")):
                stack.enter_context(swap_attr(module, "_relative_shift_gather", gathered_relative_shift))
        yield


def batched_axial_positions(self: torch.nn.Module, position_ids: torch.Tensor) -> torch.Tensor:
    """Reformer's axial position encodings of ``position_ids`` in eval mode, every row gathered at once.

    The values of ``AxialPositionEmbeddings.forward``: the axial weights broadcast to the
    ``axial_pos_shape`` grid, concatenated, flattened row-major, and position ``p`` read at row
    ``p`` (transformers first cuts the grid to the rows the largest id needs, which keeps each
    read row where it is).
    """
    sequence_length = position_ids.shape[1]
    axial = tuple(self.axial_pos_shape)
    if math.prod(axial) < sequence_length:
        msg = (f"Make sure that config.axial_pos_shape factors: {axial} multiply at least to the sequence length "
               f"{sequence_length}.")
        raise ValueError(msg)
    grid = torch.cat([weight.expand(axial + weight.shape[-1:]) for weight in self.weights], dim=-1)
    table = grid.reshape(1, math.prod(axial), grid.shape[-1]).expand(position_ids.shape[0], -1, -1)
    return torch.gather(table, 1, position_ids[..., None].expand(-1, -1, grid.shape[-1]))


def _batched_in_eval(forward: Any) -> Any:
    """``forward`` with its eval-mode path replaced by ``batched_axial_positions`` (training is left as it is)."""

    @functools.wraps(forward)
    def batched(self: torch.nn.Module, position_ids: torch.Tensor) -> torch.Tensor:
        return forward(self, position_ids) if self.training else batched_axial_positions(self, position_ids)

    return batched


@contextlib.contextmanager
def patch_axial_positions(model: torch.nn.Module) -> Iterator[None]:
    """Keep Reformer's batch dynamic: its axial position encodings gathered for all rows at once.

    Model pattern: ``AxialPositionEmbeddings.forward`` (Reformer, transformers 5.22-5.24) in eval
    mode selects each row's positions in a Python loop, ``torch.cat([torch.index_select(
    position_encodings[i], 0, position_ids[i]).unsqueeze(0) for i in range(batch_size)])``:
    ``range`` of the batch size specialises the batch, and a program captured at batch 2 refuses 3.
    The loop also reads the largest id with ``.item()``, a data-dependent size. The patch gathers
    the same rows of the whole grid in one ``torch.gather`` (``batched_axial_positions``).
    Applied only where the class's ``forward`` still loops over the batch; a no-op for a model
    without it. Delete when transformers selects the positions in one op.

    Args:
        model: the model to export; only the axial-position classes it uses are patched.
    """
    classes = {type(m) for m in model.modules() if type(m).__name__ == "AxialPositionEmbeddings"
               and hasattr(m, "axial_pos_shape") and _source_contains(type(m).forward, "range(batch_size)")}
    with contextlib.ExitStack() as stack:
        for owner in classes:
            stack.enter_context(swap_attr(owner, "forward", _batched_in_eval(owner.forward)))
        yield


def arange_padding_mask(
    self: torch.nn.Module, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """CPM-Ant's ``CpmAntModel._prepare_attention_mask``, its left-padding mask from ``torch.arange``.

    The values of transformers' method: a token attends to the context and to earlier tokens of
    its own span, and no row attends to or from its left padding (the positions past ``length``,
    counted from the right after the model's prompt tokens). transformers counts them with
    ``torch.tensor(list(range(n))[::-1])``, ``torch.arange(n - 1, -1, -1)`` here.
    """
    batch, sequence = input_ids.shape
    device = input_ids.device
    causal = torch.arange(sequence, device=device) <= torch.arange(sequence, device=device).view(-1, 1)
    mask = context[:, None, :] | (context[:, :, None].logical_not() & causal.view(1, sequence, sequence))
    mask = mask & (span[:, None, :] == span[:, :, None])
    from_the_right = torch.arange(sequence - self.prompt_length - 1, -1, -1, device=device)[None, :].repeat(batch, 1)
    kept = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), from_the_right < length[:, None]), dim=1)
    return kept.view(batch, sequence, 1) & kept.view(batch, 1, sequence) & mask


@contextlib.contextmanager
def patch_padding_mask_from_a_python_range(model: torch.nn.Module) -> Iterator[None]:
    """Keep CPM-Ant's sequence dynamic: its padding mask counted with ``torch.arange``.

    Model pattern: a tensor built from a Python list of the sequence length,
    ``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])`` (CPM-Ant's
    ``_prepare_attention_mask``, transformers 5.22-5.24): ``range`` of a symbolic size
    specialises it, so a program captured at one length refuses every other. The patch
    swaps the method for ``arange_padding_mask`` (same values) on the classes whose
    method still holds that list; a no-op for any other model. Delete when transformers
    builds the mask with ``torch.arange``.

    Args:
        model: the model to export; only the classes it uses are patched.
    """
    classes = {type(m) for m in model.modules() if callable(vars(type(m)).get("_prepare_attention_mask"))
               and _source_contains(type(m)._prepare_attention_mask, "list(range(seqlen - self.prompt_length))")}
    with contextlib.ExitStack() as stack:
        for owner in classes:
            stack.enter_context(swap_attr(owner, "_prepare_attention_mask", arange_padding_mask))
        yield


def kept_padding_mask(input_ids: torch.Tensor, padding_idx: int = 1) -> torch.Tensor:
    """True for pad tokens: FSMT's ``make_padding_mask`` without its ``None`` for a batch without padding."""
    return input_ids.eq(padding_idx)


@contextlib.contextmanager
def patch_padding_mask_kept(model: torch.nn.Module) -> Iterator[None]:
    """Keep FSMT's decoder padding mask a tensor when nothing is padded.

    Model pattern: ``if not padding_mask.any(): padding_mask = None`` (FSMT's
    ``make_padding_mask``, transformers 5.22-5.24): a branch on the values of the
    inputs, which torch.export cannot trace ("Could not guard on data-dependent
    expression"). The mask is only read by ``masked_fill``, where an all-False mask
    changes nothing, so returning it always gives the same numbers. The module-level
    function is swapped in the modules of the model's classes whose function still
    holds that branch; a no-op for any other model. Delete when transformers drops the
    branch.

    Args:
        model: the model to export; only the modules of the classes it uses are patched.
    """
    modules = _defining_modules(model)
    owners = [module for module in modules if callable(vars(module).get("make_padding_mask"))
              and _source_contains(vars(module)["make_padding_mask"], "if not padding_mask.any():")]
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(swap_attr(owner, "make_padding_mask", kept_padding_mask))
        yield


def symbolic_len(obj: Any) -> Any:
    """``len(obj)``, except that a tensor whose first axis is symbolic gives that ``SymInt`` rather than an int."""
    if isinstance(obj, torch.Tensor) and obj.ndim and isinstance(obj.shape[0], torch.SymInt):
        return obj.shape[0]
    return len(obj)


@contextlib.contextmanager
def patch_tensor_len(model: torch.nn.Module) -> Iterator[None]:
    """Keep a dynamic first axis dynamic through ``len(tensor)`` in the model's code.

    Model pattern: ``batch_size = len(source_flatten)`` (RT-DETR, RT-DETRv2, D-FINE, DEIMv2 in
    transformers 5.22-5.24). Python's ``len`` must return an int, so under non-strict
    ``torch.export`` it specialises the batch to the traced size and the program refuses every
    other batch. Only the modules that define the model's classes get a module-level ``len``
    (``symbolic_len``: the tensor's ``shape[0]``, a ``SymInt`` where it is dynamic, else the
    builtin), which Python finds before the builtin. Delete when torch.export traces ``len`` of a
    tensor symbolically.

    Args:
        model: the model to export; only the modules of the classes it uses are patched.
    """
    modules = _defining_modules(model)
    spaces = [vars(module) for module in modules
              if not module.__name__.startswith(("torch.", "hfx.")) and "len" not in vars(module)]
    with contextlib.ExitStack() as stack:
        for space in spaces:
            stack.enter_context(swap_item(space, "len", symbolic_len))
        yield


def arch_patches(model: torch.nn.Module) -> tuple[Patch, ...]:
    """Return the architecture patches for ``model``, bound to it (each a no-op where its pattern is absent).

    Args:
        model: the model to export.

    Returns:
        ``patch_position_interpolation``, ``patch_latent_attention_keys``, ``patch_complex_rotary``,
        ``patch_real_fourier_mixing``, ``patch_funnel_positions``, ``patch_axial_positions`` and
        ``patch_padding_mask_from_a_python_range``, ``patch_tensor_len``, ``patch_padding_mask_kept``,
        ``patch_dense_global_attention``, ``patch_padded_image_batch``, ``patch_integer_pixel_shuffle``,
        ``patch_deepstack_gather``, ``patch_functional_token_shift``, ``patch_eos_pooling_gather``,
        ``patch_covering_average_pool``, ``patch_symbolic_step_positions``, ``patch_one_chunk_loops`` and
        ``patch_integer_conv_padding``, ``patch_upsampled_to_input_length`` and ``patch_unconditional_swin_pads``
        bound to ``model``.

    Example:
        >>> [p.func.__name__ for p in arch_patches(torch.nn.Linear(1, 1))][3:]
        ['patch_real_fourier_mixing', 'patch_funnel_positions', 'patch_axial_positions', 'patch_padding_mask_from_a_python_range', 'patch_tensor_len', 'patch_padding_mask_kept', 'patch_dense_global_attention', 'patch_padded_image_batch', 'patch_integer_pixel_shuffle', 'patch_deepstack_gather', 'patch_functional_token_shift', 'patch_eos_pooling_gather', 'patch_covering_average_pool', 'patch_symbolic_step_positions', 'patch_one_chunk_loops', 'patch_integer_conv_padding', 'patch_upsampled_to_input_length', 'patch_unconditional_swin_pads']
    """
    return tuple(functools.partial(patch, model) for patch in (patch_position_interpolation, patch_latent_attention_keys,
                                                               patch_complex_rotary, patch_real_fourier_mixing,
                                                               patch_funnel_positions, patch_axial_positions,
                                                               patch_padding_mask_from_a_python_range, patch_tensor_len,
                                                               patch_padding_mask_kept, patch_dense_global_attention,
                                                               patch_padded_image_batch, patch_integer_pixel_shuffle,
                                                               patch_deepstack_gather, patch_functional_token_shift,
                                                               patch_eos_pooling_gather, patch_covering_average_pool,
                                                               patch_symbolic_step_positions, patch_one_chunk_loops,
                                                               patch_integer_conv_padding, patch_upsampled_to_input_length,
                                                               patch_unconditional_swin_pads))
