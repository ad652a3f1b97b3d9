"""ExecuTorch's process-wide threadpool, sized before a ``PteProgram`` loads (hfx/backends/_executorch_threads.py)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest
import torch

import hfx

pytest.importorskip("executorch")

from hfx.backends._executorch_threads import pool_threads  # noqa: E402


def _linear():
    return hfx.capture({"input": torch.ones(2, 8)}, torch.nn.Linear(8, 4))


def test_a_program_on_the_pools_size_loads_and_another_size_is_refused_while_it_lives():
    program = hfx.lower_to_pte(_linear(), threads=pool_threads())
    assert program.threads == pool_threads()
    x = torch.randn(3, 8)
    expected = program(input=x)
    with pytest.raises(ValueError, match=r"one threadpool per process, now \d+ threads, and \d+ loaded program\(s\) "
                                         r"\(.*model.*\) run on it; this one asks for \d+\. .* pass threads="):
        attrs.evolve(program, threads=pool_threads() + 1)
    torch.testing.assert_close(program(input=x), expected)  # the pool it runs on was left as it was
    assert attrs.evolve(program, threads=None)(input=x).shape == (3, 4)
    with pytest.raises(ValueError, match="lower_to_pte: threads must be a positive int"):
        hfx.lower_to_pte(_linear(), threads=0)
    with pytest.raises(ValueError, match="PteProgram: threads must be a positive int"):
        attrs.evolve(program, threads=-1)


_FRESH = textwrap.dedent(
    """
    import gc, json, sys, torch, hfx
    from hfx import zoo
    from hfx.backends._executorch_threads import pool_threads
    from tests.helpers import one_layer

    model = one_layer("llama")
    parts = hfx.export(hfx.decompose(hfx.capture(zoo.inputs("llama"), model), multi_token_decode=True))  # one graph
    prompt = zoo.inputs("llama", batch=2, sequence=7)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    sizes = {"machine": pool_threads()}
    one = hfx.lower_to_pte(parts, threads=1)
    sizes["one"] = pool_threads()
    tokens = {"one": bool(torch.equal(hfx.generate(prompt, one, max_new_tokens=6), expected))}
    del one
    gc.collect()
    # Another size once those are gone: a matmul large enough for XNNPACK to split it over the pool's threads.
    linear = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    two = hfx.lower_to_pte(hfx.capture({"input": x}, linear), threads=2, max_sizes={"batch": 64})
    sizes["two"] = pool_threads()
    with torch.no_grad():
        tokens["two"] = bool(torch.allclose(two(input=x), linear(x), atol=1e-4))
    print(json.dumps({"sizes": sizes, "tokens": tokens}))
    """
)


def test_in_a_fresh_process_the_pool_takes_each_programs_threads_and_generation_runs_on_it():
    # The case that crashed when a call replaced the pool under a loaded method: generation with ExecuTorch's
    # kernels after the pool was sized, and a program of another size once the first programs are gone.
    result = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "threadpool" not in result.stderr  # ExecuTorch's notice of each new pool is kept back
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["sizes"]["one"] == 1 and found["sizes"]["two"] == 2
    assert found["tokens"] == {"one": True, "two": True}
    gc.collect()
