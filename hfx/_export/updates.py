"""Graph passes that make an ``Exported`` lowerable by a runtime that cannot write its inputs or run asserts."""

from __future__ import annotations

from typing import Any

from hfx._export.asserts import without_runtime_asserts
from hfx._export.constant_outputs import with_outputs
from hfx._pytree import spec_caches
from hfx._records import Exported


def for_runtime(exported: Exported) -> Exported:
    """What a runtime that cannot write inputs or run asserts lowers: asserts removed, in-place writes as outputs."""
    return with_updates_as_outputs(without_runtime_asserts(exported))


def with_updates_as_outputs(exported: Exported) -> Exported:
    """``exported`` with its in-place input writes turned into trailing outputs.

    ONNX, ExecuTorch and OpenVINO graphs cannot write their inputs: the
    functional program returns the new values of ``io.updates`` after the
    model's outputs (named ``updated.<input>``), and the call copies them back
    into the caller's tensors. The ``Exported`` given is not changed.
    """
    if not exported.io.updates:
        return exported
    import attrs
    from torch.export.graph_signature import OutputKind, OutputSpec
    from torch.utils import _pytree as pytree

    from hfx._records import TensorSpec

    with spec_caches(exported.io):
        functional = exported.program.run_decompositions({})
        signature = functional.graph_signature
        output = functional.graph.output_node()
        pairs = list(zip(output.args[0], signature.output_specs))
        kept = [(arg, spec) for arg, spec in pairs if spec.kind != OutputKind.USER_INPUT_MUTATION]
        written = {spec.target: arg for arg, spec in pairs if spec.kind == OutputKind.USER_INPUT_MUTATION}
        placeholder_of = dict(zip(exported.io.input_names, signature.user_inputs))
        moved = [(written[placeholder_of[name]], name) for name in exported.io.updates]
        specs = [spec for _, spec in kept]
        specs += [OutputSpec(kind=OutputKind.USER_OUTPUT, arg=spec_arg(arg), target=None) for arg, _ in moved]
        out_spec = pytree.TreeSpec(tuple, None, [functional.call_spec.out_spec] + [pytree.treespec_leaf()] * len(moved))
        program = with_outputs(functional, [arg for arg, _ in kept] + [arg for arg, _ in moved], specs, out_spec)
    by_name = {spec.name: spec for spec in exported.io.inputs}
    extra = [TensorSpec(name=f"updated.{name}", dtype=by_name[name].dtype, shape=by_name[name].shape) for name in exported.io.updates]
    return attrs.evolve(exported, program=program, io=attrs.evolve(exported.io, outputs=(*exported.io.outputs, *extra)))


def spec_arg(node: Any) -> Any:
    """The ``TensorArgument`` naming an FX node in a graph signature."""
    from torch.export.graph_signature import TensorArgument

    return TensorArgument(name=node.name)
