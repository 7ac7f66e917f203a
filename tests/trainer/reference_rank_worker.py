"""Worker of tests/trainer/test_idle_player_memory.py, run on two ranks by torchrun (gloo, CPU).

``reference_rank_worker.py DUMP``: a ZeRO-3 trainer with π_ref precomputed takes :data:`STEPS` updates (π_ref swapped
in from rank 0 from the second on; rank 1 runs one micro-batch of three and a zero-weight pad), then dumps to
``DUMP.rank<r>.pt`` whether the rank holds π_ref, the KL of each update and the full weights.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from unifiedplayers.distributed import destroy, init_distributed  # noqa: E402
from unifiedplayers.trainer import build_trainer  # noqa: E402

from trainer_helpers import synthetic_batch, tiny_model, trainer_config  # noqa: E402

STEPS = 3


def batches(count: int) -> list:
    """8 samples per batch in micro-batches of 3."""
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(21)
    return [synthetic_batch(model, g) for _ in range(count)]


def main(dump: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        trainer = build_trainer(trainer_config(backend="deepspeed_zero3", ref_mode="precompute", kl_coef=0.1),
                                tiny_model()[0], dist=dist)
        trainer.start_outer_iteration()
        kl = [trainer.update(b)["actor/kl"] for b in batches(STEPS)]
        torch.save({"holds_reference": trainer._ref_state is not None, "has_reference": trainer._has_reference,
                    "kl": kl, "weights": trainer.full_state_dict()}, f"{dump}.rank{dist.rank}.pt")
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
