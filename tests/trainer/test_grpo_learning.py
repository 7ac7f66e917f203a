"""A real learning run: GRPO on the tiny random Llama raises a toy reward (§3.3, Appendix B.3 end to end).

Sampling goes through the project's ``hf`` rollout (behaviour log-probs recorded at sampling time),
advantages through Eq. 17, the update through the torch trainer. Reward of a completion = share of its
tokens that are lowercase ASCII letters (26 of the 259 byte-tokenizer ids, so a random policy scores
about 0.1 and every group has some reward spread to learn from).
"""
from __future__ import annotations

import pytest
import torch

from unifiedplayers.trainer import grpo
from unifiedplayers.config import RolloutConfig
from unifiedplayers.rollout import build_rollout
from unifiedplayers.trainer import build_trainer, sample_from_completion

from tests.trainer.trainer_helpers import tiny_model, trainer_config

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

UPDATES = 30
PROMPTS = ["Q: say letters\nA:", "Write: "]
SAMPLES = 8  # group size per prompt
NEW_TOKENS = 8


def toy_grpo_setup():
    """Seed 0, the tiny random Llama, its ``hf`` rollout and a GRPO trainer (no KL) inside a block: returns
    the 26 lowercase-letter token ids, the rollout, the trainer and the tokenized PROMPTS."""
    torch.manual_seed(0)
    model, tokenizer = tiny_model()
    letters = set(tokenizer("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False)["input_ids"])
    rollout = build_rollout(RolloutConfig(max_new_tokens=NEW_TOKENS, temperature=1.0), model, tokenizer)
    trainer = build_trainer(
        trainer_config(lr=3e-3, kl_coef=0.0, micro_batch_size=SAMPLES, clip_eps=0.2), model, role="toy"
    )
    trainer.start_outer_iteration()
    trainer.start_block()
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return letters, rollout, trainer, prompt_ids


def test_grpo_raises_mean_reward_on_emit_letters():
    letters, rollout, trainer, prompt_ids = toy_grpo_setup()
    assert len(letters) == 26

    mean_rewards = []
    for step in range(UPDATES):
        outs = rollout.generate(prompt_ids, n=SAMPLES, ignore_eos=True, seed=1000 + step)
        completions = [c for group in outs for c in group]
        rewards = torch.tensor([sum(t in letters for t in c.token_ids) / len(c.token_ids) for c in completions])
        groups = torch.arange(len(completions)) // SAMPLES
        adv = grpo.group_advantages(rewards, groups)
        batch = [sample_from_completion(c, float(a), int(g)) for c, a, g in zip(completions, adv, groups)]
        metrics = trainer.update(batch)
        rollout.update_weights(trainer.model)
        mean_rewards.append(float(rewards.mean()))
        # One update per batch: the behaviour policy is the policy itself, so ϱ = 1 up to float noise.
        assert metrics["actor/ratio_max"] == pytest.approx(1.0, abs=1e-3)

    start = sum(mean_rewards[:5]) / 5
    end = sum(mean_rewards[-5:]) / 5
    assert start < 0.2, mean_rewards
    assert end > start + 0.3, mean_rewards
    assert trainer.block_diagnostics()["grad_norm/median"] > 0


def test_grpo_with_four_steps_per_generation_moves_the_ratio_and_still_learns():
    """S = 4 (§3.3, Appendix B.3): each phase samples 4 × the batch once, then takes 4 optimizer steps on its
    disjoint mini-batches against the behaviour log-probs of the sampling. The ratio leaves 1 after the
    phase's first step, the clip of Eq. 19 binds on some tokens, and the toy reward still rises."""
    steps_per_generation, phases = 4, 10
    letters, rollout, trainer, prompt_ids = toy_grpo_setup()

    mean_rewards, first_ratios, later_ratios, later_clip = [], [], [], []
    for phase in range(phases):
        # One generation for the whole phase: S mini-batches of the usual size (2 prompts × 8 samples).
        outs = rollout.generate(prompt_ids * steps_per_generation, n=SAMPLES, ignore_eos=True, seed=2000 + phase)
        mean_rewards.append(float(torch.tensor([sum(t in letters for t in c.token_ids) / len(c.token_ids)
                                                for g in outs for c in g]).mean()))
        per_step = len(PROMPTS)
        for step in range(steps_per_generation):
            completions = [c for group in outs[step * per_step:(step + 1) * per_step] for c in group]
            rewards = torch.tensor([sum(t in letters for t in c.token_ids) / len(c.token_ids) for c in completions])
            groups = torch.arange(len(completions)) // SAMPLES
            adv = grpo.group_advantages(rewards, groups)
            batch = [sample_from_completion(c, float(a), int(g)) for c, a, g in zip(completions, adv, groups)]
            metrics = trainer.update(batch)
            spread = max(metrics["actor/ratio_max"] - 1, 1 - metrics["actor/ratio_min"])
            (first_ratios if step == 0 else later_ratios).append(spread)
            if step:
                later_clip.append(metrics["actor/clip_frac"])
        rollout.update_weights(trainer.model)  # the next phase samples with the updated policy

    assert max(first_ratios) < 1e-3  # the phase's first step: π_θ = π_old
    assert min(later_ratios) > 1e-3 and max(later_ratios) > 0.2, later_ratios
    assert max(later_clip) > 0.0, later_clip  # the clip binds on some tokens
    assert mean_rewards[0] < 0.2, mean_rewards
    assert sum(mean_rewards[-2:]) / 2 > mean_rewards[0] + 0.2, mean_rewards


def test_bf16_mixed_precision_learns_and_samples_from_its_bf16_copy():
    """The same toy under trainer.dtype=bfloat16 (forced: this CPU need not have native bf16): rollouts sample
    from the trainer's bf16 copy, refreshed after every step, and the toy reward rises as in float32. The
    on-policy mismatch |log π_train − log π_behaviour| is reported and small: both are the same bf16 weights."""
    torch.manual_seed(0)
    model, tokenizer = tiny_model()
    letters = set(tokenizer("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False)["input_ids"])
    trainer = build_trainer(trainer_config(lr=3e-3, kl_coef=0.0, micro_batch_size=SAMPLES, clip_eps=0.2,
                                           dtype="bfloat16"), model, role="toy")
    sampler = trainer.sampling_model(torch.bfloat16)
    assert sampler is trainer.compute_model and next(sampler.parameters()).dtype == torch.bfloat16
    rollout = build_rollout(RolloutConfig(max_new_tokens=NEW_TOKENS, temperature=1.0), sampler, tokenizer)
    trainer.start_outer_iteration()
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    mean_rewards, mismatch = [], []
    for step in range(UPDATES):
        outs = rollout.generate(prompt_ids, n=SAMPLES, ignore_eos=True, seed=1000 + step)
        completions = [c for group in outs for c in group]
        rewards = torch.tensor([sum(t in letters for t in c.token_ids) / len(c.token_ids) for c in completions])
        groups = torch.arange(len(completions)) // SAMPLES
        adv = grpo.group_advantages(rewards, groups)
        batch = [sample_from_completion(c, float(a), int(g)) for c, a, g in zip(completions, adv, groups)]
        metrics = trainer.update(batch, on_policy=True)
        mismatch.append(metrics["actor/logprob_mismatch"])
        mean_rewards.append(float(rewards.mean()))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    start, end = sum(mean_rewards[:5]) / 5, sum(mean_rewards[-5:]) / 5
    assert start < 0.2 and end > start + 0.3, mean_rewards
    assert max(mismatch) < 0.05, mismatch
