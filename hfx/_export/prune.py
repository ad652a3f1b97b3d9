"""Drop the weights an exported graph never reads.

``torch.export`` lifts every parameter and buffer of the exported module into
the program, used or not. A component exported from a whole model carries the
weights of the parts it does not run: the decode graph of an encoder-decoder
model holds the encoder, a multimodal image encoder holds the language model.
Pruning them makes each component's file hold only its own weights.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind

_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def without_unused_weights(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without the parameters, buffers and constant tensors its graph does not use.

    The graph module is edited in place (``export`` owns the program it just
    made) and a new ``ExportedProgram`` is returned; the user inputs, outputs
    and range constraints are unchanged.

    Example:
        >>> class TwoHeads(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.used, self.unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        ...     def forward(self, x):
        ...         return self.used(x)
        >>> program = torch.export.export(TwoHeads(), (torch.ones(1, 2),))
        >>> sorted(without_unused_weights(program).state_dict)
        ['used.bias', 'used.weight']
    """
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    dropped = [
        spec for spec in program.graph_signature.input_specs
        if spec.kind in _WEIGHT_KINDS and not placeholders[spec.arg.name].users
    ]
    if not dropped:
        return program
    for spec in dropped:
        program.graph.erase_node(placeholders[spec.arg.name])
    program.graph_module.recompile()
    targets = {spec.target for spec in dropped}
    signature = ExportGraphSignature(
        input_specs=[spec for spec in program.graph_signature.input_specs if spec not in dropped],
        output_specs=list(program.graph_signature.output_specs),
    )
    return torch.export.ExportedProgram(
        root=program.graph_module,
        graph=program.graph,
        graph_signature=signature,
        state_dict={k: v for k, v in program.state_dict.items() if k not in targets},
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs,
        constants={k: v for k, v in program.constants.items() if k not in targets},
        verifiers=[program.verifier],
    )
