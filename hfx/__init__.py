"""hfx: export Hugging Face Transformers models to torch.export, ONNX, ExecuTorch and OpenVINO.

A library of small pure functions over immutable records::

    from toolz import pipe
    import hfx

    onnx = pipe(model, hfx.capture(inputs), hfx.lower_to_onnx)
    outputs = onnx(**new_inputs)
"""

from hfx._as_model import as_model as as_model
from hfx._capture.capture import capture as capture
from hfx._capture.decompose import decompose as decompose
from hfx._capture.dynamic_shapes import infer_dynamic_shapes as infer_dynamic_shapes
from hfx._capture.vision_inputs import vision_inputs as vision_inputs
from hfx._errors import CaptureError as CaptureError
from hfx._errors import ComponentError as ComponentError
from hfx._errors import HfxError as HfxError
from hfx._errors import InputError as InputError
from hfx._errors import LoweringError as LoweringError
from hfx._errors import PatchError as PatchError
from hfx._export.export import export as export
from hfx._export.signature import flatten_signature as flatten_signature
from hfx._generate import generate as generate
from hfx._lift import by_component as by_component
from hfx._lift import per_component as per_component
from hfx._package.package import package as package
from hfx._upstream import UntestedVersionWarning as UntestedVersionWarning
from hfx._upstream import check_window
from hfx._records import Capture as Capture
from hfx._records import ComponentRoles as ComponentRoles
from hfx._records import Components as Components
from hfx._records import DynamicShapes as DynamicShapes
from hfx._records import EncoderInputs as EncoderInputs
from hfx._records import Exported as Exported
from hfx._records import GenerationMeta as GenerationMeta
from hfx._records import GenerationSettings as GenerationSettings
from hfx._records import IoSpec as IoSpec
from hfx._records import ModelSpec as ModelSpec
from hfx._records import TensorSpec as TensorSpec
from hfx._save import load as load
from hfx._save import save as save
from hfx._verify import Report as Report
from hfx._verify import verify as verify
from hfx._version import __version__ as __version__
from hfx.backends._aoti import AotiProgram as AotiProgram
from hfx.backends._aoti import lower_to_aoti as lower_to_aoti
from hfx.backends._executorch import PteProgram as PteProgram
from hfx.backends._executorch import PteWeights as PteWeights
from hfx.backends._executorch import lower_to_pte as lower_to_pte
from hfx.backends._onnx import OnnxProgram as OnnxProgram
from hfx.backends._onnx import lower_to_onnx as lower_to_onnx
from hfx.backends._openvino import OvProgram as OvProgram
from hfx.backends._openvino import lower_to_ov as lower_to_ov
from hfx.patches import with_patches as with_patches
from hfx.quantize import calibration_inputs as calibration_inputs
from hfx.quantize import quantize_onnx as quantize_onnx
from hfx.quantize import quantize_ov as quantize_ov
from hfx.quantize import quantize_pt2e as quantize_pt2e

__all__ = [
    "AotiProgram",
    "Capture",
    "CaptureError",
    "ComponentError",
    "ComponentRoles",
    "Components",
    "DynamicShapes",
    "EncoderInputs",
    "Exported",
    "GenerationMeta",
    "GenerationSettings",
    "HfxError",
    "InputError",
    "IoSpec",
    "LoweringError",
    "ModelSpec",
    "OnnxProgram",
    "OvProgram",
    "PteProgram",
    "PteWeights",
    "PatchError",
    "Report",
    "TensorSpec",
    "UntestedVersionWarning",
    "__version__",
    "as_model",
    "by_component",
    "calibration_inputs",
    "capture",
    "decompose",
    "export",
    "flatten_signature",
    "generate",
    "infer_dynamic_shapes",
    "load",
    "lower_to_aoti",
    "lower_to_onnx",
    "lower_to_ov",
    "lower_to_pte",
    "package",
    "per_component",
    "quantize_onnx",
    "quantize_ov",
    "quantize_pt2e",
    "save",
    "verify",
    "vision_inputs",
    "with_patches",
]


for _distribution in ("torch", "transformers"):  # the runtimes' packages are checked when a stage first needs them
    check_window(_distribution)
del _distribution, check_window
