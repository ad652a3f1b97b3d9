"""AOTInductor's workarounds (hfx.backends._aoti_fixes): each finds its pattern, leaves the graph as it was, and the
pattern's compiled program gives eager's outputs on another batch."""

from __future__ import annotations

import torch

import hfx
from hfx.backends._aoti import lower_to_aoti
from hfx.backends._aoti_fixes import convolves_a_data_dependent_batch, unbacked_sizes_within_int64
from tests.tolerances import FP32_PARITY

class RealImages(torch.nn.Module):
    """Idefics3's vision pattern: the images that are not all padding, patch-embedded and projected (16 x their
    count rows), then a boolean mask over their patches (a data-dependent count bounded by 16 x the images')."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4)
        self.project = torch.nn.Linear(8, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        real = images[images.flatten(1).sum(-1) != 0]
        projected = self.project(self.patches(real).flatten(2).transpose(1, 2))  # [real, 16, 4]
        return projected[projected.sum(-1) > 0]


class Images(RealImages):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.patches(images).flatten(2).transpose(1, 2)


def _exported(model: torch.nn.Module) -> hfx.Exported:
    """``model`` exported with the batch inferred dynamic, unbounded as a model's is."""
    return hfx.export(hfx.capture({"images": torch.randn(2, 3, 16, 16)}, model.eval()))


def test_a_convolution_of_data_dependent_images_is_found_and_one_of_the_inputs_batch_is_not():
    assert convolves_a_data_dependent_batch(_exported(RealImages()).program)
    assert not convolves_a_data_dependent_batch(_exported(Images()).program)


def test_bounds_over_int64_are_narrowed_inside_the_block_and_put_back_after():
    program = _exported(RealImages()).program
    before = dict(program.range_constraints)
    env = next(s.node.shape_env for n in program.graph.nodes
               for s in getattr(n.meta.get("val"), "shape", ()) if isinstance(s, torch.SymInt))
    over = {str(k): v for k, v in env.var_to_range.items() if v.is_int and v.upper.is_Integer and v.upper > 2**63}
    assert over  # the mask's count: 16 x the real images' bound
    with unbacked_sizes_within_int64(program):
        assert all(int(env.var_to_range[k].upper) == 2**63 - 2 for k in env.var_to_range if str(k) in over)
    assert {str(k): v for k, v in env.var_to_range.items() if str(k) in over} == over
    assert dict(program.range_constraints) == before


def test_real_images_compile_and_give_eagers_outputs_on_another_batch():
    # without the fixes: "OverflowError: ... too big to convert to int64_t", then outputs off by ~2.4; the
    # projection's rows are data-dependent, which the one-row rewrite leaves to ATen (else an OverflowError too)
    model = RealImages().eval()
    exported = _exported(model)
    program = lower_to_aoti(exported, threads=1, one_row_matmuls="inductor")
    images = torch.randn(5, 3, 16, 16)
    images[1] = 0
    with torch.no_grad():
        want = model(images)
    torch.testing.assert_close(program(images=images), want, rtol=FP32_PARITY, atol=FP32_PARITY)
    assert convolves_a_data_dependent_batch(exported.program)  # the Exported is left as it was
