"""Outputs that are constants, not tensors: kept in the calling contract, taken out of the graph.

A model can return ``None`` inside its output structure: transformers 5.24's
LLaVA returns its vision tower's ``hidden_states`` with ``None`` for every
layer it did not keep (``select_hidden_states``). torch.export records such a
leaf as a ``ConstantArgument`` output of the graph; no runtime returns it.
``IoSpec.constant_outputs`` holds each one's place among the output leaves,
the graph returns the tensors alone, and the call puts the constants back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils import _pytree as pytree


def user_outputs(program: torch.export.ExportedProgram) -> list[Any]:
    """The graph's user outputs, in order: FX nodes for tensors, the values themselves for constants."""
    output = program.graph.output_node()
    count = len(program.graph_signature.user_outputs)
    return list(output.args[0][-count:]) if count else []


def constant_outputs(program: torch.export.ExportedProgram) -> tuple[tuple[int, Any], ...]:
    """``(leaf index, value)`` of each user output of ``program`` that is not a tensor."""
    return tuple((index, value) for index, value in enumerate(user_outputs(program))
                 if not isinstance(value, torch.fx.Node))


def without_constant_outputs(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` returning its tensor outputs alone, as a flat tuple; ``program`` itself when it has no other.

    The graph is changed in place (the program is hfx's own, fresh from torch.export).
    """
    from torch.export.graph_signature import ConstantArgument

    constants = constant_outputs(program)
    if not constants:
        return program
    pairs = list(zip(program.graph.output_node().args[0], program.graph_signature.output_specs, strict=True))
    kept = [(arg, spec) for arg, spec in pairs if not isinstance(spec.arg, ConstantArgument)]
    tensors = len(program.graph_signature.user_outputs) - len(constants)
    out_spec = pytree.TreeSpec(tuple, None, [pytree.treespec_leaf()] * tensors)
    return with_outputs(program, [arg for arg, _ in kept], [spec for _, spec in kept], out_spec)


def with_outputs(program: Any, args: list[Any], specs: list[Any], out_spec: Any) -> Any:
    """``program``'s graph returning ``args`` (``specs`` in its signature, ``out_spec`` the structure), as a new
    ``ExportedProgram``; the graph is changed in place."""
    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import ExportGraphSignature

    output = program.graph.output_node()
    output.args = (tuple(args),)
    program.graph_module.recompile()
    entries = [
        dataclasses.replace(entry, signature=dataclasses.replace(entry.signature, out_spec=out_spec))
        if entry.fqn == "" and entry.signature is not None else entry
        for entry in program.module_call_graph
    ]
    return ExportedProgram(
        root=program.graph_module,
        graph=program.graph,
        graph_signature=ExportGraphSignature(input_specs=program.graph_signature.input_specs, output_specs=specs),
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=entries,
        constants=program.constants,
        verifiers=[program.verifier],
    )


def with_constants(flat: list[Any], constants: tuple[tuple[int, Any], ...]) -> list[Any]:
    """The output leaves: ``flat`` (the tensors) with each constant put back at its index."""
    leaves = list(flat)
    for index, value in sorted(constants):
        leaves.insert(index, value)
    return leaves
