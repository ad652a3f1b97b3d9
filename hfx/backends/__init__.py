"""Runtimes hfx lowers to. Each module imports its runtime lazily, at call time.

Per runtime, ``_<runtime>.py`` holds the lowering and ``_<runtime>_fixes.py`` the
workarounds of that runtime's bugs, as one tuple each lowering takes as an option
(default shown): ``lower_to_pte(patches=PTE_PATCHES)``, ``lower_to_onnx(fixes=ONNX_FIXES)``,
``lower_to_ov(graph_fixes=OV_GRAPH_FIXES)``. ``_onnx_fusions.py`` holds the rewrites to ONNX
Runtime's fused operators, ``lower_to_onnx(fusions=ORT_FUSIONS)`` (the norms, the rotary and
``GroupQueryAttention`` / ``MultiHeadAttention``), ``_executorch_rewrites.py`` the edge-graph rewrites that let
XNNPACK take more of a graph, ``lower_to_pte(rewrites=XNNPACK_REWRITES)``. Read, extend or replace them.
"""

from hfx.backends._executorch_fixes import PTE_PATCHES as PTE_PATCHES
from hfx.backends._executorch_rewrites import XNNPACK_REWRITES as XNNPACK_REWRITES
from hfx.backends._executorch_rewrites import PteRewrite as PteRewrite
from hfx.backends._onnx_fixes import ONNX_FIXES as ONNX_FIXES
from hfx.backends._onnx_fixes import OnnxFix as OnnxFix
from hfx.backends._onnx_fusions import ORT_ATTENTION_FUSIONS as ORT_ATTENTION_FUSIONS
from hfx.backends._onnx_fusions import ORT_FUSIONS as ORT_FUSIONS
from hfx.backends._onnx_fusions import OnnxFusion as OnnxFusion
from hfx.backends._openvino_fixes import OV_GRAPH_FIXES as OV_GRAPH_FIXES
from hfx.backends._openvino_fixes import OvGraphFix as OvGraphFix

__all__ = ["ONNX_FIXES", "ORT_ATTENTION_FUSIONS", "ORT_FUSIONS", "OV_GRAPH_FIXES", "PTE_PATCHES", "XNNPACK_REWRITES", "OnnxFix", "OnnxFusion", "OvGraphFix", "PteRewrite"]
