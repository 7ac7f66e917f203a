"""Run metrics: metrics.jsonl lines, resume truncation, W&B offline mirror."""
from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from unifiedplayers.config import LoggerConfig
from unifiedplayers.diagnostics.logging import RunLogger, read_metrics
from unifiedplayers.rundir import count_lines, truncate_lines

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


def test_wandb_online_without_network_falls_back_to_offline(tmp_path, monkeypatch, capsys):
    """logger=wandb_online with the W&B server unreachable: a short wait, then offline with a warning (not an
    85 s stall and then nothing); metrics still go to the offline W&B run and to metrics.jsonl."""
    import time
    from pathlib import Path

    conf = Path(__file__).resolve().parents[2] / "conf" / "logger" / "wandb_online.yaml"
    cfg = OmegaConf.merge(OmegaConf.structured(LoggerConfig), OmegaConf.load(conf))
    assert cfg.mode == "online"
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # a key, so that wandb gets as far as the network
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # W&B reads its environment once per process: forget an earlier test's
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning, match="offline"):
        log = RunLogger(tmp_path, cfg, config={"seed": 0}, run_id="up-online-test")
    took = time.monotonic() - t0
    assert took < 30, f"W&B online init took {took:.0f} s"
    assert log.wandb is not None and log.wandb_mode == "offline"
    assert "falling back to offline" in capsys.readouterr().out
    log.log({"update": 0, "execution/reward_mean": 0.5}, step=0)
    log.close()
    assert any(p.name.startswith("offline-run") for p in (tmp_path / "wandb").iterdir())
    assert read_metrics(tmp_path)[0]["execution/reward_mean"] == 0.5


def test_wandb_init_timeout_is_short_by_default(monkeypatch):
    from unifiedplayers.diagnostics.logging import wandb_init_timeout

    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    cfg = OmegaConf.structured(LoggerConfig(backend="wandb", mode="online"))
    assert 0 < wandb_init_timeout(cfg) <= 20  # wandb's own default is 90 s
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "45")
    assert wandb_init_timeout(cfg) == 45.0
