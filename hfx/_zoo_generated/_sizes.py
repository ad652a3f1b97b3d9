"""The small sizes every generated config gets, as transformers' model testers use them."""

from __future__ import annotations

WIDTH = 32  # hidden sizes, as transformers' model testers use
HEADS = 4
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
INTERMEDIATE = 64
VOCAB = 256
# Special tokens move to the top of the vocabulary; prompt text stays below them.
SPECIAL_BLOCK = 32
TEXT_HIGH = VOCAB - SPECIAL_BLOCK
IMAGE = 32
# Pyramid backbones halve the image four or five times: 64 px keeps their last stage at 2 x 2.
PYRAMID_IMAGE = 64
PATCH = 8
POSITIONS = 512
EXPERTS = 4
WINDOW = 4
