"""Bad input, one table: each case raises its exact error type, with a message that names the stage (or the
program called), the component and what to do.

The programs are a ``Linear`` exported with ``batch`` in [1, 8] and lowered to every installed runtime (the
``.pte`` is planned for batch <= 4), so the table costs seconds; the generation cases use the zoo Llama.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch

import hfx
from hfx import zoo

_RUNTIMES = {"pt2": None, "onnx": "onnxruntime", "ov": "openvino", "pte": "executorch"}
_LOWER = {"onnx": "lower_to_onnx", "ov": "lower_to_ov", "pte": "lower_to_pte"}
_PROGRAM = {"pt2": "Exported", "onnx": "OnnxProgram", "ov": "OvProgram", "pte": "PteProgram"}


@pytest.fixture(scope="module")
def linear():
    module = torch.nn.Linear(3, 4)
    capture = hfx.capture({"input": torch.ones(2, 3)}, module)
    exported = hfx.export(capture, bounds={"batch": (1, 8)})
    programs = {"pt2": exported}
    for runtime, package in _RUNTIMES.items():
        if package and importlib.util.find_spec(package):
            programs[runtime] = getattr(hfx, _LOWER[runtime])(exported)
    return {"module": module, "capture": capture, "exported": exported, "programs": programs}


@pytest.fixture(scope="module")
def llama(generative):
    model, parts = generative("llama")
    return {"model": model, "parts": parts, "capture": hfx.capture(zoo.inputs("llama"), model)}


@attrs.frozen
class Case:
    id: str
    run: Callable[[dict[str, Any]], Any]
    error: type[BaseException]
    match: str  # a regex the message must match: the stage or program, the component, what to do
    needs: str | None = None  # the runtime package the case needs


def _call(runtime: str, **kwargs: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda f: f["programs"][runtime](**kwargs)


def _program_cases(runtime: str) -> list[Case]:
    """The calling-contract cases on one runtime's program: names, dtype, rank, static and bounded sizes."""
    program, needs = rf"{_PROGRAM[runtime]}\(model\)", _RUNTIMES[runtime]
    limit = 4 if runtime == "pte" else 8
    return [
        Case(f"{runtime}-missing-input", _call(runtime), hfx.InputError, rf"{program} needs input\(s\) \['input'\]; it takes \['input'\]", needs),
        Case(f"{runtime}-unknown-input", _call(runtime, input=torch.ones(2, 3), other=torch.ones(1)), hfx.InputError,
             rf"{program} does not take input\(s\) \['other'\]; it takes \['input'\]", needs),
        Case(f"{runtime}-int-for-float", _call(runtime, input=torch.ones(2, 3, dtype=torch.int64)), hfx.InputError,
             rf"{program}: input 'input' must be float32, got int64", needs),
        Case(f"{runtime}-wrong-rank", _call(runtime, input=torch.ones(2, 3, 1)), hfx.InputError,
             rf"{program}: input 'input' must have 2 dims \['batch', 3\], got \[2, 3, 1\]", needs),
        Case(f"{runtime}-static-axis", _call(runtime, input=torch.ones(2, 5)), hfx.InputError,
             rf"{program}: axis 1 of input 'input' is static 3, got 5. Export with that axis dynamic", needs),
        Case(f"{runtime}-beyond-bounds", _call(runtime, input=torch.ones(limit + 1, 3)), hfx.InputError,
             rf"{program}: axis 0 of input 'input' \(batch\) is {limit + 1}, outside the program's bounds \[1, {limit}\]. "
             rf"Export again with bounds=\{{'batch': \(1, {limit + 1}\)\}}", needs),
        Case(f"{runtime}-empty-batch", _call(runtime, input=torch.ones(0, 3)), hfx.InputError,
             rf"{program}: axis 0 of input 'input' \(batch\) is 0, outside the program's bounds \[1, {limit}\]. "
             rf"Export again with bounds=\{{'batch': \(0, {limit}\)\}}", needs),
    ]


def _missing(package: str):
    """``importlib.util.find_spec`` as if ``package`` were not installed."""
    real = importlib.util.find_spec
    return lambda name, *args: None if name.split(".")[0] == package else real(name, *args)


_CASES = [
    *(case for runtime in _RUNTIMES for case in _program_cases(runtime)),
    Case("capture-unknown-input", lambda f: hfx.capture({"input": torch.ones(2, 3), "x": 1}, f["module"]), hfx.InputError,
         r"\[capture\] component 'model' of Linear: forward\(\) does not take input\(s\) \['x'\]. Remove them or rename"),
    Case("capture-not-a-module", lambda f: hfx.capture({"input": torch.ones(2, 3)}, object()), TypeError,
         r"capture: model must be a torch.nn.Module, got object"),
    Case("capture-inputs-not-a-mapping", lambda f: hfx.capture([torch.ones(2, 3)], f["module"]), TypeError,
         r"capture: inputs must be a mapping of forward\(\) keyword arguments, got list"),
    Case("export-bounds-min-above-max", lambda f: hfx.export(f["capture"], bounds={"batch": (5, 2)}), ValueError,
         r"infer_dynamic_shapes: bounds\['batch'\] must be \(min, max\) with ints 0 <= min <= max"),
    Case("export-bounds-not-a-mapping", lambda f: hfx.export(f["capture"], bounds=[("batch", 1, 2)]), TypeError,
         r"infer_dynamic_shapes: bounds must be a mapping \{dim name: \(min, max\)\}, got list; per-component bounds "
         r"go through hfx.by_component"),
    Case("export-patches-not-callables", lambda f: hfx.export(f["capture"], patches=[1]), TypeError,
         r"export: patches must be a tuple of zero-argument context-manager factories"),
    Case("lower-not-a-record", lambda f: hfx.lower_to_onnx(object()), TypeError,
         r"lower_to_onnx takes an Exported or a Capture \(or Components of them\), got object", "onnxruntime"),
    Case("onnx-opset-too-old", lambda f: hfx.lower_to_onnx(f["exported"], opset=7), ValueError,
         r"lower_to_onnx: opset must be an int in \[18, \d+\], got 7", "onnxruntime"),
    Case("onnx-missing-package", lambda f: hfx.lower_to_onnx(f["exported"]), ImportError,
         r"lower_to_onnx: this runtime needs onnxruntime, which is not installed. Install it with: pip install 'hfx\[onnx\]'",
         "onnxruntime"),
    Case("ov-missing-package", lambda f: hfx.lower_to_ov(f["exported"]), ImportError,
         r"lower_to_ov: this runtime needs openvino, which is not installed. Install it with: pip install 'hfx\[openvino\]'",
         "openvino"),
    Case("ov-unknown-device", lambda f: hfx.lower_to_ov(f["exported"], device="TPU"), hfx.LoweringError,
         r"\[lower_to_ov\] component 'model' of Linear: OpenVINO could not compile the model for device 'TPU'", "openvino"),
    Case("pte-max-sizes-unknown-dim", lambda f: hfx.lower_to_pte(f["exported"], max_sizes={"nope": 3}), ValueError,
         r"lower_to_pte: max_sizes names dim\(s\) \['nope'\] that 'model' does not have; its dynamic dims are \['batch'\]",
         "executorch"),
    Case("pte-max-sizes-above-the-export", lambda f: hfx.lower_to_pte(f["exported"], max_sizes={"batch": 99}), ValueError,
         r"lower_to_pte: max_sizes\['batch'\] = 99 is above the export's bound for 'batch', 8. Export again with "
         r"bounds=\{'batch': \(1, 99\)\}", "executorch"),
    Case("pte-constant-method-forward", lambda f: hfx.lower_to_pte(f["exported"], constant_methods={"forward": 1}),
         ValueError, r"lower_to_pte: constant_methods\['forward'\] must name a method other than 'forward'", "executorch"),
    Case("quantize-onnx-unknown-mode", lambda f: hfx.quantize_onnx(f["programs"]["onnx"], mode="int3"), ValueError,
         r"quantize_onnx: mode must be one of \['dynamic', 'int4', 'static'\], got 'int3'", "onnxruntime"),
    Case("quantize-onnx-an-exported", lambda f: hfx.quantize_onnx(f["exported"]), TypeError,
         r"quantize_onnx takes an OnnxProgram or Components of them, got Exported", "onnxruntime"),
    Case("quantize-onnx-static-without-calibration", lambda f: hfx.quantize_onnx(f["programs"]["onnx"], mode="static"),
         ValueError, r"quantize_onnx: mode 'static' observes activation ranges; pass calibration=", "onnxruntime"),
    Case("quantize-onnx-int4-reduce-range", lambda f: hfx.quantize_onnx(f["programs"]["onnx"], mode="int4", reduce_range=True),
         ValueError, r"quantize_onnx: reduce_range applies only to the modes that quantize activations to int8.*drop it",
         "onnxruntime"),
    Case("quantize-ov-unknown-mode", lambda f: hfx.quantize_ov(f["programs"]["ov"], mode="int3"), ValueError,
         r"quantize_ov: mode must be one of \['int4', 'int8', 'int8-static'\], got 'int3'", "openvino"),
    Case("quantize-pt2e-unknown-scheme", lambda f: hfx.quantize_pt2e(f["exported"], scheme="int3"), ValueError,
         r"quantize_pt2e: scheme must be one of \['8da4w', '8da8w', 'int8'\], got 'int3'", "executorch"),
    Case("quantize-pt2e-group-size", lambda f: hfx.quantize_pt2e(f["exported"], scheme="8da4w", group_size=7), ValueError,
         r"quantize_pt2e: group_size=7 does not divide the input size of linear layers of 'model' \(\[3\]\); pick a divisor",
         "executorch"),
    Case("verify-negative-tolerance", lambda f: hfx.verify(f["module"], {"input": torch.ones(2, 3)}, f["exported"], atol=-1),
         ValueError, r"verify: atol must be a number >= 0"),
    Case("save-onto-an-existing-file", lambda f: hfx.save(f["tmp"] / "file", f["exported"]), FileExistsError,
         r"save: .*file already exists; choose another directory or pass overwrite=True"),
    Case("load-not-an-export", lambda f: hfx.load(f["tmp"]), FileNotFoundError, r"load: .* has no hfx.json; it was not written by hfx.save"),
    Case("package-unknown-consumer", lambda f: hfx.package(f["tmp"] / "pkg", f["exported"], consumer="nope"), ValueError,
         r"package: unknown consumer 'nope'; hfx packages for \['executorch-runner', 'openvino-genai'"),
]

_GENERATION_CASES = [
    Case("decompose-options-for-a-model-that-cannot-generate",
         lambda ll: hfx.decompose(hfx.capture(zoo.inputs("bert"), zoo.build("bert")), multi_token_decode=True), ValueError,
         r"decompose: BertModel does not generate, so multi_token_decode has nothing to shape; drop it"),
    Case("decompose-internal-cache-for-a-model-that-cannot-generate",
         lambda ll: hfx.decompose(hfx.capture(zoo.inputs("bert"), zoo.build("bert")), internal_cache_length=8), ValueError,
         r"decompose\(internal_cache_length=...\): BertModel is not generative"),
    Case("generate-float-token-ids", lambda ll: hfx.generate({"input_ids": torch.ones(1, 2)}, ll["parts"]), hfx.InputError,
         r"Exported\(decode\): input 'input_ids' must be int64, got float32"),
    Case("generate-without-decompose", lambda ll: hfx.generate(zoo.inputs("llama"), ll["parts"]["decode"]), TypeError,
         r"generate: programs \(the last argument\) must be the Components of decompose, got Exported"),
    Case("generate-an-encoder-only-export", lambda ll: hfx.generate(zoo.inputs("bert"), hfx.decompose(
         hfx.capture(zoo.inputs("bert"), zoo.build("bert")))), hfx.InputError,
         r"generate takes the Components of decompose \(with a 'decode' component, or a 'language_model' that takes the "
         r"steps\), exported or lowered; got \['model'\]"),
]


def test_the_table_covers_at_least_25_bad_inputs():
    assert len(_CASES) + len(_GENERATION_CASES) >= 25
    assert len({case.id for case in [*_CASES, *_GENERATION_CASES]}) == len(_CASES) + len(_GENERATION_CASES)


@pytest.mark.parametrize("case", _CASES, ids=lambda case: case.id)
def test_a_bad_input_raises_its_error_with_what_to_do(case, linear, tmp_path, monkeypatch):
    if case.needs:
        pytest.importorskip(case.needs)
    if case.id.endswith("missing-package"):
        monkeypatch.setattr(importlib.util, "find_spec", _missing(case.needs))
    (tmp_path / "file").write_text("")
    with pytest.raises(BaseException) as info:  # noqa: PT011 - the exact type is asserted below
        case.run({**linear, "tmp": tmp_path})
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    assert info.match(case.match)


@pytest.mark.parametrize("case", _GENERATION_CASES, ids=lambda case: case.id)
def test_a_bad_generation_input_raises_its_error_with_what_to_do(case, llama):
    with pytest.raises(BaseException) as info:  # noqa: PT011 - the exact type is asserted below
        case.run(llama)
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    assert info.match(case.match)
