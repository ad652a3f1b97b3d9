"""drop_resident_pages: a read-only mapping's resident pages dropped, its bytes the same when read again."""

from __future__ import annotations

import mmap
import sys

import pytest
import torch

import hfx
from hfx._mapped_pages import drop_resident_pages, read_back_page_by_page, read_only_mappings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and madvise are Linux's")


def _resident_kb(start: int) -> int:
    """Rss of the mapping that starts at ``start``, from ``/proc/self/smaps``."""
    lines = open("/proc/self/smaps").read().splitlines()  # noqa: SIM115
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{start:x}-"))
    return next(int(line.split()[1]) for line in lines[at + 1:] if line.startswith("Rss:"))


def test_the_pages_of_a_read_only_mapping_are_dropped_and_read_back_the_same(tmp_path):
    path = tmp_path / "weights.bin"
    data = bytes(range(256)) * (4 << 12)  # 4 MiB
    path.write_bytes(data)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data  # every page read: resident
        (start, _), = read_only_mappings(path)
        assert _resident_kb(start) >= 4096
        assert drop_resident_pages(path) >= len(data)
        assert _resident_kb(start) < 4096
        assert mapped[:] == data
    assert read_only_mappings(path) == [] and drop_resident_pages(path) == 0


def test_after_read_back_page_by_page_a_row_read_maps_one_small_page(tmp_path):
    path = tmp_path / "weights.bin"
    data = bytes(range(256)) * (32 << 12)  # 32 MiB, just written: the page cache may hold it in large folios
    path.write_bytes(data)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data
        (start, _), = read_only_mappings(path)
        drop_resident_pages(path)
        assert read_back_page_by_page(path)
        assert mapped[(16 << 20) + 5] == data[(16 << 20) + 5]  # one row of an embedding, say
        assert _resident_kb(start) <= 64  # a page (fault-around maps no more than 64 KB), not a 2 MB folio
        assert mapped[:] == data
    assert not read_back_page_by_page(path)  # no mapping left


def test_a_loaded_openvino_program_keeps_no_weight_pages_it_read_while_compiling(tmp_path):
    pytest.importorskip("openvino")
    from hfx import zoo

    name = "llama"
    model = zoo.build(name)
    exported = hfx.export(hfx.capture(zoo.inputs(name, batch=2, sequence=7), model))
    path = hfx.save(tmp_path / name, hfx.lower_to_ov(exported))
    program = hfx.load(path)
    weights = next(path.glob("*.bin"))
    mappings = read_only_mappings(weights)
    assert mappings and sum(_resident_kb(start) for start, _ in mappings) * 1024 < weights.stat().st_size // 4
    inputs = zoo.inputs(name, batch=3, sequence=11)
    torch.testing.assert_close(program(**inputs).logits, model(**inputs).logits, atol=1e-4, rtol=1e-4)
