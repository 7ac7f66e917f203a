"""Run metrics: metrics.jsonl lines, resume truncation, W&B offline mirror."""
from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from unifiedplayers.config import LoggerConfig
from unifiedplayers.logging import RunLogger, count_lines, read_metrics, truncate_lines

pytestmark = pytest.mark.cpu


def test_metrics_lines_and_truncation(tmp_path):
    log = RunLogger(tmp_path, OmegaConf.structured(LoggerConfig(backend="none")))
    for i in range(3):
        log.log({"update": i, "execution/reward_mean": 0.5 * i, "planning/U": math.nan})
    log.close()
    rows = read_metrics(tmp_path)
    assert [r["update"] for r in rows] == [0, 1, 2] and rows[0]["planning/U"] is None  # NaN is not JSON
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"update": 3, "torn')
    assert count_lines(path) == 3
    assert truncate_lines(path, 2) == 1
    assert [json.loads(x)["update"] for x in path.read_text().splitlines()] == [0, 1]
    with pytest.raises(ValueError, match="counts 5"):
        truncate_lines(path, 5)


def test_unknown_logger_backend_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="wandb \\| none"):
        RunLogger(tmp_path, OmegaConf.structured(LoggerConfig(backend="tensorboard")))


def test_wandb_offline_mirror(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    log = RunLogger(tmp_path, OmegaConf.structured(LoggerConfig(backend="wandb", mode="offline")),
                    config={"seed": 0}, run_id="up-test")
    assert log.wandb is not None
    log.log({"update": 0, "execution/reward_mean": 0.25}, step=0)
    log.close()
    assert any(p.name.startswith("offline-run") for p in (tmp_path / "wandb").iterdir())
    assert read_metrics(tmp_path)[0]["execution/reward_mean"] == 0.25
