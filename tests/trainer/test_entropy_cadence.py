"""When the entropy bank is scored (``trainer.entropy_every``, Appendix D.2), counted by hand on the tiny random
Llama in float32: 0 scores a block's start and end only, n > 0 also every n-th update, the end is never scored twice,
and the block's final / initial ratio is the one a score after every update gives, exactly. A negative value is
refused at start-up, naming the key."""
from __future__ import annotations

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.trainer import build_trainer

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu

BANK_LENGTHS = (200, 200, 200, 200)  # 800 positions: on 2 threads the last bits of the entropy differ from 1


@pytest.fixture(scope="module")
def batches():
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(7)
    return [synthetic_batch(model, g) for _ in range(5)]


def counted(trainer) -> list[int]:
    """The global step at each of ``trainer``'s bank scores from now on."""
    scored, bank_entropy = [], trainer.bank_entropy
    trainer.bank_entropy = lambda: scored.append(trainer.global_step) or bank_entropy()
    return scored


def block_before_its_end(every: int, batches: list, updates: int, **cfg):
    """A trainer of the tiny model with a bank of four contexts (``cfg``: more trainer settings), after the start of a
    block and ``updates`` updates; the global step of every bank score so far."""
    g = torch.Generator().manual_seed(11)
    bank = [torch.randint(3, 259, (n,), generator=g) for n in BANK_LENGTHS]
    trainer = build_trainer(trainer_config(entropy_every=every, entropy_bank_size=len(bank), lr=5e-3, **cfg),
                            tiny_model()[0], entropy_bank=bank)
    scored = counted(trainer)
    trainer.start_block()
    trainer.start_outer_iteration()
    for batch in batches[:updates]:
        trainer.update(batch)
    return trainer, scored


def scored_block(every: int, batches: list, updates: int, **cfg):
    """One whole block: the global step of every bank score, the block's diagnostics, and the trainer."""
    trainer, scored = block_before_its_end(every, batches, updates, **cfg)
    return scored, trainer.block_diagnostics(), trainer


@pytest.mark.parametrize("every, updates, steps", [
    (0, 3, [0, 3]),  # the block's start and end only
    (2, 5, [0, 2, 4, 5]),  # every second update, and the end: update 5 is not a multiple of 2
    (2, 4, [0, 2, 4]),  # update 4 was scored: the end is not scored again
    (1, 3, [0, 1, 2, 3]),  # after every update (the old default)
    (0, 0, [0]),  # a block without an update: its start is its end
])
def test_the_bank_is_scored_at_the_start_every_nth_update_and_the_end_by_hand(batches, every, updates, steps):
    scored, diagnostics, trainer = scored_block(every, batches, updates)
    assert scored == steps
    assert len(trainer.entropy.history) == len(steps)
    assert diagnostics["entropy_bank/retention"] == trainer.entropy.final / trainer.entropy.initial
    trainer.block_diagnostics()  # asked again, the same weights: not scored again
    assert scored == steps


@pytest.mark.parametrize("every, updates, threads", [(0, 3, 0), (2, 5, 0), (2, 4, 0), (3, 5, 0), (0, 3, 2)])
def test_the_block_ratio_is_the_one_scored_after_every_update_exactly(batches, every, updates, threads):
    """``threads``: trainer.update_threads (the end's score runs on the update's threads, as a score inside it; the
    entropy's last bits change with the thread count)."""
    _, ours, _ = scored_block(every, batches, updates, update_threads=threads)
    _, each, _ = scored_block(1, batches, updates, update_threads=threads)
    for key in ("entropy_bank/initial", "entropy_bank/final", "entropy_bank/retention"):
        assert ours[key] == each[key], key  # == on floats: bit for bit
    assert ours["entropy_bank/retention"] != 1.0  # the updates moved the policy's entropy


def test_a_resumed_block_is_not_scored_again_for_weights_scored_before_the_save(batches, tmp_path):
    """The step of the last score travels in the checkpoint: a block resumed after its 4th update (scored: every 2)
    ends without another score; one resumed after its 3rd is scored at its end."""
    for updates, steps in ((4, []), (3, [3])):
        trainer, _ = block_before_its_end(2, batches, updates)
        trainer.save_checkpoint(tmp_path / f"after{updates}")
        resumed, _ = block_before_its_end(2, batches, 0)
        resumed.load_checkpoint(tmp_path / f"after{updates}")
        scored = counted(resumed)
        assert resumed.block_diagnostics()["entropy_bank/final"] == trainer.block_diagnostics()["entropy_bank/final"]
        assert scored == steps


@pytest.mark.parametrize("experiment", ["tiny", "smoke", "paper_qwen3_4b", "paper_mimo_7b"])
def test_presets_score_the_bank_at_block_ends_only(experiment):
    assert compose([f"experiment={experiment}"]).trainer.entropy_every == 0


def test_a_negative_entropy_every_is_refused_at_start_up():
    from unifiedplayers.checks import validate

    with pytest.raises(ValueError, match=r"trainer\.entropy_every=-1: need >= 0"):
        validate(compose(["experiment=tiny", "trainer.entropy_every=-1"]))
