"""summary.png (unifiedplayers.diagnostics.summary.write_summary_png): a PNG from a small metrics file, the series it
plots, and a plot failure that never fails the summary."""
from __future__ import annotations

import json

import pytest

from unifiedplayers.diagnostics import summary as S

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _metrics(tmp_path, lines):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


LINES = [
    {"global_update": 0, "block": "planning", "planning/reward_mean": 0.1, "planning/clip_frac": 0.0,
     "planning/kl": 0.0, "planning/grad_norm": 1.5, "execution/reward_mean": 0.2},
    {"global_update": 1, "block": "execution", "execution/reward_mean": 0.4, "execution/clip_frac": 0.05,
     "execution/kl": 0.01, "execution/grad_norm": float("nan"), "execution/pool_accuracy": 0.25},
    {"global_update": 2, "block": "evaluation", "evaluation/reward_mean": -0.5, "evaluation/clip_frac": 0.1,
     "evaluation/kl": 0.02, "evaluation/grad_norm": 0.7, "execution/pool_accuracy": 0.3},
]


def test_metric_series_keeps_finite_numbers_in_update_order():
    # execution/reward_mean is on lines 0 and 1; the NaN grad-norm of line 1 is left out
    assert S.metric_series(LINES, "execution/reward_mean") == ([0, 1], [0.2, 0.4])
    assert S.metric_series(LINES, "execution/grad_norm") == ([], [])
    assert S.metric_series([{"x": True}, {"x": 2}], "x") == ([1], [2.0])  # booleans are not values


def test_summary_png_from_a_small_metrics_file(tmp_path):
    _metrics(tmp_path, LINES)
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "iter0.json").write_text(json.dumps({"metrics": {"execution/answered": 0.2}}))
    (tmp_path / "probes" / "iter1.execution.json").write_text(json.dumps({"metrics": {"execution/answered": 0.35}}))
    (tmp_path / "probes" / "iter1.planning.json").write_text(json.dumps({"metrics": {"planning/U": 0.2}}))
    (tmp_path / "probes" / "iterX.json").write_text("not json")  # skipped, not fatal
    # per-role files of one checkpoint are merged
    assert S.probe_results(tmp_path) == {0: {"execution/answered": 0.2},
                                         1: {"execution/answered": 0.35, "planning/U": 0.2}}
    path = S.write_summary_png(tmp_path)
    assert path == tmp_path / "summary.png" and path.read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / ".summary.png.tmp").exists()


def test_write_summary_writes_the_png_beside_the_text(tmp_path):
    _metrics(tmp_path, LINES)
    S.write_summary(tmp_path)
    assert (tmp_path / "summary.md").exists()
    assert (tmp_path / "summary.png").read_bytes()[:8] == PNG_MAGIC
    (tmp_path / "summary.png").unlink()
    S.write_summary(tmp_path, png=False)  # schedule.summary_png=false: the text summary only
    assert (tmp_path / "summary.md").exists() and not (tmp_path / "summary.png").exists()


def test_no_metrics_no_png_and_a_plot_error_is_a_warning(tmp_path, monkeypatch):
    assert S.write_summary_png(tmp_path) is None
    _metrics(tmp_path, LINES)

    def broken(*_a, **_k):
        raise ValueError("no backend")

    monkeypatch.setattr(S, "write_summary_png", broken)
    with pytest.warns(RuntimeWarning, match="summary.png not written"):
        S.write_summary(tmp_path)
    assert (tmp_path / "summary.md").exists()
