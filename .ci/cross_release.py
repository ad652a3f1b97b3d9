"""An export saved with one end of the tested window loads and generates eager's tokens with the other.

``python .ci/cross_release.py save DIR`` (in the oldest environment) exports the zoo's
tiny Llama, decomposed, to pt2 and ONNX under DIR; ``python .ci/cross_release.py check
DIR`` (in the newest) loads both and compares ``hfx.generate`` with eager
``model.generate`` of the same weights (saved beside them with ``save_pretrained``). Exits 1
on a difference. Each environment's own suite runs both ends alone; this is the crossing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers
from toolz import pipe

import hfx
from hfx import zoo

NEW_TOKENS = 12


def save(directory: Path) -> None:
    model = zoo.build("llama")
    model.save_pretrained(directory / "checkpoint")
    parts = pipe(model, hfx.capture(zoo.inputs("llama")), hfx.decompose, hfx.export)
    hfx.save(directory / "pt2", parts, overwrite=True)
    hfx.save(directory / "onnx", hfx.lower_to_onnx(parts), overwrite=True)
    print(f"saved with transformers {transformers.__version__}, torch {torch.__version__} to {directory}")


def check(directory: Path) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory / "checkpoint").eval()
    prompt = zoo.inputs("llama", batch=3, sequence=9)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    failed = 0
    for runtime in ("pt2", "onnx"):
        saved_with = hfx.load(directory / runtime)
        tokens = hfx.generate(prompt, saved_with, max_new_tokens=NEW_TOKENS)
        same = torch.equal(tokens, expected)
        failed += not same
        print(f"{runtime}: loaded with transformers {transformers.__version__}, torch {torch.__version__}: "
              f"{'eager tokens' if same else 'TOKENS DIFFER'}")
    return 1 if failed else 0


if __name__ == "__main__":
    action, where = sys.argv[1], Path(sys.argv[2])
    sys.exit(save(where) or 0 if action == "save" else check(where))
