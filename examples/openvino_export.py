"""Export a tiny random Llama to OpenVINO, check it on new shapes, save it, load it and call it.

Run:  python examples/openvino_export.py [directory]   (needs ``pip install 'hfx[openvino]'``)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from toolz import pipe

import hfx
from hfx import zoo


def main(directory: Path) -> None:
    model = zoo.build("llama")
    start = time.perf_counter()
    exported = pipe(model, hfx.capture(zoo.inputs("llama", batch=2, sequence=7)), hfx.export)
    program = hfx.lower_to_ov(exported)
    print(f"captured, exported and lowered in {time.perf_counter() - start:.1f}s")

    # Another batch size and sequence length than the capture, with a left-padded first row.
    new = zoo.inputs("llama", batch=3, sequence=11)
    report = hfx.verify(model, new, program)
    print(report)

    path = hfx.save(directory / "llama-openvino", program, overwrite=True)
    print(f"saved {sorted(p.name for p in path.iterdir())} to {path}")
    loaded = hfx.load(path)
    logits = loaded(**new).logits
    print(f"loaded and called: logits {tuple(logits.shape)}, next tokens {logits[:, -1].argmax(-1).tolist()}")
    if not report.passed:
        sys.exit(1)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
