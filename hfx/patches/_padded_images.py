"""Pixtral-style vision towers over a padded image batch, without a Python loop over the images.

Pixtral's tower (and Mistral 3's, LightOnOCR's and Mistral Large 4's, which use it) crops each
image of the padded batch to its ``image_sizes`` row in a Python loop, packs the crops into one
sequence and builds a block mask per image; the patch merger after it splits that sequence per
image again (``image_features.split(tokens_per_image)``). The loops fix the number of images, and
the crop sizes are values of an input: torch.export stops ("Could not guard on data-dependent
expression u1*u3 + u5*u7 > 1") or pins the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr

_TOWER_LOOP = "for embed, size in zip(patch_embeds, image_sizes)"
_MERGER_LOOP = "image_features.split(tokens_per_image)"


def _inside(sizes: torch.Tensor, rows: Any, cols: Any) -> torch.Tensor:
    """``(images, rows, cols)``: True where a cell of the padded grid lies inside the image's ``sizes`` (``(images, 2)``)."""
    row_ids = torch.arange(rows, device=sizes.device)
    col_ids = torch.arange(cols, device=sizes.device)
    return (row_ids[None, :, None] < sizes[:, 0, None, None]) & (col_ids[None, None, :] < sizes[:, 1, None, None])


def valid_first(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``rows`` reordered so the ``valid`` ones come first, each group in its order: a scatter, no sort.

    Example:
        >>> valid_first(torch.tensor([[0], [1], [2], [3]]), torch.tensor([False, True, False, True])).flatten().tolist()
        [1, 3, 0, 2]
    """
    flags = valid.long()
    invalid = 1 - flags
    destination = torch.where(valid, flags.cumsum(0) - 1, flags.sum() + invalid.cumsum(0) - 1)
    return torch.zeros_like(rows).index_copy(0, destination, rows)


def _padded_tower_forward(grids: list[tuple[Any, Any]]) -> Callable[..., Any]:
    """Pixtral's tower forward over the whole padded batch; records each call's patch grid in ``grids``."""

    def forward(self: torch.nn.Module, pixel_values: torch.Tensor, image_sizes: Any = None, **kwargs: Any) -> Any:
        embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))  # (images, C, rows, cols)
        images, channels, rows, cols = embeds.shape
        grids.append((rows, cols))
        if image_sizes is None:
            inside = torch.ones(images, rows, cols, dtype=torch.bool, device=embeds.device)
        else:
            inside = _inside(torch.as_tensor(image_sizes, device=embeds.device) // self.patch_size, rows, cols)
        tokens = self.ln_pre(embeds.flatten(2).transpose(1, 2).reshape(1, -1, channels))
        row_ids, col_ids = torch.meshgrid(torch.arange(rows, device=embeds.device),
                                          torch.arange(cols, device=embeds.device), indexing="ij")
        positions = torch.stack([row_ids.flatten(), col_ids.flatten()], dim=-1).repeat(images, 1)
        position_embeddings = self.patch_positional_embedding(tokens, positions)
        # expand, not repeat_interleave: torch.onnx 2.13's repeat_interleave of a symbolic count fails in ONNX Runtime
        # ("invalid expand shape")
        image_of = torch.arange(images, device=embeds.device)[:, None].expand(images, rows * cols).reshape(-1)
        keys = inside.flatten()
        allowed = (image_of[:, None] == image_of[None, :]) & keys[None, :]
        allowed = allowed | torch.eye(keys.shape[0], dtype=torch.bool, device=keys.device)  # padding sees itself
        mask = torch.zeros(allowed.shape, dtype=tokens.dtype, device=tokens.device)
        mask = mask.masked_fill(~allowed, torch.finfo(tokens.dtype).min)[None, None]
        return self.transformer(tokens, attention_mask=mask, position_embeddings=position_embeddings, **kwargs)

    # transformers' own decorators: config defaults, and the hooks that collect hidden_states (the VLM reads them)
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    return merge_with_config_defaults(capture_outputs(forward))


def _padded_merger_forward(grids: list[tuple[Any, Any]], original: Callable[..., Any]) -> Callable[..., Any]:
    """The patch merger over the padded grid the tower recorded: the merged cells inside each image's size, in
    transformers' order (eager's rows, their count read from ``image_sizes``)."""

    def forward(self: torch.nn.Module, image_features: torch.Tensor, image_sizes: Any) -> torch.Tensor:
        if not grids:  # features that did not come from the patched tower
            return original(self, image_features, image_sizes)
        rows, cols = grids[-1]
        merge = self.spatial_merge_size
        sizes = torch.as_tensor(image_sizes, device=image_features.device)
        images, width = sizes.shape[0], image_features.shape[-1]
        grid = image_features.reshape(images, rows, cols, width)
        merged_rows, merged_cols = rows // merge, cols // merge
        grid = grid[:, : merged_rows * merge, : merged_cols * merge]
        # F.unfold's layout: channel-major, then the row and column inside the merged cell
        cells = grid.reshape(images, merged_rows, merge, merged_cols, merge, width).permute(0, 1, 3, 5, 2, 4)
        cells = cells.reshape(images * merged_rows * merged_cols, width * merge * merge)
        inside = _inside(sizes // self.patch_size // merge, merged_rows, merged_cols).flatten()
        merged = self.merging_layer(valid_first(cells, inside))
        # eager's rows: the merged cells inside each image's size, a count read from ``image_sizes``
        count = inside.sum().item()
        torch._check(count >= 0)
        torch._check(count <= merged.shape[0])
        return merged.narrow(0, 0, count)

    return forward


def padded_placeholder_mask(self: torch.nn.Module, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor,
                            image_features: torch.Tensor) -> torch.Tensor:
    """transformers' image placeholder mask, with its check (one feature row per placeholder) as a runtime check.

    ``get_placeholder_mask`` raises unless ``n_image_tokens * hidden == image_features.numel()``; over a
    padded batch both counts are read from inputs (the prompt's placeholders, ``image_sizes``), and a
    Python comparison of two such counts stops torch.export. ``torch._check`` states the same equation.
    """
    if input_ids is None:
        image_token = torch.full((), self.config.image_token_id, dtype=torch.long, device=inputs_embeds.device)
        mask = (inputs_embeds == self.get_input_embeddings()(image_token)).all(-1)
    else:
        mask = input_ids == self.config.image_token_id
    torch._check(mask.sum().item() * inputs_embeds.shape[-1] == image_features.numel())
    return mask.unsqueeze(-1).to(inputs_embeds.device)


@contextlib.contextmanager
def patch_padded_image_batch(model: torch.nn.Module) -> Iterator[None]:
    """Run Pixtral-style towers and patch mergers over the padded image batch, with masks instead of crops.

    Model pattern: a vision tower that crops each image to ``image_sizes`` in a loop
    (``for embed, size in zip(patch_embeds, image_sizes)``) and a patch merger that splits its output
    per image (``image_features.split(tokens_per_image)``): Pixtral, Mistral 3, LightOnOCR, Mistral
    Large 4 in transformers 5.22-5.24. Within the block the tower embeds every patch of the padded batch,
    masks attention to its own image's patches inside its size (rotary positions as the crop gives
    them), and the merger merges the padded grid and keeps the merged cells inside each image's size,
    in transformers' order: eager's features, for any number and size of images (their count is read
    from ``image_sizes``, a data-dependent size). The model's placeholder check becomes a runtime check
    (``padded_placeholder_mask``). A tower with no such merger after it (LLaVA over
    Pixtral) is left as it is: its reader would get the padding between the images' tokens. A tower
    called alone returns the padded grid's tokens, which are transformers' packed tokens when no image
    is padded. A no-op for other models. Delete when transformers' Pixtral stops looping over images.

    Args:
        model: the model to export; only its tower and merger classes are patched.
    """
    grids: list[tuple[Any, Any]] = []
    modules = list(model.modules())
    towers = {type(m) for m in modules if source_contains(type(m).forward, _TOWER_LOOP)
              and all(hasattr(m, name) for name in ("patch_conv", "ln_pre", "patch_positional_embedding"))}
    mergers = {type(m) for m in modules if source_contains(type(m).forward, _MERGER_LOOP)
               and all(hasattr(m, name) for name in ("merging_layer", "spatial_merge_size", "patch_size"))}
    if not mergers and type(model) not in towers:
        # A Pixtral tower without a merger after it (LLaVA over Pixtral) would hand its reader the padded grid's
        # tokens, padding between the images' own: only the merger puts them first. Leave such a model alone.
        towers = set()
    exact = "n_image_tokens * inputs_embeds.shape[-1] == image_features.numel()"
    placeholders = {type(m) for m in modules
                    if towers and source_contains(getattr(type(m), "get_placeholder_mask", None), exact)}
    with contextlib.ExitStack() as stack:
        for owner in placeholders:
            stack.enter_context(swap_attr(owner, "get_placeholder_mask", padded_placeholder_mask))
        for owner in towers:
            stack.enter_context(swap_attr(owner, "forward", _padded_tower_forward(grids)))
        for owner in mergers:
            stack.enter_context(swap_attr(owner, "forward", _padded_merger_forward(grids, owner.forward)))
        yield
