"""Python loops over fixed-size chunks of a symbolic length, one chunk when the traced length fits in it.

Nemotron 3.5 Transcribe's audio tower (``_get_chunks``) and Nemotron 3 Diarization's offline forward
(transformers 5.22-5.24) encode a recording in chunks of ``config.chunk_length`` encoder frames,
``for start in range(0, num_frames, chunk_length)``. ``range`` needs ints, so export specialises the
frame count: the program takes the capture's spectrogram length only ("axis 1 of input
'input_features' is static 72"; the peer's own export fails with "Guard failed:
input_features.size()[1] // 8 == 9"). CANINE's and ESMFold's chunked attention loop the same way.
"""

from __future__ import annotations

import builtins
import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch

from hfx.patches._core import defining_modules, size_at_trace, source_contains, swap_item

_CHUNK_LOOP = re.compile(r"\bin range\([^(),]+,[^(),]+,[^(),]+\)")


def one_chunk_range(*args: Any) -> range:
    """``range(*args)``, with one step where ``range(start, stop, step)``'s symbolic ``stop`` (or ``step``) takes one step.

    There the loop runs once, as eager does on the traced input, and the program keeps the
    lengths that take one step (``start < stop <= start + step``; a longer input is an
    ``InputError`` naming the dim). Everything else is the builtin ``range``.

    >>> list(one_chunk_range(0, 10, 4)), list(one_chunk_range(3))
    ([0, 4, 8], [0, 1, 2])
    """
    if len(args) == 3 and isinstance(args[0], int) and any(isinstance(a, torch.SymInt) for a in args[1:]):
        start, stop, step = args
        if size_at_trace(step) > 0 and start < size_at_trace(stop) <= start + size_at_trace(step):
            torch._check(step > 0)  # EnCodec's whole-input chunk: range(0, length, length)
            torch._check(stop > start)
            torch._check(stop <= start + step)
            return builtins.range(start, start + 1)
    return builtins.range(*args)


@contextlib.contextmanager
def patch_one_chunk_loops(model: torch.nn.Module) -> Iterator[None]:
    """Give the modules that loop over ``range(start, stop, step)`` ``one_chunk_range`` in the block.

    Model pattern: a Python loop over chunks of a length the inputs set, ``for start in
    range(0, num_frames, config.chunk_length)`` (Nemotron 3.5 Transcribe, Nemotron 3 Diarization,
    CANINE, ESMFold; transformers 5.22-5.24). Where the traced length fits in one chunk, the program
    runs one chunk and takes every length that does (40 s of audio for Nemotron's 500 encoder
    frames) instead of the capture's only; a longer traced input specialises as before. A no-op
    for models whose modules have no three-argument ``range``. Delete when torch.export traces a
    ``range`` over a symbolic size without specialising it.

    Args:
        model: the model to export; the modules that define its classes are patched.
    """
    spaces = [vars(module) for module in defining_modules(model)
              if not module.__name__.startswith(("torch.", "hfx.")) and source_contains(module, _CHUNK_LOOP)]
    with contextlib.ExitStack() as stack:
        for space in spaces:
            stack.enter_context(swap_item(space, "range", one_chunk_range))
        yield
