"""The float32 tolerances of the tests, each with the reason for its size.

float32 rounds each operation to a relative ``u = 2**-24 ~ 6e-8``. Two programs that compute the same
function with the same float32 inputs differ only where they add or multiply in another order: a blocked
GEMM, a fused norm, a kernel written for AVX2 or for AVX-512 (each ISA's kernels block and use FMA
differently, so this is also what separates two CPUs). A sum of ``K`` terms reordered is off by about
``sqrt(K) * u * |terms|`` (the rounding errors are independent, so they add in quadrature), at most
``K * u * |terms|``. The zoo's models reduce over at most 256 terms (a 256-token vocabulary, hidden <= 128,
intermediate <= 256) of magnitude up to ~10 (the random init of 0.2 for decoders), through <= 2 layers: a
reduction errs by ~16 * 6e-8 * 10 = 1e-5 and the ~10 reductions in series between input and output by
~sqrt(10) * 1e-5 = 3e-5. The bounds below keep a factor 3 or more over those estimates, and hold whatever
the ISA, because the estimate does not depend on the order a kernel chose.
"""

from __future__ import annotations

#: A runtime's program against eager PyTorch, whole model, float32 (``hfx.verify``'s default atol): the
#: ~3e-5 estimate above with a factor 3, for outputs of magnitude up to ~10.
FP32_PARITY = 1e-4
#: Added to ``FP32_PARITY`` times an output's largest magnitude where outputs grow past ~10 (the error above
#: scales with ``|terms|``): 5e-5 keeps the same margin (``benchmarks/coverage.py`` uses it too).
FP32_PARITY_RTOL = 5e-5
#: One block or kernel against its reference (one attention, one norm, one conv, a patched function):
#: one or two reductions of <= 256 terms of magnitude <= 10, ~1e-6 each; a factor 10 over that.
FP32_ONE_BLOCK = 1e-5
#: The same kernels in the same order on both sides, differing by a few roundings at most (a copy through
#: another layout, an exact decomposition, a reduction split at a chunk boundary): a few ulps of values <= 10.
FP32_SAME_KERNELS = 1e-6
