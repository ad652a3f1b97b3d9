"""One-row matmuls in Inductor's reduction (hfx.backends._aoti_one_row): every weight's matmul behind a cond on
its row count, eager's numbers on one row and on many, eager's tokens, the choice recorded, and ``"auto"``'s
probe and rule.

AOTInductor compiles C++ (seconds per graph): an MLP with each kind of weight matmul and the one-layer Llama's
decomposed graphs are compiled once, with one thread.
"""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest
import torch

import hfx
from hfx import zoo
from hfx.backends import _aoti_one_row
from hfx.backends._aoti import lower_to_aoti, one_row_kernel
from hfx.backends._aoti_one_row import PROBE_BYTES, SLOW_ONE_ROW, aten_one_row_slowdown, chosen_kernel, probe_weights
from tests.helpers import eager_tokens
from tests.tolerances import FP32_PARITY

DIMS = hfx.DynamicShapes(axes={"input": {0: "batch", 1: "sequence"}},
                         bounds={"batch": (1, 16), "sequence": (1, 64)})


class _EveryMatmul(torch.nn.Module):
    """A weight's matmul in each form Inductor meets: ``Linear`` with and without a bias (``addmm``/``mm`` of the
    transposed weight) and GPT-2's ``Conv1D`` (``addmm``/``mm`` of a ``[k, n]`` weight); two on the same rows
    (a layer's gate and up, as its q, k and v)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.gate = torch.nn.Linear(64, 96, bias=False)
        self.down = torch.nn.Linear(96, 64, bias=False)
        self.conv_weight = torch.nn.Parameter(torch.randn(64, 32) / 8)
        self.conv_bias = torch.nn.Parameter(torch.randn(32))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        hidden = self.down(torch.nn.functional.gelu(self.up(input)) * self.gate(input))
        rows = hidden.reshape(-1, 64)
        conv = torch.addmm(self.conv_bias, rows, self.conv_weight)
        return (conv + rows @ self.conv_weight).reshape(*hidden.shape[:-1], 32)


def _wrapper_code(program) -> str:
    """The C++ of ``program``'s package (its wrapper and kernels)."""
    with zipfile.ZipFile(io.BytesIO(bytes(program.package))) as archive:
        return "".join(archive.read(name).decode() for name in archive.namelist() if name.endswith(".cpp"))


@pytest.fixture(scope="module")
def every_matmul():
    """``(model, its AotiProgram with one_row_matmuls="inductor", how many matmuls the pass rewrote)``."""
    torch.manual_seed(0)
    model = _EveryMatmul().eval()
    capture = hfx.capture({"input": torch.randn(2, 5, 64)}, model, dynamic_shapes=DIMS)
    rewritten = []
    rewrite = _aoti_one_row.rewrite_one_row_matmuls
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_aoti_one_row, "rewrite_one_row_matmuls", lambda graph: rewritten.append(rewrite(graph)))
        # no cached compile: the pass runs
        program = lower_to_aoti(capture, threads=1, one_row_matmuls="inductor",
                                inductor_configs={"fx_graph_cache": False})
    return model, program, sum(rewritten)


def test_every_weight_matmul_runs_behind_a_cond_with_a_reduction_for_one_row(every_matmul):
    _, program, rewritten = every_matmul
    assert program.one_row_matmuls == "inductor"
    assert rewritten == 5  # a torch whose post-grad graph hides a weight's matmul from the pass fails here
    code = _wrapper_code(program)
    conds = sorted(set(re.findall(r"hfx_one_row_reduce_\d+", code)))
    # the matmuls that take the same rows share a cond (up and gate); Inductor makes the second Conv1D matmul an
    # addmm of the first's result, so it has its own
    assert conds == [f"hfx_one_row_reduce_{i}" for i in range(4)], conds
    assert len(set(re.findall(r"hfx_one_row_matmul_\d+", code))) == 4


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (3, 1), (4, 7)], ids=lambda s: "x".join(map(str, s)))
def test_one_row_and_many_rows_give_eagers_numbers(every_matmul, shape):
    model, program, _ = every_matmul
    torch.manual_seed(1)
    input = torch.randn(*shape, 64)
    with torch.no_grad():
        want = model(input)
    torch.testing.assert_close(program(input=input), want, rtol=FP32_PARITY, atol=FP32_PARITY)


def test_the_decomposed_llama_generates_eagers_tokens_and_its_choice_survives_save_and_load(generative_one_layer,
                                                                                           tmp_path):
    model, parts = generative_one_layer("llama")
    programs = lower_to_aoti(parts, threads=1, one_row_matmuls="inductor")
    for shape in ({"batch": 1, "sequence": 6}, {"batch": 2, "sequence": 9}):  # one row per step, then two
        prompt = zoo.inputs("llama", **shape)
        assert torch.equal(hfx.generate(prompt, programs, max_new_tokens=6), eager_tokens(model, prompt, 6))
    path = hfx.save(tmp_path / "llama", programs)
    loaded = hfx.load(path, trust=True)
    assert {name: p.one_row_matmuls for name, p in loaded.items()} == dict.fromkeys(programs, "inductor")
    assert all(entry["inductor_configs"] == {} for entry in json.loads((path / "hfx.json").read_text())
               ["components"].values())  # the choice is the package's metadata, not a user setting


def test_auto_measures_unless_the_template_packs_the_weights_and_an_explicit_choice_is_kept():
    weights = [torch.ones(1024, 1024)] * 4  # too few distinct bytes to leave the caches: not measured
    assert one_row_kernel("auto", weights, threads=1, configs={}) == "aten"
    assert one_row_kernel("auto", weights, threads=1, configs={"max_autotune": True}) == "aten"
    assert one_row_kernel("inductor", weights, threads=1, configs={}) == "inductor"
    assert one_row_kernel("aten", weights, threads=1, configs={}) == "aten"
    assert chosen_kernel("auto", SLOW_ONE_ROW) == "inductor" and chosen_kernel("auto", SLOW_ONE_ROW * 0.99) == "aten"


def test_the_probe_reads_enough_weights_to_leave_the_caches_and_gives_a_ratio():
    weights = [torch.randn(1024, 512) for _ in range(PROBE_BYTES // (1024 * 512 * 4))]
    chosen = probe_weights(weights)
    assert sum(w.numel() * 4 for w in chosen) >= PROBE_BYTES
    assert 0.05 < aten_one_row_slowdown(chosen, rounds=3) < 50  # a ratio of two timings, whatever this CPU gives


def test_a_choice_that_is_not_one_is_refused_naming_the_stage():
    capture = hfx.capture({"input": torch.randn(2, 5, 64)}, _EveryMatmul().eval(), dynamic_shapes=DIMS)
    with pytest.raises(ValueError, match=r"^lower_to_aoti: one_row_matmuls must be one of 'auto', 'inductor', "
                                         r"'aten', got 'gemv'$"):
        lower_to_aoti(capture, one_row_matmuls="gemv")
