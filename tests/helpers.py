"""Helpers shared by the tests: shapes, new inputs and model-state snapshots."""

from __future__ import annotations

import torch

from hfx import zoo

# Capture shapes, and the different shapes every parity test uses.
CAPTURE_SHAPE = {"batch": 2, "sequence": 7}
NEW_SHAPE = {"batch": 3, "sequence": 11}
PARITY_MODELS = ("llama", "qwen3", "bert", "vit")


def new_inputs(name: str) -> dict[str, torch.Tensor]:
    """Inputs of a different batch size and sequence length than the capture."""
    return zoo.inputs(name, **NEW_SHAPE)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A deep copy of the model's parameters and buffers, to compare after a stage."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


GENERATIVE_MODELS = ("llama", "t5", "whisper", "llava")
NEW_TOKENS = {"llama": 32, "t5": 16, "whisper": 16, "llava": 16}


def eager_tokens(model: torch.nn.Module, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
    """What ``model.generate`` gives greedily: the reference every runtime must match exactly."""
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
