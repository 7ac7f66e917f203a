"""Model FLOPs of the trainer's passes: hand-worked counts, torch's own FLOP counter, the update's metric."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from unifiedplayers.trainer import TrainSample, build_trainer, selected_token_logprobs
from unifiedplayers.trainer.flops import (
    attention_shape,
    causal_pairs,
    decoder_forward_flops,
    head_forward_flops,
    linear_weights,
)
from unifiedplayers.trainer.logprobs import split_causal_lm

from tests.trainer.trainer_helpers import tiny_model, trainer_config

pytestmark = pytest.mark.cpu

# The tiny Llama of trainer_helpers: hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16.
# Per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate, up, down 3·64·128 = 36 864 weights.
TINY_LINEAR = 2 * 36_864
TINY_ATTENTION = 4 * 4 * 16 * 2  # FLOPs per (query, key) pair: 4 · heads · head dim · layers
TINY_HEAD_ROW = 2 * 259 * 64  # vocab 259


def test_counts_of_the_tiny_model_by_hand():
    model, _ = tiny_model()
    body, head = split_causal_lm(model)
    assert linear_weights(body) == TINY_LINEAR
    assert attention_shape(body.config) == (2, 4, 16)
    assert causal_pairs(3) == 1 + 2 + 3
    assert causal_pairs(5, 2) == 3 + 4 + 5
    assert causal_pairs(2, 2) == 0
    # 3 rows of 5 positions, the first 2 shared: 2 + 3·3 = 11 tokens run; 3 + 3·12 = 39 attending pairs.
    assert decoder_forward_flops(body, 3, 5, 2) == 2 * TINY_LINEAR * 11 + TINY_ATTENTION * 39
    # Without sharing: 15 tokens, 3 · 15 pairs.
    assert decoder_forward_flops(body, 3, 5) == 2 * TINY_LINEAR * 15 + TINY_ATTENTION * 45
    assert head_forward_flops(*head.weight.shape, 7) == 7 * TINY_HEAD_ROW


def _matmul_flops(counter: FlopCounterMode) -> int:
    """The counter's mm/addmm FLOPs (its attention and bmm formulas count non-causal work, so left out)."""
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if str(op).split(".")[-1] in ("mm", "addmm"))


@pytest.mark.parametrize("shared", [True, False])
def test_linear_and_head_flops_match_torch_flop_counter_forward_and_backward(shared):
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 259, (20,), generator=g)
    rows = [torch.cat([prompt, torch.tensor([3 + i]), torch.randint(3, 259, (7,), generator=g)]) for i in range(3)]
    ids = torch.stack(rows)  # (3, 28), the first 20 positions common
    att = torch.ones_like(ids)
    att[2, 25:] = 0
    sel = att.bool().clone()
    sel[:, :20] = False
    with FlopCounterMode(display=False) as forward_counter:
        out = selected_token_logprobs(model, ids, att, sel, min_shared_prefix=16 if shared else 0)
    prefix = 20 if shared else 0
    tokens = prefix + 3 * (28 - prefix)
    rows_scored = int(sel.sum())  # 8 + 8 + 5
    linear_and_head = 2 * TINY_LINEAR * tokens + rows_scored * TINY_HEAD_ROW
    assert _matmul_flops(forward_counter) == linear_and_head
    pairs = causal_pairs(prefix) + 3 * causal_pairs(28, prefix)
    assert out.flops == linear_and_head + TINY_ATTENTION * pairs
    with FlopCounterMode(display=False) as backward_counter:
        out.logprobs.sum().backward()
    assert _matmul_flops(backward_counter) == 2 * linear_and_head  # two matmuls per forward matmul


def test_update_reports_its_model_flops_and_rate():
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(micro_batch_size=2, kl_coef=0.05), model, role="t", pad_token_id=0)
    trainer.start_outer_iteration()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 259, (20,), generator=g).tolist()
    batch = []
    for i in range(4):  # 4 rows of 20 shared prompt tokens + 6 trained completion tokens, 2 per micro-batch
        completion = [3 + i] + torch.randint(3, 259, (5,), generator=g).tolist()
        batch.append(TrainSample(prompt + completion, [0] * 20 + [1] * 6, [0.0] * 20 + [-5.5] * 6, float(i) - 1.5, 0))
    # One micro-batch's forward: 20 + 2·6 = 32 tokens; 210 + 2·(21 + … + 26) = 492 pairs; 12 scored rows.
    forward = 2 * TINY_LINEAR * 32 + TINY_ATTENTION * 492 + 12 * TINY_HEAD_ROW
    first = trainer.update(batch)  # π_θ = π_ref: no reference pass
    assert first["perf/update_tflop"] == pytest.approx(2 * 3 * forward * 1e-12, rel=1e-12)
    assert first["perf/update_tflop_per_s"] > 0
    second = trainer.update(batch)  # now the reference forward runs too
    assert second["perf/update_tflop"] == pytest.approx(2 * 4 * forward * 1e-12, rel=1e-12)
