"""Agent0 (arXiv 2511.16043): the Curriculum reward, the Executor's frontier filter and ADPO (advantage scale and
per-sample upper clip, through the GRPO loss and the trainer's collation), against numbers worked out by hand."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from unifiedplayers.trainer import grpo
from unifiedplayers.config import compose
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import GroupShape, build_method
from unifiedplayers.methods import agent0
from unifiedplayers.methods.r_zero import challenger_rewards
from unifiedplayers.trainer.batching import _collate
from unifiedplayers.trainer.sample import TrainSample

pytestmark = pytest.mark.cpu

QUESTIONS = ["a b c d", "a b c e", "x y z w", "a b c d"]  # cluster shares 3/4, 3/4, 1/4, 3/4 (test_r_zero.py)


@pytest.fixture(scope="module")
def cfg():
    return compose(["method=agent0"])


@pytest.fixture(scope="module")
def method(cfg):
    return build_method(cfg)


def feedback(answers=(), *, question="q", method=None, p_hat=None, tool_calls=(), reward_cfg=None, settings=None):
    return TaskFeedback(SimpleNamespace(repetition=0.0), list(answers), reward_cfg, tool_calls=list(tool_calls),
                        question=question, method_cfg=method, p_hat=p_hat, settings=settings)


def test_tool_reward_by_hand():
    # γ·mean(min(n, 4)) = 0.05 · mean(0, 2, 4, 4) = 0.05 · 2.5 = 0.125
    assert agent0.tool_reward([0, 2, 6, 4]) == pytest.approx(0.125)
    assert agent0.tool_reward([3], weight=0.1, cap=2) == pytest.approx(0.2)
    assert agent0.tool_reward([]) == 0.0
    with pytest.raises(ValueError, match="negative"):
        agent0.tool_reward([1, -1])
    with pytest.raises(ValueError, match="cap"):
        agent0.tool_reward([1], cap=0)


def test_curriculum_reward_paper_and_code_forms_by_hand():
    p, tools = [0.5, 0.25, 0.5, 1.0], [0.125, 0.0, 0.2, 0.05]
    # paper: max(0, 1 − 2|p − 1/2| + R_tool − |C|/B) = max(0, 1 + .125 − .75), max(0, .5 − .75),
    # 1 + .2 − .25, max(0, 0 + .05 − .75)
    assert challenger_rewards(p, QUESTIONS, bonus=tools) == pytest.approx([0.375, 0.0, 0.95, 0.0])
    # code (curriculum_reward.py): min(p, 1 − p) + R_tool − |C|/B
    assert challenger_rewards(p, QUESTIONS, form="code", bonus=tools) == pytest.approx([-0.125, -0.5, 0.45, -0.7])
    with pytest.raises(ValueError, match="questions"):
        challenger_rewards(p, QUESTIONS, bonus=tools[:2])


def test_planning_rewards_of_a_batch(cfg, method):
    tool_calls = [[0, 2, 6, 4], [0, 0, 0, 0], [4, 4, 4, 4], [1, 1, 1, 1]]  # R_tool 0.125, 0, 0.2, 0.05
    fbs = [feedback(p_hat=p, question=q, tool_calls=t, method=cfg.method, settings=method.settings)
           for p, q, t in zip([0.5, 0.25, 0.5, 1.0], QUESTIONS, tool_calls)]
    assert isinstance(method, agent0.Agent0)
    assert method.source("planning").over(fbs) == pytest.approx([0.375, 0.0, 0.95, 0.0])


def test_adpo_scale_and_upper_clip_by_hand():
    # s = 0.6 + 0.4·clip((p − 0.3)/0.5, 0, 1); ε_high = 0.2 + 0.1·clip((0.8 − p)/0.5, 0, 1)
    for p, scale, eps_high in [(0.1, 0.6, 0.3), (0.3, 0.6, 0.3), (0.55, 0.8, 0.25), (0.8, 1.0, 0.2), (0.9, 1.0, 0.2)]:
        assert agent0.adpo_advantage_scale(p) == pytest.approx(scale), p
        assert agent0.adpo_clip_high(p, 0.2) == pytest.approx(eps_high), p
    with pytest.raises(ValueError, match="p_low < p_high"):
        agent0.adpo_advantage_scale(0.5, p_low=0.8, p_high=0.3)


def test_executor_group_shape(method):
    m = method
    # p̂ = 0.55: inside [0.3, 0.8]; scale 0.8; ε_high = 0.25 with the trainer's ε = 0.2 (0.35 with ε = 0.3)
    got = m.group_shape("execution", feedback(p_hat=0.55), clip_eps=0.2)
    assert got.keep and got.adv_scale == pytest.approx(0.8) and got.clip_high == pytest.approx(0.25)
    assert m.group_shape("execution", feedback(p_hat=0.55), clip_eps=0.3).clip_high == pytest.approx(0.35)
    assert m.group_shape("execution", feedback(p_hat=0.3), 0.2).keep  # the band's ends are inside
    assert m.group_shape("execution", feedback(p_hat=0.8), 0.2).keep
    assert not m.group_shape("execution", feedback(p_hat=0.9), 0.2).keep  # too easy
    assert not m.group_shape("execution", feedback(p_hat=0.2), 0.2).keep  # too hard: the majority is unreliable
    assert m.group_shape("planning", feedback(p_hat=0.9), 0.2) == GroupShape()
    with pytest.raises(ValueError, match="typo"):  # an unknown ADPO setting fails at start-up
        build_method(compose(["method=agent0", "+method.extra.adpo.typo=1"]))


def test_config_sets_what_agent0_needs(cfg):
    # the method file is package _global_: it sets reward.* next to method.*
    assert cfg.reward.malformed_task_reward == 0.0 and cfg.reward.repetition_mode == "cluster_share"
    assert cfg.method.planning_reward == "agent0_curriculum" and cfg.method.use_tools
    assert cfg.method.extra["tool_bonus"] == 0.05 and cfg.method.extra["tool_call_cap"] == 4
    assert compose(["method=agent0", "reward.w_unc=2.0"]).reward.w_unc == 2.0


def test_per_sample_upper_clip_in_the_loss_by_hand():
    # Two one-token samples, ratio exp(log 1.28) = 1.28, Â = 1, ε = 0.2, one group each (weights 1/2 each).
    # Sample 0 has ε_high = 0.3: 1.28 < 1.3 is not clipped, ℓ = 1.28. Sample 1 keeps ε (NaN): clipped at 1.2.
    # loss = −(0.5·1.28 + 0.5·1.2) = −1.24; only sample 0 carries gradient: −0.5·1.28 = −0.64.
    logprobs = torch.full((2, 1), math.log(1.28), requires_grad=True)
    old = torch.zeros(2, 1)
    mask = torch.ones(2, 1)
    loss, metrics = grpo.policy_loss(logprobs, old, None, torch.tensor([1.0, 1.0]), mask, torch.tensor([0, 1]),
                                     clip_eps=0.2, kl_coef=0.0, clip_high=torch.tensor([0.3, float("nan")]))
    assert float(loss.detach()) == pytest.approx(-1.24)
    loss.backward()
    assert logprobs.grad[:, 0].tolist() == pytest.approx([-0.64, 0.0])
    assert metrics["actor/pg_clip_frac"] == 0.5 and metrics["actor/clip_frac"] == 0.5
    # without per-sample clips both are clipped at 1.2: loss −1.2
    plain, _ = grpo.policy_loss(logprobs.detach(), old, None, torch.tensor([1.0, 1.0]), mask, torch.tensor([0, 1]),
                                clip_eps=0.2, kl_coef=0.0)
    assert float(plain) == pytest.approx(-1.2)
    # the lower bound stays 1 − ε: ratio 0.7 with Â = −1 is clipped at 0.8 whatever ε_high
    sur, active = grpo.clipped_surrogate(torch.tensor([[0.7]]), torch.tensor([[-1.0]]), 0.2, torch.tensor([0.5]))
    assert sur.item() == pytest.approx(-0.8) and active.item()


def test_trainer_collation_carries_the_upper_clip():
    def sample(clip_high):
        return TrainSample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], 0.5, 0, clip_high)

    mb = _collate([sample(0.3), sample(None)], torch.ones(2), torch.device("cpu"), 0)
    assert mb.clip_high[0].item() == pytest.approx(0.3) and math.isnan(mb.clip_high[1].item())
    assert _collate([sample(None), sample(None)], torch.ones(2), torch.device("cpu"), 0).clip_high is None


def test_shape_advantages_by_hand():
    from unifiedplayers.methods import shape_advantages

    # group 0 (ADPO: scale 0.8, ε_high 0.25), group 1 dropped (outside the frontier), group 2 without a shape
    shapes = {0: GroupShape(True, 0.8, 0.25), 1: GroupShape(keep=False)}
    got = shape_advantages(shapes, [0, 0, 1, 1, 2], [1.0, -1.0, 1.0, -1.0, 0.5])
    assert got == [(0, pytest.approx(0.8), 0.25), (1, pytest.approx(-0.8), 0.25), (4, 0.5, None)]
    with pytest.raises(ValueError, match="group ids"):
        shape_advantages({}, [0], [])


def test_the_trainer_applies_each_samples_upper_clip_on_the_tiny_model():
    """Real path: TrainSample.clip_high -> _collate -> the loss, on the tiny random Llama.

    Behaviour log-probs log 1.25 below the policy's make ϱ = 1.25 on every trainable token. With ε = 0.2 every
    token is outside [0.8, 1.2]; with ε_high = 0.3 on every sample none is outside [0.8, 1.3]; with it on the
    first half of the batch only, half of the tokens of equal-length samples are.
    """
    import sys
    from pathlib import Path
    from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

    from unifiedplayers.trainer import build_trainer, selected_token_logprobs

    def shifted_batch(clip_high):
        model, _ = tiny_model()
        batch = synthetic_batch(model, torch.Generator().manual_seed(4), prompt_len=3)
        out = []
        for i, s in enumerate(batch):
            ids = torch.tensor(s.token_ids)[None]
            mask = torch.tensor(s.loss_mask)[None].bool()
            own = selected_token_logprobs(model, ids, torch.ones_like(ids), mask).logprobs[0]
            out.append(TrainSample(s.token_ids, s.loss_mask, (own - math.log(1.25)).tolist(), s.advantage, s.group,
                                   clip_high(i, len(batch))))
        return model, out

    fractions = {}
    for name, clip_high in {"none": lambda i, n: None, "all": lambda i, n: 0.3,
                            "half": lambda i, n: 0.3 if i < n // 2 else None}.items():
        model, batch = shifted_batch(clip_high)
        metrics = build_trainer(trainer_config(kl_coef=0.0, clip_eps=0.2), model).update(batch)
        assert metrics["actor/ratio_mean"] == pytest.approx(1.25, rel=1e-5)
        tokens = [sum(s.loss_mask) for s in batch]
        half = sum(tokens[: len(batch) // 2]) / sum(tokens)
        fractions[name] = (metrics["actor/clip_frac"], half)
    assert fractions["none"][0] == 1.0 and fractions["all"][0] == 0.0
    assert fractions["half"][0] == pytest.approx(1.0 - fractions["half"][1])
