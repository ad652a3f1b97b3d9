"""Constants an AOTInductor compile makes (max_autotune's packed weights): kept, saved, reloaded; opaque ones refused.

One tiny MLP is compiled with Inductor's C++ GEMM template alone (``max_autotune_gemm_backends="CPP"``), so the
template, not an autotuning race, decides that its weights are packed.
"""

from __future__ import annotations

import io
import re
import zipfile

import pytest
import torch

import hfx
from hfx.backends._aoti import lower_to_aoti
from hfx.backends._aoti_constants import library_constants, opaque_constants
from tests.tolerances import FP32_PARITY

CPP_GEMM = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(64, 96), torch.nn.Linear(96, 64)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(hidden)))


@pytest.fixture(scope="module")
def packed():
    """``(model, Exported, AotiProgram)``: the MLP exported with a dynamic batch, compiled with the C++ GEMM template."""
    model = _Mlp().eval()
    exported = hfx.export(hfx.capture({"hidden": torch.randn(3, 64)}, model))
    return model, exported, lower_to_aoti(exported, threads=1, inductor_configs=CPP_GEMM)


def test_the_weights_the_template_packed_are_kept_with_the_programs_own(packed):
    _, exported, program = packed
    own = exported.program.state_dict
    made = {name: tensor for name, tensor in program.constants.items() if name not in own}
    assert made, "the template packed no weight: the compile made no constant of its own"
    assert set(program._runner.get_constant_fqns()) == set(own) | set(made)  # what the library wants, all held
    packed_bytes = sorted(tensor.numel() for tensor in made.values())
    assert packed_bytes == sorted(own[f"{layer}.weight"].numel() for layer in ("up", "down"))  # one per linear
    # The library never reads the originals of the packed weights: the program holds an empty tensor for each, and
    # the rest are its own tensors, not copies.
    originals = {"up.weight", "down.weight"}
    assert all(program.constants[name].numel() == 0 and program.constants[name].dtype == own[name].dtype
               for name in originals)
    assert all(program.constants[name] is tensor for name, tensor in own.items() if name not in originals)


def test_the_library_reads_every_weight_it_did_not_pack():
    """Without the template nothing is packed: every weight is read, and the program holds them all as they are."""
    exported = hfx.export(hfx.capture({"hidden": torch.randn(3, 64)}, _Mlp().eval()))
    program = lower_to_aoti(exported, threads=1)
    assert all(program.constants[name] is tensor for name, tensor in exported.program.state_dict.items())


def test_a_saved_packed_program_stores_each_weight_once(packed, tmp_path):
    _, exported, program = packed
    path = hfx.save(tmp_path / "mlp", program)
    weights = sum(tensor.numel() * tensor.element_size() for tensor in exported.program.state_dict.values())
    stored = sum(file.stat().st_size for file in path.glob("*.safetensors"))
    assert weights <= stored <= weights + 4096  # the packed copies and the biases, plus the header


def test_aotinductor_still_leaves_them_out_of_a_weightless_package(packed):
    # The problem hfx.backends._aoti_constants handles: a package compiled with package_constants_in_so=False
    # wants the packed weights and holds none of their bytes, so only the compile could hand them over.
    _, exported, program = packed
    made = [t for name, t in program.constants.items() if name not in exported.program.state_dict]
    archive = zipfile.ZipFile(io.BytesIO(bytes(program.package)))
    contents = b"".join(archive.read(info) for info in archive.infolist())
    assert made and not any(tensor.detach().contiguous().numpy().tobytes()[:64] in contents for tensor in made)


def test_a_packed_program_matches_eager_at_a_new_batch_and_after_a_reload(packed, tmp_path):
    model, _, program = packed
    hidden = torch.randn(7, 64)
    with torch.no_grad():
        expected = model(hidden)
    assert (program(hidden=hidden) - expected).abs().max() <= FP32_PARITY
    loaded = hfx.load(hfx.save(tmp_path / "mlp", program), trust=True)
    assert set(loaded.constants) == set(program.constants)
    assert torch.equal(loaded(hidden=hidden), program(hidden=hidden))


def test_freezing_constants_in_onednns_opaque_layout_are_a_lowering_error():
    exported = hfx.export(hfx.capture({"hidden": torch.randn(3, 64)}, _Mlp().eval()))
    expected = ("[lower_to_aoti] component 'model' of _Mlp: the compile made constants in oneDNN's opaque layout "
                "(_frozen_param")
    with torch.no_grad(), pytest.raises(hfx.LoweringError, match=re.escape(expected)) as info:
        lower_to_aoti(exported, threads=1, inductor_configs={"freezing": True})
    assert "Leave `freezing` out of inductor_configs" in str(info.value)


def test_library_constants_are_those_the_program_lacks_and_opaque_ones_are_named():
    weight, packed_weight = torch.ones(2, 3), torch.zeros(1, 3, 2)
    assert library_constants({"w": weight, "constant3": packed_weight}, {"w": weight}) == {"constant3": packed_weight}
    assert opaque_constants({"dense": weight, "packed": torch.randn(2, 3).to_mkldnn()}) == ["packed"]
