"""phase.pt, the sampled mini-batches of a phase in progress (loop/phase.py): what a run stopped inside a
phase resumes from.

It holds each sample as a dict of its fields, so that it names no class of ours; a phase.pt this version cannot
read (an older version's, which pickled TrainSample under another path or named the minibatches otherwise) is refused
with what to do.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from unifiedplayers.loop.phase import Phase, MiniBatch, load_phase_state
from unifiedplayers.trainer import base
from unifiedplayers.trainer.sample import TrainSample

pytestmark = pytest.mark.cpu


def _phase() -> Phase:
    tensors = TrainSample(torch.tensor([5, 6, 7, 8]), torch.tensor([0, 0, 1, 1]),
                          torch.tensor([0.0, 0.0, -0.25, -1.5]), 0.75, 0)
    lists = TrainSample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.125], -0.75, 0, clip_high=0.28,
                        behaviour_logprobs=torch.tensor([0.0, -0.375, -0.25], dtype=torch.float64))
    return Phase(4, [MiniBatch([tensors, lists], {"planning/reward_mean": 0.5}), MiniBatch([], {"planning/reward_mean": None})],
                 {"generation_s": 1.5, "sandbox_s": 0.25, "total_s": 2.0})


def _assert_same_phase(got: Phase, want: Phase) -> None:
    assert (got.first, got.timing) == (want.first, want.timing)
    assert [u.metrics for u in got.minibatches] == [u.metrics for u in want.minibatches]
    assert [len(u.batch) for u in got.minibatches] == [len(u.batch) for u in want.minibatches]
    for g, w in zip((s for u in got.minibatches for s in u.batch), (s for u in want.minibatches for s in u.batch)):
        assert type(g) is TrainSample
        for f in dataclasses.fields(TrainSample):
            a, b = getattr(g, f.name), getattr(w, f.name)
            if isinstance(b, torch.Tensor):
                assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f.name
            else:
                assert a == b, f.name


def test_a_phase_round_trips_through_phase_pt(tmp_path):
    phase = _phase()
    torch.save(phase.to_state(), tmp_path / "phase.pt")
    plain = torch.load(tmp_path / "phase.pt", weights_only=False)
    assert all(type(s) is dict for u in plain["minibatches"] for s in u["batch"])  # no class of ours in the file
    _assert_same_phase(Phase.from_state(load_phase_state(tmp_path / "phase.pt")), phase)


class _OldTrainSample:
    """TrainSample as phase.pt files of earlier runs name it: pickled under its old module."""


_OldTrainSample.__module__ = "unifiedplayers.trainer.base"
_OldTrainSample.__name__ = _OldTrainSample.__qualname__ = "TrainSample"


def test_a_phase_pt_of_an_older_version_is_refused_saying_to_start_a_new_run(tmp_path, monkeypatch):
    phase = _phase()
    old_samples = []
    for minibatch in phase.minibatches:
        old_samples.append([])
        for s in minibatch.batch:
            old = _OldTrainSample()
            old.__dict__.update({f.name: getattr(s, f.name) for f in dataclasses.fields(TrainSample)})
            old_samples[-1].append(old)
    # An older to_state: the sample objects themselves, under the class's old path, in "units".
    old_state = {"first": phase.first, "timing": dict(phase.timing),
                 "units": [{"batch": b, "metrics": u.metrics} for b, u in zip(old_samples, phase.minibatches)]}
    with monkeypatch.context() as m:
        m.setattr(base, "TrainSample", _OldTrainSample, raising=False)  # pickle checks the class is found there
        torch.save(old_state, tmp_path / "pickled.pt")
    monkeypatch.delattr(base, "TrainSample", raising=False)  # as now: TrainSample lives in trainer/sample.py
    with pytest.raises(RuntimeError, match="older version of this code.*start a new run in another run_dir"):
        load_phase_state(tmp_path / "pickled.pt")
    renamed = {**phase.to_state()}
    renamed["units"] = renamed.pop("minibatches")  # an older layout of plain samples
    torch.save(renamed, tmp_path / "units.pt")
    with pytest.raises(RuntimeError, match=r"units\.pt cannot be read .*older version of this code"):
        load_phase_state(tmp_path / "units.pt")
