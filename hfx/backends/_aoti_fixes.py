"""AOTInductor's workarounds: what ``lower_to_aoti`` sets around ``aoti_compile_and_package`` (torch 2.13, 2.14).

Each names the model pattern it handles, does nothing where that pattern is
absent, leaves the ``Exported`` as it was after the compile, and can be deleted
on its own once torch fixes the bug it names.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from hfx._export.export import program_shape_env


@contextlib.contextmanager
def contiguous_inputs(program: Any) -> Iterator[None]:
    """``program``'s user inputs recorded as contiguous tensors while the block runs (their values put back
    after). AOTInductor compiles for the strides the graph records, and a capture can record a slice's: LLaVA's
    image features without the class token (``[n, 16, 32]`` at stride 544 = 17 x 32), and the code compiled for
    it read past each image of a contiguous input. The call gives contiguous inputs (``hfx.backends._aoti.contiguous``)."""
    import torch

    users = set(program.graph_signature.user_inputs)
    nodes = [node for node in program.graph.nodes if node.op == "placeholder" and node.name in users]
    before = [node.meta.get("val") for node in nodes]
    for node, value in zip(nodes, before, strict=True):
        if isinstance(value, torch.Tensor):
            node.meta["val"] = value.clone(memory_format=torch.contiguous_format)
    try:
        yield
    finally:
        for node, value in zip(nodes, before, strict=True):
            node.meta["val"] = value


@contextlib.contextmanager
def unbacked_sizes_within_int64(program: Any) -> Iterator[None]:
    """``program``'s data-dependent sizes bounded by int64's largest size while the block runs (their ranges put
    back after).

    torch.fx's ``insert_deferred_runtime_asserts`` takes an unbacked size bounded by ``sys.maxsize - 1`` as
    unbounded, but not one bounded by a multiple of it: a boolean mask over a data-dependent count of rows
    (Idefics3's and SmolVLM's patch mask, ``[images, 16]`` of the real images) selects up to ``16 x (2^63 - 2)``
    elements, and Inductor asserts that bound as a C++ literal its printer refuses ("OverflowError: ... too big
    to convert to int64_t"). An int64 size never passes ``sys.maxsize - 1``; nothing changes where no bound does.
    """
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges

    env = program_shape_env(program)
    ranges = {} if env is None else env.var_to_range
    # written directly, not through ShapeEnv._update_var_to_range, which only ever narrows: the ranges go back after
    narrowed = {symbol: bounds for symbol, bounds in ranges.items()
                if bounds.is_int and isinstance(bounds.upper, sympy.Integer) and int(bounds.upper) > sys.maxsize - 1}
    for symbol, bounds in narrowed.items():
        ranges[symbol] = ValueRanges(bounds.lower, sys.maxsize - 1)
    try:
        yield
    finally:
        ranges.update(narrowed)


def convolves_a_data_dependent_batch(program: Any) -> bool:
    """Whether a convolution of ``program`` takes an input whose sizes are computed from data.

    Inductor's layout optimisation gives such a convolution a channels-last input,
    but cannot tell from the unbacked batch that ATen's convolution then returns
    channels-last too: the compiled code reads the output as contiguous NCHW
    (Idefics3's and SmolVLM's patch embedding of the real images, ``pixel_values[
    real_images]``: embeddings off by ~4). ``lower_to_aoti`` compiles such a
    program with ``layout_optimization`` off.
    """
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    convolutions = (torch.ops.aten.convolution.default, torch.ops.aten.conv1d.default, torch.ops.aten.conv2d.default,
                    torch.ops.aten.conv3d.default, torch.ops.aten.conv2d.padding, torch.ops.aten.conv1d.padding,
                    torch.ops.aten.conv3d.padding)
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in convolutions:
            value = node.args[0].meta.get("val")
            if isinstance(value, torch.Tensor) and free_unbacked_symbols(value.shape):
                return True
    return False
