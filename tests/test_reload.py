"""A saved export is complete: reloaded in a fresh process, each ``Exported`` lowers to every runtime again.

Export once on a big machine, lower later: a one-layer zoo Llama's decomposed ``decode`` (its cache in and out)
and a BERT forward are saved with ``hfx.save``; a new Python process loads them, lowers each to ONNX, OpenVINO and
ExecuTorch (those installed; BERT to ONNX and OpenVINO), checks every program against eager PyTorch on inputs of another batch and length
than the capture, and generates eager's tokens with the relowered decode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hfx
from hfx import zoo
from tests.helpers import CAPTURE_SHAPE, one_layer

_CHECK = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch, transformers
    import hfx
    from hfx import zoo
    from tests.helpers import NEW_SHAPE
    from tests.tolerances import FP32_PARITY

    root = sys.argv[1]
    lowerings = {"onnx": ("onnxruntime", hfx.lower_to_onnx), "ov": ("openvino", hfx.lower_to_ov),
                 "pte": ("executorch", hfx.lower_to_pte)}
    llama = transformers.AutoModelForCausalLM.from_pretrained(root + "/llama-model").eval()
    bert = transformers.AutoModel.from_pretrained(root + "/bert-model").eval()
    saved = {"decode": hfx.load(root + "/llama"), "bert": hfx.load(root + "/bert")}
    assert isinstance(saved["decode"]["decode"], hfx.Exported) and isinstance(saved["bert"], hfx.Exported)
    new_decode = hfx.decompose(hfx.capture(zoo.inputs("llama", **NEW_SHAPE), llama))["decode"].kwargs
    prompt = zoo.inputs("llama", batch=2, sequence=9)
    with torch.no_grad():
        expected = llama.generate(**prompt, max_new_tokens=8, do_sample=False)
    results = {}
    for runtime, (package, lower) in lowerings.items():
        if importlib.util.find_spec(package) is None:
            continue
        decode = lower(saved["decode"])
        results[runtime] = {
            "decode": hfx.verify(llama, dict(new_decode), decode["decode"], atol=FP32_PARITY).passed,
            "tokens": bool(torch.equal(hfx.generate(prompt, decode, max_new_tokens=8), expected)),
        }
        if runtime != "pte":  # a forward graph's .pte lowering is the decode's path without a cache
            bert_program = lower(saved["bert"])
            results[runtime]["bert"] = hfx.verify(bert, zoo.inputs("bert", **NEW_SHAPE), bert_program,
                                                  atol=FP32_PARITY).passed
    print(json.dumps(results))
    """
)


def test_a_saved_export_relowers_to_every_runtime_in_a_fresh_process(models, tmp_path):
    model = one_layer("llama")  # the same graphs, lowered again in the subprocess in less time
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama", **CAPTURE_SHAPE), model)))
    model.save_pretrained(tmp_path / "llama-model")
    models("bert").save_pretrained(tmp_path / "bert-model")
    hfx.save(tmp_path / "llama", parts)
    hfx.save(tmp_path / "bert", hfx.export(hfx.capture(zoo.inputs("bert", **CAPTURE_SHAPE), models("bert"))))
    result = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path)], capture_output=True, text=True,
                            timeout=900, cwd=Path(__file__).parents[1], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results, "no runtime is installed"
    assert all(all(checks.values()) for checks in results.values()), results
