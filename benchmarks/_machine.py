"""Which machine a benchmark ran on: the CPU, its vector ISA flags, the int8 kernels it gets, and the versions."""

from __future__ import annotations

import os
import platform
import subprocess


def machine() -> dict[str, str]:
    """The CPU model and its vector ISA flags (from lscpu), and the Python and library versions."""
    import importlib.metadata

    info = {"cpu": platform.processor() or platform.machine(), "isa": "", "cores": str(os.cpu_count())}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        lscpu = ""
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            info["cpu"] = value.strip()
        if key.strip() == "Flags":
            info["isa"] = " ".join(f for f in value.split() if f.startswith(("avx", "fma", "amx", "sse4", "f16c")))
    versions = []
    for package in ("torch", "transformers", "onnxruntime", "onnxruntime-genai", "executorch", "openvino"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    info["versions"] = ", ".join(versions)
    info["int8"] = int8_kernels()
    return info


def int8_kernels() -> str:
    """How int8 products accumulate here (``hfx._cpu``), and oneDNN's ISA cap when one is set."""
    from hfx._cpu import int8_dot_product_without_saturation, onednn_capped_below_vnni

    kind = "int32 (VNNI/AMX or Arm)" if int8_dot_product_without_saturation() else "saturating int16 pairs (no VNNI)"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    capped = f"; ONEDNN_MAX_CPU_ISA={cap} (OpenVINO {'without' if onednn_capped_below_vnni() else 'with'} VNNI)" if cap else ""
    torch_cap = os.environ.get("ATEN_CPU_CAPABILITY")
    return kind + capped + (f"; ATEN_CPU_CAPABILITY={torch_cap}" if torch_cap else "")
