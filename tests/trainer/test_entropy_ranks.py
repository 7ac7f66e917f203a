"""The entropy bank (Appendix D.2) scored by two data-parallel ranks (torchrun, gloo on CPU, float32;
tests/trainer/entropy_worker.py) is one rank's bit for bit: every context's entropy (micro-batches of one context),
every part sum and the mean (micro-batches of sixteen), although the 35 contexts give one rank a micro-batch fewer.
Under ZeRO-3 both ranks call the decoder and the LM head equally often, and the trainer's bank entropy is the whole
bank's. The split itself (which rank runs which micro-batch, the lockstep head calls) is worked by hand."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from unifiedplayers.trainer import mean_token_entropy
from unifiedplayers.trainer.entropy import bank_part_sums, head_calls, mean_of_parts, rank_passes

from tests.trainer.trainer_helpers import tiny_model
from tests.distributed.launch import torchrun  # noqa: E402
from tests.trainer.entropy_worker import LENGTHS, bank  # noqa: E402

pytestmark = pytest.mark.cpu

WORKER = Path(__file__).with_name("entropy_worker.py")


def test_each_rank_takes_every_nth_micro_batch_and_pads_to_the_busiest_by_hand():
    assert rank_passes(5, 0, 2) == [0, 2, 4] and rank_passes(5, 1, 2) == [1, 3]
    assert rank_passes(5, 1, 2, lockstep=True) == [1, 3, None]
    assert rank_passes(1, 2, 3, lockstep=True) == [None]  # a rank without a micro-batch still runs the pass
    assert rank_passes(6, 1, 3, lockstep=True) == [1, 4]
    # parts per micro-batch [2, 1, 1], two ranks: pass 0 runs 0 and 1 (2 and 1 head calls), pass 1 runs 2 and a
    # throw-away repeat of micro-batch 0 (1 and 2)
    assert head_calls([2, 1, 1], 2) == [2, 2]
    assert head_calls([1, 3, 1, 1], 2) == [3, 1]
    assert head_calls([], 2) == []


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's dump of one two-rank launch: the plain model's scores, and ZeRO-3's where DeepSpeed is installed."""
    from unifiedplayers.trainer.deepspeed_backend import DEFAULT_EXTENSIONS_DIR

    dump = tmp_path_factory.mktemp("entropy") / "dump"
    backends = ["plain"] + (["zero3"] if importlib.util.find_spec("deepspeed") else [])
    torchrun(WORKER, str(dump), *backends, timeout=300,
             env={"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))})
    return [torch.load(f"{dump}.rank{r}.pt", weights_only=False) for r in (0, 1)]


def context_entropy(parts: list[tuple[float, int]]) -> float:
    """Mean token entropy of one context (a micro-batch of one; the 600-token one has two parts)."""
    return sum(s for s, _ in parts) / sum(n for _, n in parts)


@pytest.mark.slow
def test_two_ranks_give_one_ranks_entropies_bit_for_bit(ranks):
    model, _ = tiny_model()
    one = {size: bank_part_sums(model, bank(), batch_size=size) for size in (1, 16)}
    assert len(one[1]) == 35 and [len(p) for p in one[16]] == [2, 1, 1]  # the first micro-batch has two parts
    for out in ranks:
        parts = out["plain"]["parts"]
        assert parts[1] == one[1]  # each context's parts' (entropy sum, positions), exactly
        assert [context_entropy(p) for p in parts[1]] == [context_entropy(p) for p in one[1]]
        assert parts[16] == one[16]
        assert mean_of_parts(parts[16]) == mean_token_entropy(model, bank())  # == on floats: bit for bit
    # Rank 0 ran 18 + 2 micro-batches, rank 1 17 + 1 (no lockstep: no throw-away pass); one head call per part, and
    # rank 0 has the 600-token context, two parts, both alone and in micro-batch 0 of sixteen.
    assert [out["plain"]["calls"]["body"] for out in ranks] == [18 + 2, 17 + 1]
    assert [out["plain"]["calls"]["head"] for out in ranks] == [19 + 3, 17 + 1]


@pytest.mark.slow
def test_zero3_ranks_call_the_model_alike_and_report_the_whole_banks_entropy(ranks):
    if "zero3" not in ranks[0]:
        pytest.skip("deepspeed is not installed")
    zero3 = [out["zero3"] for out in ranks]
    # Rank 0 scores micro-batches 0 and 2 (2 + 1 parts), rank 1 micro-batch 1 (1 part) and a throw-away repeat of
    # micro-batch 0 (2 parts): two decoder calls each, and the head as often on both (2 per pass).
    assert [z["calls"] for z in zero3] == [{"body": 2, "head": 4}] * 2
    for z in zero3:
        assert z["shared"] == z["whole"]
    model, _ = tiny_model()
    assert zero3[0]["shared"] == pytest.approx(mean_token_entropy(model, bank()), rel=1e-6)
    assert sum(LENGTHS) > 512  # the premise of the uneven head calls
