"""patch_covering_average_pool: EfficientNet's one-window average pool as the map's mean."""

from __future__ import annotations

import torch

import hfx
from hfx import zoo
from hfx.patches import covering_average_pool, patch_covering_average_pool
from tests.helpers import assert_leaves_forwards, forward_report_at_a_new_shape

EFFICIENTNET = "image-classification:efficientnet"


class _Pooled(torch.nn.Module):
    """A feature map pooled by a window of ``kernel`` (EfficientNet's head when the window covers the map)."""

    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.pooler = torch.nn.AvgPool2d(kernel, ceil_mode=True)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.pooler(pixel_values.tanh())


def test_the_mean_equals_the_clipped_window():
    pool = torch.nn.AvgPool2d(64, ceil_mode=True)
    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(covering_average_pool(pool)(x), pool(x))


def test_an_export_takes_the_maps_one_window_covers_and_no_more():
    model = _Pooled(kernel=40)
    with torch.no_grad():
        exported = hfx.export(hfx.capture({"pixel_values": torch.randn(2, 3, 8, 8)}, model))
    assert exported.program.graph_module.code.count("avg_pool2d") == 0
    assert exported.io.bounds["height"][1] == exported.io.bounds["width"][1] == 40
    x = torch.randn(3, 3, 33, 17)
    torch.testing.assert_close(exported(pixel_values=x), model(x))


def test_a_map_larger_than_the_window_keeps_the_pool_and_its_bounds():
    model = _Pooled(kernel=2)  # a ResNet-D-style 2x2 downsampling pool
    with patch_covering_average_pool(model):
        assert "forward" in vars(model.pooler)
    assert "forward" not in vars(model.pooler)
    exported = hfx.export(hfx.capture({"pixel_values": torch.randn(2, 3, 8, 8)}, model))
    assert exported.io.bounds["height"][1] is None
    assert "avg_pool2d" in exported.program.graph_module.code
    assert_leaves_forwards(patch_covering_average_pool, zoo.build("bert"))


def test_efficientnet_on_openvino_matches_eager_at_another_batch():
    report = forward_report_at_a_new_shape(EFFICIENTNET, hfx.lower_to_ov)
    assert report.passed, report
