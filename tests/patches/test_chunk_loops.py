"""patch_one_chunk_loops: a Python loop over fixed-size chunks of a symbolic length runs one chunk."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx import zoo
from hfx.patches import one_chunk_range, patch_one_chunk_loops

# Nemotron 3.5 Transcribe's audio tower and diarization loops are the model pattern: its cells (torch, ONNX,
# OpenVINO) pass in benchmarks/results/coverage-generated.json, and the contract test patches its modules.


class _Chunked(torch.nn.Module):
    """A cumulative sum restarted every ``chunk`` frames, in a Python loop as Nemotron's ``_get_chunks``."""

    def __init__(self, chunk: int) -> None:
        super().__init__()
        self.chunk = chunk

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        pieces = []
        for start in range(0, input_features.shape[-1], self.chunk):
            pieces.append(input_features[..., start: min(start + self.chunk, input_features.shape[-1])].cumsum(-1))
        return torch.cat(pieces, dim=-1)


def test_the_range_is_the_builtin_on_ints():
    for args in ((5,), (2, 9), (0, 10, 4), (0, 3, 4), (7, 1, -2)):
        assert list(one_chunk_range(*args)) == list(range(*args))


def test_a_traced_length_within_one_chunk_takes_every_length_the_chunk_holds():
    model = _Chunked(chunk=16)
    exported = hfx.export(hfx.capture({"input_features": torch.randn(2, 4, 9)}, model))
    assert exported.io.inputs[0].shape == ("batch", 4, "frames")
    assert exported.io.bounds["frames"][1] == 16
    for length in (1, 13, 16):
        x = torch.randn(3, 4, length)
        torch.testing.assert_close(exported(input_features=x), model(x))
    with pytest.raises(hfx.InputError, match="frames"):
        exported(input_features=torch.randn(1, 4, 17))
    assert "range" not in vars(__import__(__name__))


def test_a_traced_length_over_one_chunk_specialises_as_before():
    model = _Chunked(chunk=4)
    exported = hfx.export(hfx.capture({"input_features": torch.randn(2, 4, 9)}, model))
    assert exported.io.inputs[0].shape[2] == 9
    with patch_one_chunk_loops(zoo.build("bert")):
        assert "range" not in vars(__import__("transformers.models.bert.modeling_bert", fromlist=["_"]))

