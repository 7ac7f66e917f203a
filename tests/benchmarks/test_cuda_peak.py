"""The allocator-history replay the GPU check uses to say what was live at its peak (benchmarks/cuda_peak.py),
on a trace written by hand."""
from __future__ import annotations

from benchmarks import cuda_peak

OURS = {"filename": "/x/src/unifiedplayers/trainer/loss.py", "line": 40, "name": "policy_loss"}
DS = {"filename": "/site/deepspeed/runtime/zero/partition_parameters.py", "line": 9, "name": "_all_gather"}
TORCH = {"filename": "/site/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"}


def test_site_is_the_innermost_named_frame_and_ours_under_it():
    assert cuda_peak.site_of([TORCH, DS, TORCH, OURS]) == (
        "deepspeed/runtime/zero/partition_parameters.py:9 _all_gather < unifiedplayers/trainer/loss.py:40 policy_loss")
    assert cuda_peak.site_of([TORCH, OURS, DS]) == "unifiedplayers/trainer/loss.py:40 policy_loss"
    assert cuda_peak.site_of([DS]) == "deepspeed/runtime/zero/partition_parameters.py:9 _all_gather"
    assert cuda_peak.site_of([TORCH]).startswith("torch")


def test_replay_finds_the_peak_and_what_was_live_there():
    # baseline 1000 bytes (allocated before the recording); worked by hand:
    #   +300 (a, DS) 1300; +200 (b, ours) 1500; -300 (a) 1200; +500 (c, ours) 1700 <- peak; -100 from the
    #   baseline (addr 9, never allocated in the trace) 1600; +50 (d) 1650
    trace = [{"action": "alloc", "addr": 1, "size": 300, "frames": [DS]},
             {"action": "alloc", "addr": 2, "size": 200, "frames": [OURS]},
             {"action": "free_requested", "addr": 1, "size": 300},
             {"action": "free_completed", "addr": 1, "size": 300},
             {"action": "segment_alloc", "addr": 100, "size": 4096},
             {"action": "alloc", "addr": 3, "size": 500, "frames": [TORCH, OURS]},
             {"action": "free_completed", "addr": 9, "size": 100},
             {"action": "alloc", "addr": 4, "size": 50, "frames": [DS]}]
    got = cuda_peak.breakdown(trace, baseline=1000)
    assert got["peak_bytes"] == 1700 and got["peak_entry"] == 5 and got["entries"] == 8
    assert got["baseline_live_bytes"] == 1000
    assert got["sites"] == [{"site": "unifiedplayers/trainer/loss.py:40 policy_loss", "bytes": 700, "blocks": 2}]
    assert got["other_bytes"] == 0
    # a baseline block freed before the peak leaves the baseline's live bytes; top=0 sums every site as other
    trace.insert(0, {"action": "free_completed", "addr": 9, "size": 100})
    got = cuda_peak.breakdown(trace[:-2], baseline=1000, top=0)
    assert got["peak_bytes"] == 1600 and got["baseline_live_bytes"] == 900
    assert got["sites"] == [] and got["other_bytes"] == 700
    assert "1600" not in "\n".join(cuda_peak.lines(got))  # printed in MiB
    assert len(cuda_peak.lines(got)) == 2


def test_an_empty_history_peaks_at_its_baseline():
    got = cuda_peak.breakdown([], baseline=42)
    assert got["peak_bytes"] == 42 and got["peak_entry"] == -1 and got["sites"] == []
