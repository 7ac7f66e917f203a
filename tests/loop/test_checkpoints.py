"""The run's checkpoints (``loop/checkpoints.py``) without a model: which resume copy a save writes, and what
``schedule.checkpoint_retention`` keeps of a finished run's checkpoints (:func:`prune`)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from unifiedplayers.loop.checkpoints import prune, save_active

pytestmark = pytest.mark.cpu


class Writer:
    """A trainer that records the checkpoints it is asked to write."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def save_checkpoint(self, path: Path) -> None:
        self.written.append(str(path))


def test_cadence_saves_alternate_the_resume_copies_and_never_write_the_one_the_state_names(tmp_path):
    trainer = Writer()
    team = SimpleNamespace(players={"planning": SimpleNamespace(trainer=trainer),
                                    "execution": SimpleNamespace(trainer=Writer())}, shared_roles=[])
    team.save_checkpoint = lambda role, path: team.players[role].trainer.save_checkpoint(path)  # as Team's
    checkpoints = {"planning": "checkpoints/iter1/planning", "execution": None}
    named = []
    for step in range(4):  # inside a block of 6: never its last update
        before = checkpoints["planning"]
        save_active(team, "planning", 2, False, tmp_path, checkpoints, every_block=True)
        assert trainer.written[-1] != str(tmp_path / before)  # the copy the state names stays whole
        assert trainer.written[-1] == str(tmp_path / checkpoints["planning"])  # the state names what was written
        named.append(checkpoints["planning"])
    assert named == [f"checkpoints/resume/planning-{c}" for c in "abab"]
    assert checkpoints["execution"] is None  # another player's name is untouched


def _files(root: Path, rels: list[str]) -> None:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")


def _left(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "checkpoints").rglob("*") if p.is_file())


def test_execution_weights_keeps_the_execution_player_s_resume_copies_and_iterations(tmp_path):
    full = ("model.pt", "optimizer.pt", "reference.pt")
    _files(tmp_path, [f"checkpoints/{d}/{f}" for d in ("iter1/execution", "iter1/planning", "resume/execution-a",
                                                         "resume/execution-b", "resume/evaluation-a") for f in full])
    prune(tmp_path, "execution_weights")
    assert _left(tmp_path) == ["checkpoints/iter1/execution/model.pt", "checkpoints/resume/execution-a/model.pt",
                               "checkpoints/resume/execution-b/model.pt"]


def test_retention_drops_stale_feedback_s_published_copies(tmp_path):
    _files(tmp_path, ["checkpoints/published/planning.pt", "checkpoints/iter1/planning/model.pt",
                      "checkpoints/iter1/planning/optimizer.pt"])
    prune(tmp_path, "weights")
    assert _left(tmp_path) == ["checkpoints/iter1/planning/model.pt"]
    _files(tmp_path, ["checkpoints/published/planning.pt"])
    prune(tmp_path, "all")  # all: nothing is removed
    assert "checkpoints/published/planning.pt" in _left(tmp_path)
