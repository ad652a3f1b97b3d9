"""EfficientNet-style average pooling whose one window covers the feature map, as a mean.

EfficientNet and ALIGN (transformers 5.22-5.24) pool the last feature map with
``nn.AvgPool2d(config.hidden_dim, ceil_mode=True)``: a 2560-wide window (1280 for B0) over a map
of a few pixels, which torch clips to the map (one output, the map's mean). OpenVINO 2026.4
compiles the pooling and fails at run time ("Kernel after dilation has size (dim: 2560) larger
than the data shape after padding (dim: 2)").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from hfx.patches._core import size_at_trace, swap_attr


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[-1])


def _is_window_per_map(pool: torch.nn.Module) -> bool:
    """Whether ``pool`` is an ``AvgPool2d`` that clips a window of its own stride (no padding): the pattern."""
    return (isinstance(pool, torch.nn.AvgPool2d) and pool.ceil_mode and pool.divisor_override is None
            and _pair(pool.padding) == (0, 0) and _pair(pool.stride or pool.kernel_size) == _pair(pool.kernel_size))


def covering_average_pool(pool: torch.nn.AvgPool2d) -> Callable[[torch.Tensor], torch.Tensor]:
    """``pool``'s forward, as the mean of the whole map where the traced map fits in one window.

    Where it fits, the program keeps the sizes that do (a map larger than the window is an
    ``InputError`` naming the dim); elsewhere it is ``pool``'s own forward, without a guard.

    >>> pool = torch.nn.AvgPool2d(64, ceil_mode=True)
    >>> x = torch.randn(1, 2, 3, 5)
    >>> torch.allclose(covering_average_pool(pool)(x), pool(x))
    True
    """
    original = type(pool).forward
    height, width = _pair(pool.kernel_size)

    def forward(input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.AvgPool2d's own argument name
        rows, columns = input.shape[-2:]
        if size_at_trace(rows) > height or size_at_trace(columns) > width:
            return original(pool, input)
        torch._check(rows <= height)  # the program then takes the maps one window covers
        torch._check(columns <= width)
        return input.mean(dim=(-2, -1), keepdim=True)

    return forward


@contextlib.contextmanager
def patch_covering_average_pool(model: torch.nn.Module) -> Iterator[None]:
    """Run each ``AvgPool2d`` of ``model`` whose one window covers its traced map as the map's mean in the block.

    Model pattern: ``nn.AvgPool2d(kernel, ceil_mode=True)`` with no padding over a smaller map
    (EfficientNet's and ALIGN's ``pooler``, ``kernel = config.hidden_dim``). torch clips the window
    to the map, so the mean is the same number; OpenVINO refuses a window larger than its input.
    A pool whose traced map is larger than its window runs as it is. A no-op for other models.
    Delete when OpenVINO clips the window as torch does.

    Args:
        model: the model to export; its pooling modules (instances, not their class) are patched.
    """
    pools = [m for m in model.modules() if _is_window_per_map(m)]
    with contextlib.ExitStack() as stack:
        for pool in pools:
            stack.enter_context(swap_attr(pool, "forward", covering_average_pool(pool)))
        yield
