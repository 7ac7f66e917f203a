"""A toy reward for outer-loop tests on the tiny random model, whose tasks, trajectories and verifiers all
earn the same reward within a group (zero advantage, no policy gradient). ``install(monkeypatch)`` replaces
each candidate's reward by the share of its generated tokens that are lowercase ASCII letters (as in
tests/trainer/test_grpo_learning.py), so every group has a reward spread and the policy moves; the
monkeypatch undoes it (a test that runs after sees the real rewards, whatever the order)."""
from __future__ import annotations

import unifiedplayers.loop.phase as phase

_real = phase.group_samples
LETTERS: set[int] = set()


def letter_share(sample) -> float:
    ids = [int(t) for t, m in zip(sample.token_ids, sample.loss_mask) if m]
    return sum(t in LETTERS for t in ids) / len(ids) if ids else 0.0


def toy_group_samples(*args, **kwargs):
    makers, _, gids = _real(*args, **kwargs)
    return makers, [letter_share(make(0.0)) for make in makers], gids


def install(monkeypatch) -> None:
    """Toy rewards until ``monkeypatch`` is undone (a pytest ``monkeypatch`` or ``pytest.MonkeyPatch()``)."""
    from unifiedplayers.config import compose
    from unifiedplayers.models import load_model

    if not LETTERS:
        _, tok = load_model(compose(["experiment=tiny"]).model)
        LETTERS.update(tok("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False)["input_ids"])
    monkeypatch.setattr(phase, "group_samples", toy_group_samples)
