"""The constants an AOTInductor library wants that the exported program does not hold, read from its compile.

``lower_to_aoti`` keeps the weights out of the compiled library
(``aot_inductor.package_constants_in_so=False``) and hands the runner the
program's own tensors by name. Some Inductor settings make constants of their
own while compiling, and a library compiled that way wants them too:
``max_autotune``'s C++ GEMM template packs each weight it takes into a blocked
copy (``constant12``: a ``[n / 32, k, 32]`` layout of a ``[n, k]`` weight), and
``freezing`` renames the weights it folds (``_frozen_param3``). With the weights
out of the library these exist nowhere after the compile (torch drops them with
the graph: the runner only lists their names, ``get_constant_fqns``), so the
package could not run (pytorch/pytorch#142246 describes the weightless package
and ``load_constants``; nothing gives back what the compile made).

``recording_library_constants`` records every constant of each graph
``AotCodeCompiler.compile`` builds into a library, under the name its runner asks
for; ``library_constants`` keeps those the program lacks (the library wants them all).
They are dense tensors the program then holds with its own (and ``hfx.save``
writes beside them). A constant in oneDNN's opaque layout (``freezing`` packs
fp32 linears that way in AOT mode) has no bytes hfx can hold or save:
``opaque_constants`` names them so the lowering can refuse. The library never reads
the original of a weight the template packed (its C++ wrapper only declares it);
``unread_constants`` finds those in the wrapper's code, and the program holds an empty
tensor under each such name (``hfx.backends._aoti.held_constants``), so a packed layer
is held and saved once. Delete when a
weightless package can give back the constants its compile made.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from hfx.patches import swap_attr


def runner_name(graph: Any, name: str) -> str:
    """The name the compiled runner gives ``graph``'s constant ``name`` (``get_constant_fqns``): the weight's
    path in the model for one of its own, else the name Inductor allocated (the C++ wrapper's rule)."""
    if name in graph.dynamo_flat_name_to_original_fqn:
        return graph.dynamo_flat_name_to_original_fqn.get(name, name)
    return graph.allocated_constant_name.get(name, name)


# The lines of AOTInductor's C++ wrapper that only declare a constant: its entry in ``constants_info_`` and the
# reference ``run_impl`` takes to it whether or not a kernel reads it (torch 2.13.0 and 2.14.1).
_DECLARATION = re.compile(r'\s*(constants_info_\[\d+\]\.(name|original_fqn) = "[^"]*";'
                          r'|\[\[maybe_unused\]\] auto& \w+ = constants_->at\(\d+\);)\s*')


def unread_constants(wrapper_code: str, names: Collection[str]) -> set[str]:
    """The constants of ``names`` that ``wrapper_code`` (AOTInductor's C++ wrapper) declares and never reads: no
    kernel or call takes them, as the original of a weight the C++ GEMM template packed at compile time.

    A name the wrapper does not declare in the expected form counts as read.

    >>> code = "\\n".join(["[[maybe_unused]] auto& w = constants_->at(0);",
    ...                     "[[maybe_unused]] auto& p = constants_->at(1);", "mm(p.data_ptr());"])
    >>> unread_constants(code, ["w", "p"])
    {'w'}
    """
    declarations: list[str] = []
    rest: list[str] = []
    for line in wrapper_code.splitlines():
        (declarations if _DECLARATION.fullmatch(line) else rest).append(line)
    declared, rest_code = "\n".join(declarations), "\n".join(rest)
    return {name for name in names if re.search(rf"auto& {re.escape(name)} = constants_->at", declared)
            and not re.search(rf"\b{re.escape(name)}\b", rest_code)}


@contextlib.contextmanager
def recording_library_constants(record: dict[str, Any], read: dict[str, bool]) -> Iterator[None]:
    """While the block runs, each library AOTInductor compiles puts its graph's constants into ``record``, by the
    names its runner asks for (see the module's docstring), and into ``read`` whether any library reads them."""
    from torch._inductor.codecache import AotCodeCompiler

    compile_library = AotCodeCompiler.compile  # a classmethod: bound to the class

    def recording(graph: Any, *args: Any, **kwargs: Any) -> Any:
        wrapper_code = kwargs.get("wrapper_code", args[0] if args else None)
        unread = unread_constants(wrapper_code, graph.constants) if isinstance(wrapper_code, str) else set()
        for name in graph.constants:
            runner = runner_name(graph, name)
            record[runner] = graph.get_original_value_of_constant(name)
            read[runner] = read.get(runner, False) or name not in unread
        return compile_library(graph, *args, **kwargs)

    with swap_attr(AotCodeCompiler, "compile", staticmethod(recording)):
        yield


def library_constants(record: Mapping[str, Any], own: Collection[str]) -> dict[str, Any]:
    """The constants of ``record`` (every one the library wants) that the program does not hold (``own``).

    >>> import torch
    >>> library_constants({"w": torch.ones(1), "constant3": torch.zeros(2)}, ["w"])
    {'constant3': tensor([0., 0.])}
    """
    return {name: tensor for name, tensor in record.items() if name not in own}


def opaque_constants(constants: Mapping[str, Any]) -> list[str]:
    """The names of ``constants`` held in oneDNN's opaque layout, which no file hfx writes can hold."""
    return sorted(name for name, tensor in constants.items() if getattr(tensor, "is_mkldnn", False))
