"""Socratic-Zero's loop pieces against numbers worked out by hand, with the Teacher a local OpenAI-compatible
stub server started by the test: grades, refinements, the Solver's preference pairs and DPO loss, the
Generator's utility weights and weighted SFT, the curriculum queue, and the start-up stop without a Teacher."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from unifiedplayers.trainer import grpo
from unifiedplayers.config import compose
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import build_method, reward_source
from unifiedplayers.methods import socratic_zero as sz
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players.planning import PlanningTask
from unifiedplayers.rollout.types import Segment

from tests.methods.stub_teacher import serve_teacher

pytestmark = pytest.mark.cpu


def teacher_reply(prompt: str) -> str:
    """A stub Teacher. Grades: CORRECT exactly for the answer 42, an unparseable reply for "??". Refinement:
    a new problem for any failure, except a reply without a boxed answer for a problem about "broken"."""
    if "got this problem wrong" in prompt:
        q = re.search(r"Problem:\n(.*?)\n\nThe student's solution", prompt, re.DOTALL).group(1)
        return ("Problem: no answer here\nSolution: I forgot." if "broken" in q else
                f"Problem: Harder than '{q}': what is 6 * 8?\nSolution: 6 * 8 = 48, so \\boxed{{48}}.")
    answer = re.search(r"final answer: (.*)\n", prompt).group(1)
    return {"42": "CORRECT", "??": "I am not sure."}.get(answer, "INCORRECT")


@pytest.fixture(scope="module")
def stub():
    with serve_teacher(teacher_reply) as teacher:
        yield teacher


@pytest.fixture(scope="module")
def teacher_url(stub):
    return stub.url


def rollout(answer, text=None, ids=(1, 2)):
    """A solution as the tool loop returns it: final answer, transcript and segments (prompt + reply)."""
    return SimpleNamespace(final_answer=answer, text=text or f"... so \\boxed{{{answer}}}",
                           segments=[Segment([7, 8], trainable=False), Segment(list(ids), trainable=True,
                                                                                logprobs=[-0.5] * len(ids))])


# ------------------------------------------------------------------ pure pieces by hand


def test_preference_pairs_by_hand():
    # winners {0, 2}, losers {1, 3, 4}: round 0 pairs loser i with winner i mod 2, round 1 with (i + 1) mod 2
    assert sz.preference_pairs([1, 0, 1, 0, 0]) == [(0, 1), (2, 3), (0, 4), (2, 1), (0, 3), (2, 4)]
    assert sz.preference_pairs([1, 0, 1, 0, 0], max_pairs=3) == [(0, 1), (2, 3), (0, 4)]  # every loser once
    assert sz.preference_pairs([0, 0]) == []  # no winner, no reference
    assert sz.preference_pairs([0, 0], has_reference=True) == [(sz.REFERENCE, 0), (sz.REFERENCE, 1)]
    assert sz.preference_pairs([1, 1], has_reference=True) == []  # nothing to prefer against
    assert sz.preference_pairs([1, None, 0]) == [(0, 2)]  # an ungraded solution is neither


def test_generator_utility_by_hand():
    # U(s) = exp(−(s − 0.5)² / (2 · 0.2²)) = exp(−(s − 0.5)² / 0.08)
    assert sz.generator_utility(0.5) == 1.0
    assert sz.generator_utility(0.3) == pytest.approx(math.exp(-0.5))  # 0.04 / 0.08 = 0.5 -> 0.60653
    assert sz.generator_utility(0.0) == pytest.approx(math.exp(-3.125)) == sz.generator_utility(1.0)  # 0.04394
    assert sz.generator_utility(0.5, mu=0.0, sigma=1.0) == pytest.approx(math.exp(-0.125))
    with pytest.raises(ValueError):
        sz.generator_utility(1.5)
    assert sz.success_rate([1.0, 0.0, None, 1.0]) == pytest.approx(2 / 3) and sz.success_rate([None]) is None


def test_dpo_loss_by_hand():
    # One pair, β = 0.1. Chosen: log π = (−1, −1), log π_ref = (−1.5, −1.5) -> Σ log-ratio +1.
    # Rejected: log π = (−2, −2), log π_ref = (−1.5, −1.5) -> −1. z = 0.1 · (1 − (−1)) = 0.2.
    # loss = −log σ(0.2) = log(1 + e^−0.2) = 0.598139; ∂loss/∂log π_chosen,t = −β σ(−z) = −0.1 · 0.450166.
    lp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    ref = torch.full((2, 2), -1.5)
    args = dict(old_logprobs=torch.zeros(2, 2), ref_logprobs=ref, advantages=torch.tensor([1.0, -1.0]),
                mask=torch.ones(2, 2), group_index=torch.tensor([0, 0]), clip_eps=0.2, kl_coef=0.1)
    loss, m = grpo.get_policy_loss("dpo")(lp, **args)
    assert float(loss.detach()) == pytest.approx(math.log1p(math.exp(-0.2)))
    loss.backward()
    g = 0.1 / (1 + math.exp(0.2))  # β σ(−z) = 0.0450166
    assert lp.grad.flatten().tolist() == pytest.approx([-g, -g, g, g])
    assert m["actor/dpo_margin"] == pytest.approx(0.2) and m["actor/dpo_accuracy"] == 1.0
    # the order inside the pair does not matter; a second pair (margin −0.2: log(1 + e^0.2) = 0.798139)
    # weighs the same under Eq. 21: the batch loss is the mean of the two
    lp2 = torch.tensor([[-2.0, -2.0], [-1.0, -1.0], [-2.0, -2.0], [-1.0, -1.0]])
    loss2, m2 = grpo.get_policy_loss("dpo")(
        lp2, torch.zeros(4, 2), torch.full((4, 2), -1.5), torch.tensor([-1.0, 1.0, 1.0, -1.0]), torch.ones(4, 2),
        torch.tensor([0, 0, 1, 1]), clip_eps=0.2, kl_coef=0.1)
    assert float(loss2) == pytest.approx((math.log1p(math.exp(-0.2)) + math.log1p(math.exp(0.2))) / 2)
    assert m2["actor/dpo_accuracy"] == 0.5
    # micro-batches that keep the pairs whole add up to the batch (the Eq. 21 weights are the batch's)
    w = grpo.aggregation_weights(torch.ones(4, 2), torch.tensor([0, 0, 1, 1]))
    parts = [grpo.get_policy_loss("dpo")(lp2[s], torch.zeros(2, 2), torch.full((2, 2), -1.5),
                                         torch.tensor([-1.0, 1.0, 1.0, -1.0])[s], torch.ones(2, 2),
                                         torch.tensor([0, 0, 1, 1])[s], clip_eps=0.2, kl_coef=0.1,
                                         sample_weights=w[s])[0] for s in (slice(0, 2), slice(2, 4))]
    assert float(sum(parts)) == pytest.approx(float(loss2))
    with pytest.raises(ValueError, match="keep each pair whole"):
        grpo.get_policy_loss("dpo")(lp2[1:3], torch.zeros(2, 2), torch.full((2, 2), -1.5), torch.tensor([1.0, 1.0]),
                                    torch.ones(2, 2), torch.tensor([0, 1]), clip_eps=0.2, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef > 0"):
        grpo.get_policy_loss("dpo")(**{**args, "kl_coef": 0.0}, logprobs=lp.detach())


def test_weighted_sft_loss_by_hand():
    # token_mean over 3 tokens (1/3 each); weights u = (1, 0.5):
    # loss = −(1/3)(1·(−1) + 1·(−2) + 0.5·(−3)) = 1.5; ∂loss/∂log π = −u/3 per token
    lp = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, m = grpo.get_policy_loss("weighted_sft")(lp, torch.zeros(2, 2), None, torch.tensor([1.0, 0.5]), mask,
                                                   torch.tensor([0, 1]), aggregation="token_mean")
    assert float(loss.detach()) == pytest.approx(1.5)
    loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, -0.5 / 3, 0.0])
    assert m["actor/nll"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3


def test_curriculum_queue():
    items = [sz.CurriculumItem(f"q{i}", str(i), f"s{i}", "src", "fail") for i in range(5)]
    cur = sz.SocraticCurriculum(max_size=3)
    cur.add(items)
    assert [i.question for i in cur.items] == ["q2", "q3", "q4"]  # oldest dropped
    again = sz.SocraticCurriculum()
    again.load_state_dict(json.loads(json.dumps(cur.state_dict())))  # the state is plain JSON
    assert again.items == cur.items and again.max_size == 3
    assert [i.question for i in cur.take(2)] == ["q2", "q3"] and len(cur) == 1
    (task,) = sz.curriculum_tasks(cur.take(5))
    assert task.valid and task.question == "q4" and task.expected_answer == "4" and task.socratic.solution == "s4"
    assert items[0].generator_target() == "q0\nAnswer: \\boxed{0}"
    with pytest.raises(ValueError):
        sz.SocraticCurriculum(0)


def test_mix_tasks():
    def cur(n):
        c = sz.SocraticCurriculum()
        c.add([sz.CurriculumItem(f"t{i}", "1", "s", "q", "y") for i in range(n)])
        return c

    gen = [PlanningTask("", f"g{i}", "1", True) for i in range(5)] + [PlanningTask("", None, None, False, "bad")]
    # n = 4, share 0.5: round(2) Teacher problems (oldest first), then 2 of the Generator's
    c = cur(3)
    assert [t.question for t in sz.mix_tasks(c, gen, 4, 0.5)] == ["t0", "t1", "g0", "g1"] and len(c) == 1
    # a short curriculum: the Generator fills in; a short Generator side: the curriculum fills in
    assert [t.question for t in sz.mix_tasks(cur(1), gen, 4, 0.5)] == ["t0", "g0", "g1", "g2"]
    assert [t.question for t in sz.mix_tasks(cur(6), gen[:1], 4, 0.5)] == ["t0", "t1", "t2", "g0"]
    assert [t.question for t in sz.mix_tasks(cur(3), gen, 3, 0.0)] == ["g0", "g1", "g2"]
    assert all(hasattr(t, "socratic") for t in sz.mix_tasks(cur(2), [], 4, 0.5))
    with pytest.raises(ValueError):
        sz.mix_tasks(cur(1), gen, 2, 1.5)


def test_parse_refinement():
    item, why = sz.parse_refinement("Problem: What is 2+2?\nSolution: 2+2=4, \\boxed{4}", "q", "y")
    assert why == "" and (item.question, item.answer, item.source_question) == ("What is 2+2?", "4", "q")
    assert sz.parse_refinement("What is 2+2? \\boxed{4}", "q", "y") == (None, "no 'Problem:' and 'Solution:' parts")
    assert sz.parse_refinement("Problem: x\nSolution: none", "q", "y")[1] == "the solution has no \\boxed{} answer"


# ------------------------------------------------------------------ against the stub Teacher


def test_one_phase_against_the_stub_teacher(teacher_url, stub):
    teacher = sz.TeacherClient(teacher_url, "judge")
    item = sz.CurriculumItem("What is 6 * 7?", "42", "6 * 7 = 42, \\boxed{42}", "What is 6 * 6?", "6 * 6 = 35")
    cur_task, = sz.curriculum_tasks([item])
    gen_task = PlanningTask("", "A broken problem?", "1", True)
    hard_task = PlanningTask("", "What is 7 * 6?", "42", True)
    cur_task_all_wrong, = sz.curriculum_tasks([item])
    tasks = [cur_task, gen_task, hard_task, cur_task_all_wrong]
    rollouts = [[rollout("42"), rollout("41", "I think 41"), rollout(None)],
                [rollout("??"), rollout("3")],
                [rollout("42"), rollout("42")],
                [rollout("40"), rollout("41")]]
    fb = sz.socratic_phase(teacher, tasks, rollouts, refine_limit=8)
    # grades: 42 correct, others wrong, no answer 0 without asking, "??" ungraded (None)
    assert fb.grades == [[1.0, 0.0, 0.0], [None, 0.0], [1.0, 1.0], [0.0, 0.0]]
    assert fb.pairs == [[(0, 1), (0, 2)], [], [], [(sz.REFERENCE, 0), (sz.REFERENCE, 1)]]
    assert fb.references == [item.solution, None, None, item.solution]
    # imitation: curriculum tasks solved 1/3 and 0/2 -> U = exp(−(1/6)²/0.08) = exp(−0.347222) = 0.706648,
    # and exp(−0.25/0.08) = exp(−3.125) = 0.043937
    assert [e.weight for e in fb.imitation] == pytest.approx([0.706648, 0.043937], abs=1e-6)
    assert fb.imitation[0].question == "What is 6 * 6?" and fb.imitation[0].target == item.generator_target()
    # failures (q, y_fail): the first wrong solution of each task with one ("??" is ungraded, "3" is wrong)
    assert fb.failed == [("What is 6 * 7?", "I think 41"), ("A broken problem?", "... so \\boxed{3}"),
                         ("What is 6 * 7?", "... so \\boxed{40}")]
    # refinement of each failure; the "broken" one comes back unparseable (recorded, not raised)
    assert [r.source_question for r in fb.refinements] == ["What is 6 * 7?", "What is 6 * 7?"]
    assert fb.refinements[0].failed_solution == "I think 41" and fb.refinements[0].answer == "48"
    assert len(fb.failures) == 2 and fb.failures[0].startswith("grade: teacher reply is neither")
    assert fb.failures[1].startswith("refine: the solution has no \\boxed{} answer")
    # the grades are cached: grading the phase again asks nothing new
    asked = len(stub.seen)
    assert teacher.grade("What is 6 * 7?", "41") == 0.0 and len(stub.seen) == asked
    # refine_limit caps the Teacher's refinement calls
    assert len(sz.socratic_phase(teacher, tasks, rollouts, refine_limit=1).refinements) == 1


def test_training_samples_for_dpo_and_sft(teacher_url):
    tok = build_byte_tokenizer()
    cfg = compose(["method=socratic_zero"])
    item = sz.CurriculumItem("What is 6 * 7?", "42", "42", "What is 6 * 6?", "35")
    (task,) = sz.curriculum_tasks([item])
    rs = [rollout("42", ids=(1, 2, 3)), rollout("41", ids=(4, 5))]
    fb = sz.SocraticFeedback([[1.0, 0.0]], [[(0, 1), (sz.REFERENCE, 1)]], [item.solution])
    samples = sz.preference_samples(tok, cfg.player, [task], [rs], fb)
    assert [(s.advantage, s.group) for s in samples] == [(1.0, 0), (-1.0, 0), (1.0, 1), (-1.0, 1)]
    assert list(samples[0].token_ids) == [7, 8, 1, 2, 3] and list(samples[0].loss_mask) == [0, 0, 1, 1, 1]
    ref = samples[2]  # the Teacher's reference after the Solver's own prompt, only the reply (+ eos) trained
    reply = tok("42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert list(ref.token_ids[-len(reply):]) == reply and sum(ref.loss_mask) == len(reply)
    assert "What is 6 * 7?" in tok.decode(ref.token_ids[: len(ref.token_ids) - len(reply)])
    (sft,) = sz.imitation_samples(tok, cfg.player.planning, [sz.ImitationExample("What is 6 * 6?", "35",
                                                                                   item.generator_target(), 0.7)])
    prompt = tok.decode([t for t, m in zip(sft.token_ids, sft.loss_mask) if not m])
    assert "What is 6 * 6?" in prompt and "35" in prompt and "got this problem wrong" in prompt
    assert sft.advantage == 0.7 and tok.decode([t for t, m in zip(sft.token_ids, sft.loss_mask) if m]).startswith(
        "What is 6 * 7?\nAnswer: \\boxed{42}")


def test_reward_sources_and_start_up(teacher_url):
    with pytest.raises(ValueError, match="method.extra.teacher_endpoint"):
        build_method(compose(["method=socratic_zero"]))
    cfg = compose(["method=socratic_zero", f"method.extra.teacher_endpoint={teacher_url}",
                   "method.extra.teacher_model=judge"])
    built = build_method(cfg)
    assert isinstance(built, sz.SocraticZero)
    fb = TaskFeedback(SimpleNamespace(), ["42", "41", "??", None], None, question="6*7?", method_cfg=cfg.method,
                      settings=built.settings)
    assert reward_source("execution", "teacher")(fb).tolist() == [1.0, 0.0, 0.0, 0.0]
    # success rate over the graded three (None for "??" left out): 1/3 -> U = 0.706648
    assert reward_source("planning", "socratic_utility")(fb) == pytest.approx(math.exp(-(1 / 6) ** 2 / 0.08))
    # μ and σ come from the method's settings on the feedback: μ = 1/3 puts the peak at that success rate
    fb.settings = dataclasses.replace(built.settings, utility_mu=1 / 3)
    assert reward_source("planning", "socratic_utility")(fb) == pytest.approx(1.0)


def test_an_unreachable_teacher_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    teacher = sz.TeacherClient(f"http://127.0.0.1:{port}/v1", "judge", timeout_s=2)
    with pytest.raises(sz.TeacherError, match=f"127.0.0.1:{port}"):
        teacher.grade("q", "1")


# ------------------------------------------------------------------ the losses in the real trainer


def test_dpo_and_weighted_sft_train_the_tiny_model():
    """The trainer with ``policy_loss=dpo`` on the Solver's pairs, and with ``weighted_sft`` on the
    Generator's examples, on the tiny random Llama: the first DPO step starts at π = π_ref (loss log 2,
    margin 0), the implicit reward margin then grows; the weighted NLL of the Teacher's problem falls."""
    import sys
    from pathlib import Path
    from tests.trainer.trainer_helpers import tiny_model, trainer_config

    from unifiedplayers.trainer import build_trainer

    torch.manual_seed(0)
    model, tok = tiny_model()
    cfg = compose(["method=socratic_zero"])
    item = sz.CurriculumItem("What is 6 * 7?", "42", "6 * 7 = 42, so \\boxed{42}", "What is 6 * 6?", "35")
    (task,) = sz.curriculum_tasks([item])

    def solution(text):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        prompt = tok("Q: 6 * 7?\nA:", add_special_tokens=False)["input_ids"]
        return SimpleNamespace(final_answer=None, text=text, segments=[
            Segment(prompt, trainable=False), Segment(ids, trainable=True, logprobs=[-5.0] * len(ids))])

    rs = [solution("6 * 7 = 42, so 42"), solution("6 * 7 = 41, so 41"), solution("I do not know")]
    fb = sz.SocraticFeedback([[1.0, 0.0, 0.0]], [sz.preference_pairs([1.0, 0.0, 0.0], True)], [item.solution])
    batch = sz.preference_samples(tok, cfg.player, [task], [rs], fb)
    assert len(batch) == 4  # two pairs: (0, 1), (0, 2)
    trainer = build_trainer(trainer_config(policy_loss="dpo", kl_coef=0.1, lr=3e-3, micro_batch_size=2), model)
    trainer.start_outer_iteration()
    trainer.start_block()
    metrics = [trainer.update(batch) for _ in range(8)]
    assert metrics[0]["actor/loss"] == pytest.approx(math.log(2), abs=1e-5)  # z = 0 at π = π_ref
    assert metrics[0]["actor/dpo_margin"] == pytest.approx(0.0, abs=1e-5)
    assert metrics[-1]["actor/dpo_margin"] > 1.0 and metrics[-1]["actor/dpo_accuracy"] == 1.0
    assert metrics[-1]["actor/loss"] < metrics[0]["actor/loss"]  # measured: 0.693 -> 0.126, margin 2.65

    model, tok = tiny_model()
    sft = sz.imitation_samples(tok, cfg.player.planning, [
        sz.ImitationExample(item.source_question, item.failed_solution, item.generator_target(), 1.0)])
    trainer = build_trainer(trainer_config(policy_loss="weighted_sft", kl_coef=0.0, lr=3e-3), model)
    trainer.start_outer_iteration()
    trainer.start_block()
    nll = [trainer.update(sft)["actor/nll"] for _ in range(8)]
    assert nll[-1] < nll[0] - 1.0, nll  # measured: 5.56 -> 3.63 nats per token
