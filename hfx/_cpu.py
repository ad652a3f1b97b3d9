"""What the CPU offers the int8 kernels: whether 8-bit dot products accumulate without saturating.

x86 int8 GEMM kernels multiply unsigned 8-bit activations by signed 8-bit weights. With VNNI
(``avx512_vnni``, ``avx_vnni``) or AMX (``amx_int8``) each product is added straight into an
int32 accumulator. Without them (AVX2, AVX-512 before Cascade Lake, every AMD CPU before Zen 4)
the kernels use ``vpmaddubsw``, which adds two products into a *saturating int16*: 2 x 255 x 127
= 64770 does not fit in 32767, so large activations times large weights are clipped. Weights of
7 bits (|w| <= 64: 2 x 255 x 64 = 32640) never saturate; that is ONNX Runtime's ``reduce_range``
and NNCF's ``OverflowFix.ENABLE``, both documented for CPUs without VNNI. Arm CPUs widen
before they add (``sdot``/``udot`` or ``smull`` + ``sadalp``), so they never saturate.

OpenVINO's CPU plugin runs oneDNN, which honours ``ONEDNN_MAX_CPU_ISA``: a cap below VNNI
(``AVX2``, ``AVX512_CORE``) gives a VNNI CPU the saturating kernels, which is how tests bring the
AVX2 behaviour onto an AVX-512 machine. ONNX Runtime (MLAS) and XNNPACK read the CPU alone.

Example:
    >>> int8_dot_product_without_saturation(frozenset({"avx2", "fma"}), machine="x86_64")
    False
    >>> int8_dot_product_without_saturation(frozenset({"avx2", "avx512_vnni"}), machine="x86_64")
    True
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

#: CPU flags (``/proc/cpuinfo`` spelling) whose int8 dot products accumulate in int32 without saturating.
INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "avx_vnni_int8"})
#: ``ONEDNN_MAX_CPU_ISA`` values below VNNI: oneDNN then runs the saturating kernels on any CPU.
_ONEDNN_CAPS_WITHOUT_VNNI = frozenset({"SSE41", "AVX", "AVX2", "AVX512_CORE"})
_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
#: Prefixes of the x86 flags that name instruction-set extensions: what a compiler may use under ``-march=native``
#: (``pni`` is SSE3). The other flags say how the CPU or its hypervisor behaves, not what code it runs.
_X86_ISA_PREFIXES = ("sse", "ssse3", "pni", "avx", "amx", "fma", "f16c", "bmi", "adx", "aes", "movbe", "abm", "lzcnt",
                     "popcnt", "sha_ni", "vaes", "vpclmulqdq", "gfni", "pclmulqdq", "rdrand", "rdseed", "xsave",
                     "clflushopt", "clwb", "movdir", "serialize", "3dnowprefetch", "cx16", "lahf_lm")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags in ``/proc/cpuinfo``'s lower-case spelling (empty where none can be read)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
        return frozenset()
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
                                 capture_output=True, text=True, check=False, timeout=5).stdout
        except OSError:
            return frozenset()
        # sysctl spells them AVX512VNNI / AVX2; map to /proc/cpuinfo's spelling for the VNNI check.
        return frozenset(f.lower().replace("avx512vnni", "avx512_vnni") for f in out.split())
    return frozenset()


def isa_flags(flags: frozenset[str] | None = None, *, machine: str | None = None) -> frozenset[str]:
    """The instruction-set extensions among this CPU's flags (or ``flags``): what native code built for it with
    ``-march=native`` may use. An Arm CPU's ``Features`` are all extensions.

    >>> sorted(isa_flags(frozenset({"fpu", "avx2", "fma", "hypervisor", "avx512f", "pni"}), machine="x86_64"))
    ['avx2', 'avx512f', 'fma', 'pni']
    """
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    if machine not in _X86:
        return flags
    return frozenset(flag for flag in flags if flag.startswith(_X86_ISA_PREFIXES))


def int8_dot_product_without_saturation(flags: frozenset[str] | None = None, *, machine: str | None = None) -> bool:
    """Whether int8 GEMMs on this CPU (or one with ``flags``) accumulate without int16 saturation.

    True on Arm and on x86 with VNNI or AMX; False on other x86 CPUs, and on an x86 CPU whose
    flags cannot be read (the safe answer: 7-bit weights lose little where they were not needed).
    """
    machine = (machine or platform.machine()).lower()
    if machine not in _X86:
        return True
    flags = cpu_flags() if flags is None else flags
    return bool(flags & INT8_DOT_PRODUCT_FLAGS)


def onednn_capped_below_vnni(environ: dict[str, str] | None = None) -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN (OpenVINO's CPU plugin) off its VNNI kernels."""
    cap = (os.environ if environ is None else environ).get("ONEDNN_MAX_CPU_ISA", "")
    return cap.strip().upper() in _ONEDNN_CAPS_WITHOUT_VNNI


def onednn_int8_without_saturation(flags: frozenset[str] | None = None, environ: dict[str, str] | None = None, *,
                                   machine: str | None = None) -> bool:
    """Whether OpenVINO's int8 kernels here accumulate without saturation: the CPU's answer, unless oneDNN is capped."""
    return int8_dot_product_without_saturation(flags, machine=machine) and not onednn_capped_below_vnni(environ)
