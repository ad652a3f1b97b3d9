"""Drop the weights an exported graph never reads.

``torch.export`` lifts every parameter and buffer of the exported module into
the program, used or not. A component exported from a whole model carries the
weights of the parts it does not run: the decode graph of an encoder-decoder
model holds the encoder, a multimodal image encoder holds the language model.
Pruning them makes each component's file hold only its own weights. Nodes whose
results nothing uses go first, and the weights only they read with them: a
component may call more of the model than it returns (the encoder that computes
the decoder's cross-attention cache, ``hfx._capture.cross_cache``).
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind

_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _has_effects(node: torch.fx.Node) -> bool:
    """Whether removing ``node`` may change what the program does when nothing uses its result.

    Only ATen operators and Python's operators (symbolic size arithmetic) are
    judged by what they are; any other function is kept: ``torch.func.vmap``
    leaves calls such as ``_vmap_increment_nesting`` that must stay paired.
    """
    if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):  # noqa: SLF001
        return getattr(node.target, "__module__", None) not in ("_operator", "operator") or node.is_impure()
    return node.target is not torch.ops.aten._assert_tensor_metadata.default and node.is_impure(impure_random=False)


def without_unused_weights(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without its dead code and the parameters, buffers and constant tensors its graph does not use.

    Dead code is what ``torch.fx``'s ``eliminate_dead_code`` removes: nodes
    without users and without side effects. In-place writes and asserts stay,
    except ``torch.export``'s checks of a ``.to()`` result's dtype and device
    (``_assert_tensor_metadata``), which only check a value nothing reads once
    the value is dead; random ops (an eval-mode dropout) are removed when unused.

    The graph module is edited in place (``export`` owns the program it just
    made) and a new ``ExportedProgram`` is returned; the user inputs, outputs
    and range constraints are unchanged.

    Example:
        >>> class TwoHeads(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.used, self.unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        ...     def forward(self, x):
        ...         self.unused(x)  # computed, never used: dead code
        ...         return self.used(x)
        >>> program = torch.export.export(TwoHeads(), (torch.ones(1, 2),))
        >>> sorted(without_unused_weights(program).state_dict)
        ['used.bias', 'used.weight']
    """
    if program.graph.eliminate_dead_code(is_impure_node=_has_effects):
        program.graph_module.recompile()
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
