"""The pure helpers of benchmarks/runtime_speed.py: prompts, stage timing, token comparison and the table (no runtime runs)."""

from __future__ import annotations

import doctest

import pytest

from benchmarks import runtime_speed as rs


def test_doctests():
    assert doctest.testmod(rs).failed == 0


def test_batch_four_is_left_padded_with_a_token_no_prompt_uses():
    sets = rs.prompts(50, prompt=16)
    assert sorted(sets) == ["1", "4"]
    assert sets["1"]["attention_mask"] == [[1] * 16]
    for ids, mask in zip(sets["4"]["input_ids"], sets["4"]["attention_mask"]):
        assert len(ids) == len(mask) == 16
        padding = mask.index(1)
        assert ids[:padding] == [rs.PAD] * padding and all(m == 1 for m in mask[padding:])
        assert all(3 <= token < 50 for token in ids[padding:])
    assert len({sum(mask) for mask in sets["4"]["attention_mask"]}) == 4


def test_timings_subtracts_the_first_token_from_the_whole_run():
    calls = []
    got = rs.timings(lambda n: calls.append(n) or [[n]], tokens=5, repeats=2)
    assert calls == [5, 1, 5, 1, 5]
    assert got["tokens"] == [[5]] and got["prefill_ms"] >= 0


def test_every_contender_has_a_unique_name_and_runtimes_known_to_pin_threads():
    rows = rs.contenders(1)
    assert {"eager", "hfx-pt2", "hfx-onnx", "hfx-pte", "hfx-ov", "hfx-ov-stateful", "ov-genai", "ort-genai"} <= set(rows)
    known = {"torch", "onnxruntime", "executorch", "openvino", "openvino_genai", "onnxruntime_genai"}
    assert all(set(row.runtimes) <= known for row in rows.values())


def _results():
    run = {"prefill_ms": 10.0, "decode_ms": 2.0, "tokens": [[1, 2]]}
    rows = {
        "eager": {"runs": {"1": run}, "peak_rss_mb": 100.0, "size_mb": 50.0, "stages": None},
        "hfx-onnx": {"runs": {"1": {**run, "decode_ms": 1.0, "tokens": [[1, 3]]}}, "peak_rss_mb": 120.0,
                     "size_mb": 51.0, "stages": {"capture": 0.1, "export": 2.0, "lower": 3.0, "save": 0.5}},
        "ort-genai": {"runs": {"1": {**run, "decode_ms": 4.0}}, "peak_rss_mb": 90.0, "size_mb": 50.0,
                      "stages": {"build": 1.0}},
        "hfx-pte": {"error": "timed out after 10 s"},
    }
    return {"prompts": {"1": {}}, "prompt": 8, "tokens": 2, "floor": {"decode_ms": 0.5}, "contenders": rows}


def test_the_table_gives_ratios_to_eager_and_genai_and_marks_tokens():
    results = _results()
    rs.compare_tokens(results["contenders"])
    assert results["contenders"]["hfx-onnx"]["same_tokens"] == {"1": False}
    assert results["contenders"]["ort-genai"]["same_tokens"] == {"1": True}
    text = rs.table(results)
    onnx_row = next(line for line in text.splitlines() if line.startswith("| hfx-onnx | 5.6 |"))
    assert onnx_row.split(" | ")[5:8] == ["1.00", "0.50", "0.25"]  # decode ms, vs eager, vs genai
    assert onnx_row.endswith("| no |")
    assert "| hfx-pte | timed out after 10 s |" in text
    assert "| floor (weight bytes / read bandwidth) | - | - | - | - | 0.50 | 0.25 | 0.12 |" in text
    assert "| contender | capture | export | lower | save | build | total | export peak RSS MB |" in text  # fixed stage order


def test_the_memory_table_measures_each_batch_peak_over_the_footprint_in_weights():
    results = _results()
    results["model"] = {"weight_bytes": 100 * 2**20}
    onnx = results["contenders"]["hfx-onnx"]
    onnx.update(footprint_mb=40.0, load_peak_rss_mb=150.0, file_rss_mb=12.0)
    onnx["runs"]["1"]["peak_rss_mb"] = 190.0
    text = rs.table(results)
    assert "| hfx-onnx | 40 | 150 | 190 | 1.50 | 12 |" in text  # (190 - 40) / 100
    assert "| eager | " not in text.split("Memory while generating")[1]  # no footprint measured, no row
    onnx_row = next(line for line in text.splitlines() if line.startswith("| hfx-onnx | 5.6 |"))
    assert onnx_row.split(" | ")[8] == "190"  # the batch's own peak, not the process's


def test_the_goals_table_rates_each_fast_path_against_its_goal_and_the_floor():
    run = {"prefill_ms": 100.0, "decode_ms": 25.0, "tokens": [[1, 2]], "peak_rss_mb": 200.0}
    rows = {
        "eager": {"runs": {"1": run}, "stages": None, "size_mb": 100.0},
        "ort-genai": {"runs": {"1": {**run, "decode_ms": 20.0}}, "stages": {"build": 1.0}, "size_mb": 100.0},
        "hfx-onnx": {"runs": {"1": {**run, "decode_ms": 21.0, "prefill_ms": 130.0}}, "size_mb": 101.0,
                     "stages": {"export": 10.0, "lower": 50.0}, "footprint_mb": 40.0},
        "hfx-aoti": {"runs": {"1": {**run, "decode_ms": 20.0, "tokens": [[1, 3]], "peak_rss_mb": 250.0}},
                     "size_mb": 120.0, "stages": {"export": 10.0, "lower": 115.0}, "footprint_mb": 40.0},
    }
    results = {"prompts": {"1": {}}, "prompt": 8, "tokens": 2, "floor": {"decode_ms": 18.0}, "contenders": rows,
               "model": {"weight_bytes": 100 * 2**20, "checkpoint_mb": 100.0}}
    rs.compare_tokens(rows)
    lines = rs.table(results).splitlines()
    assert "| ONNX decode vs ONNX Runtime GenAI | hfx-onnx | 1.05 | 1.1 | holds | 22.00 | 18.00 |" in lines
    assert "| ONNX prefill vs ONNX Runtime GenAI | hfx-onnx | 1.30 | 1.2 | **misses** | 120.00 | - |" in lines
    # 0.7 x eager's 25 ms is 17.5 ms, under the 18 ms floor
    assert ("| torch.export decode vs eager | hfx-aoti | 0.80 | 0.7 | **misses** (under the floor) | 17.50 | 18.00 |"
            in lines)
    assert "| ExecuTorch decode vs eager | hfx-pte-llm | - | 0.6 | - (under the floor) | 15.00 | 18.00 |" in lines
    assert "| hfx-onnx | 1.01 holds | 1.60 **misses** | 60.0 holds | yes |" in lines  # (200 - 40) / 100
    assert "| hfx-aoti | 1.20 **misses** | 2.10 **misses** | 125.0 **misses** | **no** |" in lines


def test_goals_stands_for_the_goal_contenders_and_every_one_is_a_contender():
    names = list(rs.contenders(1))
    assert set(rs.GOAL_CONTENDERS) <= set(names)
    assert rs.chosen_contenders("goals", names) == list(rs.GOAL_CONTENDERS)


def test_an_unknown_shape_is_refused():
    with pytest.raises(KeyError):
        rs.shape_config("llama-7b", None)
