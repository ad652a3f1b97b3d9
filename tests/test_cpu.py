"""``hfx._cpu``: which CPUs' int8 kernels saturate, read from flags and from oneDNN's ISA cap."""

from __future__ import annotations

import platform

import pytest

from hfx._cpu import (
    cpu_flags,
    int8_dot_product_without_saturation,
    onednn_capped_below_vnni,
    onednn_int8_without_saturation,
)


@pytest.mark.parametrize(("flags", "machine", "expected"), [
    ({"sse4_2", "avx", "avx2", "fma"}, "x86_64", False),                          # AVX2 only: vpmaddubsw saturates
    ({"avx2", "avx512f", "avx512bw"}, "x86_64", False),                           # AVX-512 before VNNI (Skylake-X)
    ({"avx2", "avx512f", "avx512_vnni"}, "x86_64", True),                         # Cascade Lake, Zen 4
    ({"avx2", "avx_vnni"}, "AMD64", True),                                       # Alder Lake (AVX-VNNI), Windows name
    ({"avx2", "avx512f", "avx512_vnni", "amx_int8", "amx_tile"}, "x86_64", True),  # Sapphire Rapids
    (set(), "x86_64", False),                                                    # flags unknown: the safe answer
    ({"fp", "asimd"}, "aarch64", True),                                          # Arm widens before it adds
    (set(), "arm64", True),
])
def test_int8_dot_products_saturate_on_x86_without_vnni(flags, machine, expected):
    assert int8_dot_product_without_saturation(frozenset(flags), machine=machine) is expected


@pytest.mark.parametrize(("cap", "capped"), [
    ("AVX2", True), ("avx512_core", True), ("SSE41", True), ("AVX512_CORE_VNNI", False), ("AVX2_VNNI", False),
    ("AVX512_CORE_AMX", False), ("", False), (None, False),
])
def test_a_onednn_cap_below_vnni_is_seen(cap, capped):
    environ = {} if cap is None else {"ONEDNN_MAX_CPU_ISA": cap}
    assert onednn_capped_below_vnni(environ) is capped


def test_openvino_is_without_saturation_only_on_a_vnni_cpu_that_onednn_may_use():
    vnni = frozenset({"avx2", "avx512_vnni"})
    assert onednn_int8_without_saturation(vnni, {}, machine="x86_64") is True
    assert onednn_int8_without_saturation(vnni, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, machine="x86_64") is False
    assert onednn_int8_without_saturation(frozenset({"avx2"}), {}, machine="x86_64") is False


def test_this_machine_flags_are_read():
    flags = cpu_flags()
    if platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64"):
        assert {"sse2", "avx"} <= flags  # every x86-64 CPU that runs torch has these
