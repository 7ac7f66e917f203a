"""`make reproduce-figure1` (eval/probes/figure1.py): figure1.json from probe files by hand, the plot, and the
shared backbone. The whole pipeline (train, probe each iteration, json, png, a rerun that does nothing) runs on
the tiny model in tests/eval/test_figure1_ablation.py, whose arms are reproduce-figure1 roots."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.probes import figure1 as F

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_probe(path: Path, metrics: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metrics": metrics, "sources": {"execution": "backbone"}}))


def test_collect_means_over_seeds_by_hand(tmp_path):
    # seed 0: accuracy 0.2 -> 0.4; seed 1: 0.3 -> 0.6 (its iteration-1 probe missing for U)
    _write_probe(F.probe_file(tmp_path / "seed0", 0), {"execution/accuracy": 0.2, "planning/U": 0.1,
                                                       "execution/accuracy_se": 0.04})
    _write_probe(F.probe_file(tmp_path / "seed0", 1), {"execution/accuracy": 0.4, "planning/U": 0.3})
    _write_probe(F.probe_file(tmp_path / "seed1", 0), {"execution/accuracy": 0.3, "planning/U": 0.2})
    _write_probe(F.probe_file(tmp_path / "seed1", 1, "execution"), {"execution/accuracy": 0.6})  # per-role file
    fig = F.collect(tmp_path, [0, 1], [0, 1])
    assert fig["iterations"] == [0, 1] and fig["seeds"] == [0, 1]
    assert set(fig["series"]) == set(F.SERIES)
    # means: (0.2 + 0.3) / 2 = 0.25, (0.4 + 0.6) / 2 = 0.5; U: (0.1 + 0.2) / 2 = 0.15, then seed 0 alone: 0.3
    assert fig["series"]["execution/accuracy"] == pytest.approx([0.25, 0.5])
    assert fig["series"]["planning/U"] == pytest.approx([0.15, 0.3])
    assert fig["series"]["evaluation/valid"] == [None, None]
    assert fig["per_seed"]["1"]["execution/accuracy"] == [0.3, 0.6]
    # SD over two seeds: |a - b| / sqrt(2): 0.1 / 1.414214 = 0.070711; 0.2 / 1.414214 = 0.141421
    assert fig["sd_over_seeds"]["execution/accuracy"] == pytest.approx([0.070711, 0.141421], abs=1e-6)
    assert fig["probe_se"]["0"]["execution/accuracy"] == [0.04, None]
    # change first -> last in points: (0.5 - 0.25) x 100 = 25; U in its own units: 0.3 - 0.15
    change = F.rises(fig)
    assert change["execution/accuracy"] == pytest.approx(25.0) and change["planning/U"] == pytest.approx(0.15)
    assert fig["paper_qwen3_4b"]["execution/accuracy"] == [0.525, 0.633]
    png = F.plot(fig, tmp_path / "figure1.png")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_the_backbone_is_probed_once_and_shared_by_every_seed(tmp_path):
    jobs = F.build_jobs(tmp_path, "tiny", [0, 1, 2], [], [], iterations=2)
    probes = [j for j in jobs if j.iteration >= 0]
    # the backbone: one job per role, for the first seed only; checkpoints: every seed x iteration x role
    assert sorted((j.seed, j.iteration) for j in probes if j.iteration == 0) == [(0, 0)] * 3
    assert len(probes) == 3 + 3 * 2 * 3
    assert all("backbone" in j.argv for j in probes if j.iteration == 0)
    # the endpoints (backbone, last iteration) before the middle; per checkpoint, execution (the longest) first
    assert [(j.iteration, j.seed) for j in probes[:3]] == [(0, 0)] * 3
    assert [j.iteration for j in probes[3:]] == [2] * 9 + [1] * 9
    assert [j.seed for j in probes[3:12]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [j.argv[j.argv.index("--roles") + 1] for j in probes[3:6]] == list(F.PROBE_ROLES)
    assert sorted(range(5), key=lambda i: F.probe_rank(i, 4)) == [0, 4, 1, 2, 3]
    _write_probe(F.probe_file(tmp_path / "seed0", 0, "execution"), {"execution/answered": 0.51})
    _write_probe(F.probe_file(tmp_path / "seed2", 0, "execution"), {"execution/answered": 0.99})  # kept as is
    written = F.share_backbone_probes(tmp_path, [0, 1, 2])
    assert written == [F.probe_file(tmp_path / "seed1", 0, "execution")]
    fig = F.collect(tmp_path, [0, 1, 2], [0])
    assert fig["per_seed"]["1"]["execution/answered"] == [0.51]
    assert fig["per_seed"]["2"]["execution/answered"] == [0.99]
