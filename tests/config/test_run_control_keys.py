"""What a resumed run may change: trainer.offload_dir (files without a name, parked and read back bit-exactly) is a
run-control key, as ``experiments/dp8_single_gpu_runs.sh`` gives each of its runs its own while
``make reproduce-table3`` resumes the same members without one."""
from __future__ import annotations

import pytest

from unifiedplayers.config import compose
from unifiedplayers.loop.run_state import check_resumable, result_config


def test_a_run_resumes_with_another_offload_dir(tmp_path):
    before = compose(["experiment=tiny"])
    moved = compose(["experiment=tiny", f"trainer.offload_dir={tmp_path / 'offload'}"])
    assert "trainer.offload_dir" not in result_config(moved)
    check_resumable({"config": result_config(before)}, moved, tmp_path, 1)
    check_resumable({"config": result_config(moved)}, before, tmp_path, 1)
    # a run saved while the key was still part of its result config
    check_resumable({"config": {**result_config(before), "trainer.offload_dir": "/old/offload"}}, moved, tmp_path, 1)
    with pytest.raises(ValueError, match=r"trainer\.lr"):
        check_resumable({"config": result_config(before)}, compose(["experiment=tiny", "trainer.lr=0.5"]), tmp_path, 1)


def test_a_run_named_after_its_preset_resumes_with_that_name(tmp_path):
    """A run started before model.name followed model.path, from a directory of another name, stored the preset's
    name: resumed from the same directory, it is refused naming model.name, and model.name=<that name> resumes it."""
    now = compose(["experiment=paper_qwen3_4b", "model.path=/data/qwen"])
    assert now.model.name == "qwen"
    stored = {**result_config(now), "model.name": "Qwen3-4B-Base"}
    with pytest.raises(ValueError, match=r"model\.name: 'Qwen3-4B-Base' -> 'qwen'"):
        check_resumable({"config": stored}, now, tmp_path, 1)
    named = compose(["experiment=paper_qwen3_4b", "model.path=/data/qwen", "model.name=Qwen3-4B-Base"])
    check_resumable({"config": stored}, named, tmp_path, 1)
