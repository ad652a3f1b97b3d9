"""drop_resident_pages: a read-only mapping's resident pages dropped, its bytes the same when read again."""

from __future__ import annotations

import mmap
import sys

import pytest
import torch

import hfx
from hfx._mapped_pages import drop_resident_pages, mappings, read_back_page_by_page, read_only_mappings
from tests.helpers import TiedHead

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and madvise are Linux's")


def _resident_kb(start: int) -> int:
    """Rss of the mapping that starts at ``start``, from ``/proc/self/smaps``."""
    lines = open("/proc/self/smaps").read().splitlines()  # noqa: SIM115
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{start:x}-"))
    return next(int(line.split()[1]) for line in lines[at + 1:] if line.startswith("Rss:"))


def _advised_random(start: int) -> bool:
    """Whether the mapping that starts at ``start`` reads without readahead (``MADV_RANDOM``: ``rr`` in its VmFlags)."""
    lines = open("/proc/self/smaps").read().splitlines()  # noqa: SIM115
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{start:x}-"))
    flags = next(line for line in lines[at + 1:] if line.startswith("VmFlags:"))
    return "rr" in flags.split()


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


def test_the_locked_pages_of_a_read_only_mapping_are_unlocked_and_dropped(tmp_path):
    """ExecuTorch's data loader locks what it maps (``mlock``), which ``madvise`` alone would refuse to drop."""
    import ctypes
    import ctypes.util

    path = tmp_path / "weights.bin"
    data = bytes(range(256)) * (1 << 12)  # 1 MiB
    path.write_bytes(data)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        (start, end), = read_only_mappings(path)
        if libc.mlock(start, end - start) != 0:
            pytest.skip("this process may not lock 1 MiB (RLIMIT_MEMLOCK)")
        assert _resident_kb(start) >= 1024  # locking read every page
        assert drop_resident_pages(path) >= len(data)
        assert _resident_kb(start) < 1024
        assert mapped[:] == data


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


def test_a_copy_on_write_mapping_is_read_back_page_by_page_and_its_pages_are_not_dropped(tmp_path):
    path = tmp_path / "weights.bin"
    data = bytes(range(256)) * (32 << 12)
    path.write_bytes(data)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        assert read_only_mappings(path) == []
        (start, _), = mappings(path, read_only=False)
        mapped[7] = 1  # a private page now differs from the file: dropping it would lose the write
        assert drop_resident_pages(path) == 0
        assert read_back_page_by_page(path) and _advised_random(start)
        assert mapped[(16 << 20) + 5] == data[(16 << 20) + 5]
        assert _resident_kb(start) <= 2 * 64
        assert mapped[7] == 1 and mapped[8:] == data[8:]
    assert path.read_bytes() == data


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


def test_a_loaded_onnx_program_reads_the_rows_of_its_mapped_weights_a_page_at_a_time(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from hfx import zoo
    from hfx.backends import _onnx

    name = "llama"
    model = zoo.build(name)
    path = hfx.save(tmp_path / name, hfx.lower_to_onnx(hfx.export(hfx.capture(zoo.inputs(name), model))))
    monkeypatch.setattr(_onnx, "_LOAD_IN_MEMORY_LIMIT", 10_000)  # the weights stay in the saved file
    program = hfx.load(path)
    weights = next(path.glob("*.data"))
    mapped = mappings(weights, read_only=False)  # ONNX Runtime's private mapping of the embedding
    assert mapped and all(_advised_random(start) for start, _ in mapped)
    inputs = zoo.inputs(name, batch=3, sequence=11)
    torch.testing.assert_close(program(**inputs).logits, model(**inputs).logits, atol=1e-4, rtol=1e-4)


def test_a_loaded_executorch_program_keeps_no_weight_pages_it_read_while_loading(tmp_path):
    pytest.importorskip("executorch")
    torch.manual_seed(0)
    model = TiedHead(vocab=1024).eval()
    exported = hfx.export(hfx.capture({"input_ids": torch.randint(0, 1024, (2, 7))}, model))
    path = hfx.save(tmp_path / "tied", hfx.lower_to_pte(exported))
    program = hfx.load(path)
    weights = next(path.glob("*.ptd"))
    mapped = read_only_mappings(weights)  # the runtime's (locked) mappings of the table its lookup reads in place
    table = model.embed.weight  # locked and resident whole before
    assert mapped and sum(_resident_kb(start) for start, _ in mapped) * 1024 < table.numel() * table.element_size() // 4
    ids = torch.randint(0, 1024, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(program(input_ids=ids), model(ids), atol=1e-5, rtol=0)
