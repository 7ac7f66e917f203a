"""benchmarks/outer_loop.py --floors counts the weight reads of generation: one pass over the sampling model's
weights per sampled token of each batch's longest row. Checked against the completions of a real tiny-Llama call."""
from __future__ import annotations

import os

import pytest
import torch

from benchmarks.outer_loop import DecodeReads
from benchmarks.precision_floors import weight_bytes
from unifiedplayers.config import ModelConfig, RolloutConfig
from unifiedplayers.models import load_model
from unifiedplayers.rollout import build_rollout
from unifiedplayers.rollout.hf_engine import HFRollout

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", device="cpu", seed=0))
    torch.set_num_threads(n)


def test_decode_reads_count_the_longest_row_of_each_batch_in_the_models_weight_bytes(tiny):
    model, tok = tiny
    engine = build_rollout(RolloutConfig(backend="hf", batch_size=3), model, tok)
    prompts = [tok.encode("a b c"), tok.encode("d e f g h")]
    reads = DecodeReads()
    plain = HFRollout._sample_batch
    with reads.counting():
        out = engine.generate(prompts, n=3, max_new_tokens=7, temperature=1.0, seed=3)
    assert HFRollout._sample_batch is plain  # restored on exit
    rows = [c for group in out for c in group]
    # batch_size 3: the 6 rows (3 samples of each prompt, shorter prompt first) decode as two batches of 3
    lengths = sorted((len(c.token_ids) for c in rows[:3]), reverse=True), sorted((len(c.token_ids) for c in rows[3:]), reverse=True)
    assert reads.batches == 2
    assert reads.passes == lengths[0][0] + lengths[1][0]
    assert reads.bytes == reads.passes * weight_bytes(model, "float32")
    with reads.counting():
        engine.generate(prompts[:1], n=1, max_new_tokens=1, temperature=1.0, seed=3)
    assert (reads.batches, reads.passes) == (3, lengths[0][0] + lengths[1][0] + 1)
