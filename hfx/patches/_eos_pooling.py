"""BART-style sequence classification pooled at the last ``<eos>`` by a gather, not a boolean index.

BART, MBart, PLBart, MVP, BigBird-Pegasus, T5, mT5 and UMT5 (transformers 5.22-5.24) classify a
sequence by the decoder's hidden state at its last ``<eos>``: ``hidden_states[eos_mask, :]``
(``sequence_output[eos_mask, :]`` in the T5 family) keeps a data-dependent number of rows, then
``.view(batch, -1, hidden)[:, -1, :]`` takes each row's last. torch.export
traces it with an unbacked row count, but ExecuTorch's edge retrace cannot view that count by the
batch ("GuardOnDataDependentSymNode: Could not guard on data-dependent expression
((u7//2)) <= 0"), and every runtime gets a data-dependent shape where a gather does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hfx.patches._core import source_contains, swap_attr

_PATTERN = re.compile(r"\b(hidden_states|sequence_output)\[eos_mask, :\]")


def rows_at_last_true(hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``hidden_states[b, t]`` at each row's last ``t`` where ``mask[b, t]`` holds: ``[batch, hidden]``.

    Eager's ``hidden_states[mask].view(batch, -1, hidden)[:, -1]`` when every row holds as many
    ``True`` (eager raises otherwise); a row without any gives its position 0.

    >>> hidden = torch.arange(8.0).view(2, 4, 1)
    >>> rows_at_last_true(hidden, torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)).flatten()
    tensor([2., 7.])
    """
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, 0).amax(dim=1)
    index = last.view(-1, 1, 1).expand(-1, 1, hidden_states.shape[-1])
    return hidden_states.gather(1, index).squeeze(1)


def _eos_pooled(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` of a BART-style classifier whose eos pooling gathers; with labels (a loss) it is ``forward``."""

    @functools.wraps(forward)
    def eos_pooled_forward(self: torch.nn.Module, input_ids: torch.Tensor | None = None, *args: Any,
                           labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if labels is not None or input_ids is None or args or "return_dict" in kwargs:  # the loss, an error, a tuple
            return forward(self, input_ids, *args, labels=labels, **kwargs)
        outputs = _seq2seq_outputs(self, input_ids, kwargs)
        hidden_states = outputs[0]
        logits = self.classification_head(rows_at_last_true(hidden_states, input_ids.eq(self.config.eos_token_id)))
        return _classifier_output(forward, logits, outputs)

    return eos_pooled_forward


def _seq2seq_outputs(self: torch.nn.Module, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    """The encoder-decoder's outputs as the classifier's forward runs it: BART's ``self.model`` makes its own
    decoder inputs; the T5 family's ``self.transformer`` gets ``input_ids`` shifted right."""
    if hasattr(self, "model"):
        return self.model(input_ids, **kwargs)
    if kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
        kwargs = {**kwargs, "decoder_input_ids": self._shift_right(input_ids)}
    return self.transformer(input_ids, **kwargs)


def _classifier_output(forward: Callable[..., Any], logits: torch.Tensor, outputs: Any) -> Any:
    """The ``Seq2SeqSequenceClassifierOutput`` ``forward`` returns, with ``logits`` and ``outputs``' fields."""
    output_class = inspect.unwrap(forward).__globals__["Seq2SeqSequenceClassifierOutput"]
    return output_class(
        loss=None,
        logits=logits,
        past_key_values=outputs.past_key_values,
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
    )


@contextlib.contextmanager
def patch_eos_pooling_gather(model: torch.nn.Module) -> Iterator[None]:
    """Pool BART-style sequence classifiers at the last ``<eos>`` with ``rows_at_last_true`` in the block.

    Model pattern: a ``...ForSequenceClassification.forward`` that selects ``hidden_states[eos_mask, :]``
    (BART, MBart, PLBart, MVP, BigBird-Pegasus) or ``sequence_output[eos_mask, :]`` (T5, mT5, UMT5;
    transformers 5.22-5.24). The same logits where eager runs; a call with ``labels`` runs the
    original forward. A no-op for other models. Delete when transformers gathers the last ``<eos>``.

    Args:
        model: the model to export; only the classes of its modules are patched.
    """
    owners = [type(m) for m in model.modules()
              if source_contains(vars(type(m)).get("forward"), _PATTERN)
              and "Seq2SeqSequenceClassifierOutput" in inspect.unwrap(vars(type(m))["forward"]).__globals__]
    with contextlib.ExitStack() as stack:
        for owner in dict.fromkeys(owners):
            stack.enter_context(swap_attr(owner, "forward", _eos_pooled(vars(owner)["forward"])))
        yield
