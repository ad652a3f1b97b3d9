"""Keep upstream prints, warnings, logs and native output away from the command line's user."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Iterator

from hfx.backends._common import captured_output

# Libraries whose log records, progress bars and warnings the user does not ask for.
_UPSTREAM_LOGGERS = (
    "torch", "torchao", "onnx", "onnx_ir", "onnxscript", "onnxruntime", "executorch", "openvino", "nncf",
    "transformers", "huggingface_hub",
)


@contextlib.contextmanager
def quiet(*, verbose: bool) -> Iterator[io.StringIO]:
    """Collect everything upstream code prints while the block runs, unless ``verbose``.

    Python-level output (prints, warnings, log records) goes through
    ``captured_output``; what native code writes to file descriptors 1 and 2
    (ONNX Runtime, ExecuTorch, OpenVINO) is collected too. The buffer yielded
    holds it all, for an error message; with ``verbose`` nothing is collected.
    """
    buffer = io.StringIO()
    if verbose:
        yield buffer
        return
    with captured_output(buffer, _UPSTREAM_LOGGERS), _native_output(buffer):
        yield buffer


@contextlib.contextmanager
def _native_output(buffer: io.StringIO) -> Iterator[None]:
    """Point file descriptors 1 and 2 at a temporary file while the block runs, then append it to ``buffer``."""
    with tempfile.TemporaryFile() as sink:
        saved = []
        try:
            for fd, stream in ((1, sys.__stdout__), (2, sys.__stderr__)):
                if stream is not None:
                    stream.flush()
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
        except OSError:  # no such descriptor (an embedded interpreter): Python-level capture still applies
            pass
        try:
            yield
        finally:
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            buffer.write(sink.read().decode(errors="replace"))
