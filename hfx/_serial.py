"""One lock around what two threads cannot run at once: torch's tracing and hfx's process-wide patches.

torch.export keeps its proxy dispatch mode and module hierarchy in process globals:
two exports at once fail ("ProxyTorchDispatchMode slot already occupied",
"_EXPORT_MODULE_HIERARCHY must not be None"). torch.onnx, OpenVINO's frontend and
ExecuTorch trace through the same machinery, and hfx's patches swap attributes of
classes and modules that every thread sees. So the stages that trace or patch
(``export``, ``decompose``, ``calibration_inputs``, the lowerings, ``quantize_pt2e``)
run one at a time; calling programs, ``verify`` and ``generate`` do not take the lock.
The same stages run their many-frames-deep loops over a graph's nodes on a reserved
frame stack (``hfx._stack``: CPython 3.11 and 3.12 map and unmap a stack chunk per call
across a chunk's edge).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hfx._stack import on_a_reserved_stack

_F = TypeVar("_F", bound=Callable[..., Any])

# Re-entrant: a stage that runs another (lower_to_pte exports again) takes it again in the same thread.
_TRACING = threading.RLock()


def one_at_a_time(function: _F) -> _F:
    """``function``, run under hfx's tracing lock (a call in another thread waits until this one returns), on a
    reserved frame stack (``hfx._stack.on_a_reserved_stack``).

    Example:
        >>> @one_at_a_time
        ... def traced(x):
        ...     return x + 1
        >>> traced(1)
        2
    """

    reserved = on_a_reserved_stack(function)

    @functools.wraps(function)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _TRACING:
            return reserved(*args, **kwargs)

    return locked  # type: ignore[return-value]
