"""One rank of tests/trainer/test_entropy_ranks.py (torchrun, two ranks, gloo on CPU): the entropy bank scored by
the ranks together (:mod:`unifiedplayers.trainer.entropy`).

``DUMP plain zero3``: with the torch trainer's model (plain), the part sums every rank gathers (micro-batches of one context and of
sixteen) and the forwards this rank ran; with a ZeRO-3 trainer (parameters gathered per module call), the bank entropy
the trainer reports, the same bank scored whole by every rank, and the decoder and LM-head calls this rank made (zero3).
Dumped to ``DUMP.rank<r>.pt``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from unifiedplayers.distributed import destroy, init_distributed  # noqa: E402
from unifiedplayers.trainer import build_trainer, mean_token_entropy  # noqa: E402
from unifiedplayers.trainer.entropy import bank_part_sums  # noqa: E402
from unifiedplayers.trainer.logprobs import split_causal_lm  # noqa: E402

from tests.trainer.trainer_helpers import tiny_model, trainer_config  # noqa: E402

# 35 contexts: micro-batches of 16, 16 and 3 (two ranks: rank 0 scores two, rank 1 one); the first holds 600 + 15
# short positions, two 512-row parts, so under lockstep each rank's pass makes as many LM-head calls as the other's.
LENGTHS = [600] + [3 + (7 * i) % 11 for i in range(34)]


def bank() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 259, (n,), generator=g) for n in LENGTHS]


def count_calls(model: torch.nn.Module) -> dict[str, int]:
    """Forward calls of the decoder body and of the LM head of ``model``, counted from now on."""
    calls = {"body": 0, "head": 0}
    for name, module in zip(("body", "head"), split_causal_lm(model)):
        module.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    return calls


def plain(dist) -> dict:
    model, _ = tiny_model()
    calls = count_calls(model)
    parts = {}
    for batch_size in (1, 16):
        parts[batch_size] = bank_part_sums(model, bank(), dist, batch_size)
    return {"parts": parts, "calls": dict(calls)}


def zero3(dist) -> dict:
    trainer = build_trainer(trainer_config(backend="deepspeed_zero3", entropy_bank_size=len(LENGTHS)),
                            tiny_model()[0], entropy_bank=bank(), dist=dist)
    calls = count_calls(trainer.compute_model)
    shared = trainer.bank_entropy()
    during = dict(calls)
    whole = mean_token_entropy(trainer.compute_model, trainer.entropy_bank)  # every rank the whole bank
    return {"shared": shared, "whole": whole, "calls": during}


def main(dump: str, *backends: str) -> None:
    """``backends``: ``plain`` and/or ``zero3``."""
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        jobs = {"plain": plain, "zero3": zero3}
        torch.save({name: jobs[name](dist) for name in backends}, f"{dump}.rank{dist.rank}.pt")
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
