"""Merging the metrics of an update's micro-batches (``trainer/batching.py``'s ``_combine_metrics``): an update split
into micro-batches reports what the same update in one reports. Losses and counts add (each micro-batch's loss
already carries Eq. 21's weights of the whole batch), token statistics re-weight by their micro-batch's tokens,
minima and maxima reduce."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from unifiedplayers.trainer import base, build_trainer
from unifiedplayers.trainer.batching import _combine_metrics

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu

SUMS = ("actor/loss", "actor/pg_loss", "actor/num_tokens", "perf/update_tflop")
TOKEN_MEANS = ("actor/pg_clip_frac", "actor/clip_frac", "actor/ratio_mean", "actor/kl", "actor/entropy",
               "actor/logprob_mismatch")
EXTREMES = ("actor/ratio_min", "actor/ratio_max")


def test_each_kind_of_metric_merges_as_worked_by_hand():
    parts = [
        {"actor/loss": 0.25, "actor/pg_loss": -0.5, "actor/num_tokens": 3.0, "perf/update_tflop": 1.5,
         "actor/ratio_mean": 1.0, "actor/clip_frac": 0.0, "actor/ratio_min": 0.5, "actor/ratio_max": 1.25},
        {"actor/loss": 0.5, "actor/pg_loss": -0.25, "actor/num_tokens": 1.0, "perf/update_tflop": 0.5,
         "actor/ratio_mean": 2.0, "actor/clip_frac": 1.0, "actor/ratio_min": 0.75, "actor/ratio_max": 2.5},
    ]
    merged = {
        "actor/loss": 0.75, "actor/pg_loss": -0.75, "actor/num_tokens": 4.0, "perf/update_tflop": 2.0,  # sums
        "actor/ratio_mean": (3 * 1.0 + 1 * 2.0) / 4, "actor/clip_frac": (3 * 0.0 + 1 * 1.0) / 4,  # 3:1 tokens
        "actor/ratio_min": 0.5, "actor/ratio_max": 2.5,
    }
    assert _combine_metrics(parts) == merged
    assert _combine_metrics(parts[::-1]) == merged  # in either order (each extreme first, then last)


def _batch() -> list:
    """8 samples in 2 groups whose halves (micro-batches of 4) hold different token counts (19 and 20) but samples of
    the same longest length, so both splits pad to the same shapes (equal FLOPs); advantages of one sign, so each
    half's policy loss is far from 0 and a mean of the halves' losses is far from their sum."""
    model, _ = tiny_model()
    samples = synthetic_batch(model, torch.Generator().manual_seed(0), n=8, group_size=4)
    lengths = [len(s.token_ids) for s in samples]
    assert max(lengths[:4]) == max(lengths[4:])
    assert sum(sum(s.loss_mask) for s in samples[:4]) != sum(sum(s.loss_mask) for s in samples[4:])
    return [dataclasses.replace(s, advantage=0.5 + 0.1 * i) for i, s in enumerate(samples)]


def _second_update(batch, micro_batch_size: int, monkeypatch) -> tuple[dict, list[dict]]:
    """A step on ``batch`` in one micro-batch, then a second on it with ``micro_batch_size`` (π_θ has moved from
    π_ref: a KL to report): the second step's metrics and its micro-batches' metrics."""
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(micro_batch_size=len(batch), kl_coef=0.05), model)
    trainer.start_outer_iteration()
    trainer.update(batch)
    trainer.cfg.micro_batch_size = micro_batch_size
    parts: list[dict] = []

    def spy(p):
        parts.extend(dict(m) for m in p)
        return _combine_metrics(p)

    monkeypatch.setattr(base, "_combine_metrics", spy)
    return trainer.update(batch, on_policy=True), parts  # on_policy: also reports actor/logprob_mismatch


def test_two_micro_batches_report_the_metrics_of_one(monkeypatch):
    batch = _batch()
    whole, _ = _second_update(batch, len(batch), monkeypatch)
    split, parts = _second_update(batch, len(batch) // 2, monkeypatch)
    assert split["actor/num_micro_batches"] == 2 and len(parts) == 2
    for key in SUMS + TOKEN_MEANS + EXTREMES:
        # the halves differ, so a sum, a token mean, a plain mean and a min or max of them all differ
        assert parts[0][key] != parts[1][key], key
    assert abs(parts[0]["actor/pg_loss"]) > 0.1 and abs(parts[1]["actor/pg_loss"]) > 0.1
    # the smallest ratio in the first half, the largest in the second: neither half alone gives both extremes
    assert parts[0]["actor/ratio_min"] < parts[1]["actor/ratio_min"]
    assert parts[0]["actor/ratio_max"] < parts[1]["actor/ratio_max"]
    assert whole["actor/kl"] > 0
    for key in ("actor/loss", "actor/pg_loss"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5), key
    assert split["actor/num_tokens"] == whole["actor/num_tokens"] == sum(sum(s.loss_mask) for s in batch)
    assert split["perf/update_tflop"] == pytest.approx(whole["perf/update_tflop"], rel=1e-12)
    for key in TOKEN_MEANS + EXTREMES:
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-9), key
    assert split["actor/grad_norm"] == pytest.approx(whole["actor/grad_norm"], rel=1e-4)
