"""hfx's ONNX translations of ATen ops torchlib lacks: ``erfinv`` (Gemma 3n's activation sparsity threshold)."""

from __future__ import annotations

import pytest
import torch

import hfx
from hfx.backends._onnx_translations import onnx_translations
from tests.backends.test_decompositions import assert_erfinv_matches_torch, erfinv_program

pytest.importorskip("onnxruntime")


def test_erfinv_matches_torch_over_the_open_interval_and_its_ends():
    assert_erfinv_matches_torch(erfinv_program(hfx.lower_to_onnx), 20_001)


def test_the_translation_is_given_while_torchlib_lacks_erfinv():
    """Canary: when this fails, torchlib translates erfinv and hfx's translation steps aside."""
    assert torch.ops.aten.erfinv.default in onnx_translations()
