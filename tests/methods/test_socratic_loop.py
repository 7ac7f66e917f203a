"""Socratic-Zero's loop wired into the outer loop (methods/socratic_zero.py ``SocraticZero``).

The Teacher is a local OpenAI-compatible stub server started here: it grades CORRECT exactly for the answer
48 and refines any failed problem q into "Practice after '<q>': what is 6 * 8?" with the reference solution
"6 * 8 = 48, so \\boxed{48}.". The players are the tiny random Llama (experiment=tiny), which never writes
48: every solution fails, so the Solver's only winners are the Teacher's references.

Two outer iterations (Planning, Execution; Planning, Execution), every Execution task from the curriculum
when it has one (curriculum_share=1):
- it 1, Planning: no failure yet, so no refinement to imitate: an empty batch, the step is skipped;
- it 1, Execution: the Generator's task fails; the Teacher refines it: the curriculum grows by one, the
  failure (q, y_fail) waits for the Generator; no winner and no reference: no pair, skipped;
- it 2, Planning: the Generator is prompted with that failure; the Solver plays the refinement, success
  rate s = 0, so U = exp(−(0 − 0.5)² / (2 · 0.2²)) = exp(−3.125) = 0.043937; the Generator takes one
  weighted-SFT step on the Teacher's problem with that weight;
- it 2, Execution: the curriculum problem is played; its K = 2 wrong solutions each lose to the Teacher's
  reference: pairs (ref, 0), (ref, 1), a DPO step on 4 samples.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.methods import build_method
from unifiedplayers.methods import socratic_zero as sz
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players.planning import PlanningTask
from unifiedplayers.loop.sampling import PlayedTask
from unifiedplayers.rollout.types import Segment
from unifiedplayers.loop.outer import OuterLoop, StopRun
from unifiedplayers.trainer import torch_backend

from tests.methods.stub_teacher import serve_teacher

pytestmark = pytest.mark.cpu

REFERENCE = "6 * 8 = 48, so \\boxed{48}."
U_ZERO = math.exp(-3.125)  # U(s = 0) with μ = 0.5, σ = 0.2: 0.25 / 0.08 = 3.125 -> 0.043937


def refined(q: str) -> str:
    return f"Practice after '{q}': what is 6 * 8?"


def teacher_reply(prompt: str) -> str:
    if "got this problem wrong" in prompt:
        q = re.search(r"Problem:\n(.*?)\n\nThe student's solution", prompt, re.DOTALL).group(1)
        return f"Problem: {refined(q)}\nSolution: {REFERENCE}"
    return "CORRECT" if re.search(r"final answer: (.*)\n", prompt).group(1) == "48" else "INCORRECT"


@pytest.fixture(scope="module")
def teacher_url():
    with serve_teacher(teacher_reply) as teacher:
        yield teacher.url


def overrides(url: str) -> list[str]:
    return ["experiment=tiny", "method=socratic_zero", f"method.extra.teacher_endpoint={url}",
            "method.extra.teacher_model=judge", "method.extra.curriculum_share=1.0", "schedule.outer_iterations=2"]


def run(run_dir: Path, url: str, extra=(), hooks=()) -> OuterLoop:
    torch.set_num_threads(1)
    loop = OuterLoop(compose(overrides(url) + list(extra)), run_dir, hooks=hooks)
    loop.run()
    return loop


class Spy:
    """Records every trainer update: (role, policy loss, batch, metrics)."""

    def __init__(self):
        self.updates = []

    def install(self, monkeypatch):
        update = torch_backend.TorchTrainer.update

        def spy(trainer, batch, **kwargs):
            out = update(trainer, batch, **kwargs)
            self.updates.append((trainer.role, trainer.cfg.policy_loss, list(batch), out))
            return out

        monkeypatch.setattr(torch_backend.TorchTrainer, "update", spy)


@pytest.fixture(scope="module")
def reference(teacher_url, tmp_path_factory):
    """The uninterrupted run, with the trainer updates and the loop's state after every block."""
    mp = pytest.MonkeyPatch()
    spy = Spy()
    spy.install(mp)
    blocks = []

    def hook(event, loop, slot):
        if event == "block_end":
            ml = loop.method
            blocks.append((slot.iteration, slot.role, len(ml.curriculum), len(ml.fresh), list(ml.failures)))

    d = tmp_path_factory.mktemp("socratic")
    try:
        loop = run(d, teacher_url, hooks=[hook])
    finally:
        mp.undo()
    return SimpleNamespace(dir=d, loop=loop, spy=spy, blocks=blocks)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def no_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in read_metrics(run_dir)]


# ------------------------------------------------------------------ the run


def test_the_curriculum_grows_with_the_teachers_refinements(reference):
    recs = [r for r in records(reference.dir) if r["trajectories"]]
    first_exec = [r for r in recs if r["meta"]["block"] == "execution" and r["meta"]["outer_iteration"] == 1]
    assert len(first_exec) == 1  # tasks_per_update = 1, the curriculum still empty: the Generator's task
    (rec,) = first_exec
    meta = rec["meta"]
    assert not meta["teacher_problem"] and meta["teacher_grades"] == [0.0, 0.0]  # the random model never says 48
    assert meta["preference_pairs"] == []  # no winner, no reference: nothing to prefer
    assert meta["failed_solution"] is not None and meta["refinement"] == refined(rec["question"])
    # after each block: (iteration, block, curriculum size, fresh refinements, failures)
    assert [b[:4] for b in reference.blocks] == [(1, "planning", 0, 0), (1, "execution", 1, 1),
                                                 (2, "planning", 1, 0), (2, "execution", 1, 1)]
    assert reference.blocks[1][4] == [(rec["question"], meta["failed_solution"])]
    # the curriculum is in state.pt: it 2 played the first refinement and queued the refinement of its failure
    state = torch.load(reference.dir / "state.pt", weights_only=False)["method_loop"]
    (item,) = state["curriculum"]["items"]
    assert item["question"] == refined(refined(rec["question"])) and item["answer"] == "48"
    assert item["solution"] == REFERENCE
    assert state == reference.loop.method.state_dict()


def test_the_generator_imitates_the_teachers_problem_by_weighted_sft(reference):
    tok = build_byte_tokenizer()
    recs = records(reference.dir)
    src = next(r for r in recs if r["trajectories"] and r["meta"]["block"] == "execution")["question"]
    plan2 = [r for r in recs if r["meta"]["block"] == "planning" and r["meta"]["outer_iteration"] == 2]
    # the Generator's prompts are the failure; its own outputs are recorded under topic "failure"
    assert {r["meta"]["topic"] for r in plan2} == {"failure", "teacher"}
    (teacher_rec,) = [r for r in plan2 if r["meta"]["topic"] == "teacher"]
    assert teacher_rec["question"] == refined(src) and teacher_rec["meta"]["teacher_grades"] == [0.0, 0.0]
    assert teacher_rec["meta"]["imitation_weight"] == pytest.approx(U_ZERO, abs=1e-6)
    plan_updates = [u for u in reference.spy.updates if u[0] == "planning"]
    assert len(plan_updates) == 1  # it 1's Planning step had nothing to imitate: skipped
    _, loss_name, batch, out = plan_updates[0]
    assert loss_name == "weighted_sft"
    (sample,) = batch
    assert sample.advantage == pytest.approx(U_ZERO, abs=1e-6)
    target = tok.decode([t for t, m in zip(sample.token_ids, sample.loss_mask) if m])
    assert target.startswith(f"{refined(src)}\nAnswer: \\boxed{{48}}")
    prompt = tok.decode([t for t, m in zip(sample.token_ids, sample.loss_mask) if not m])
    assert "got this problem wrong" in prompt and src in prompt
    # one sample, Eq. 21 token weights summing to 1: loss = U · (mean NLL of the target tokens)
    assert out["actor/loss"] == pytest.approx(U_ZERO * out["actor/nll"], rel=1e-4)
    metrics = read_metrics(reference.dir)
    assert [(m["block"], m[f"{m['block']}/skipped"]) for m in metrics] == [
        ("planning", 1.0), ("execution", 1.0), ("planning", 0.0), ("execution", 0.0)]
    assert metrics[2]["planning/nll"] == pytest.approx(out["actor/nll"])
    assert metrics[2]["socratic/imitation_examples"] == 1
    assert metrics[2]["socratic/imitation_weight_mean"] == pytest.approx(U_ZERO, abs=1e-6)


def test_the_solver_learns_by_dpo_on_teacher_judged_pairs(reference):
    tok = build_byte_tokenizer()
    exec_updates = [u for u in reference.spy.updates if u[0] == "execution"]
    assert len(exec_updates) == 1  # it 1: no pair, skipped
    _, loss_name, batch, out = exec_updates[0]
    assert loss_name == "dpo"
    # pairs (reference, 0), (reference, 1): chosen +1 then rejected −1, each pair one group
    assert [(s.advantage, s.group) for s in batch] == [(1.0, 0), (-1.0, 0), (1.0, 1), (-1.0, 1)]
    for chosen in batch[0::2]:
        assert tok.decode([t for t, m in zip(chosen.token_ids, chosen.loss_mask) if m]).startswith(REFERENCE)
    # π_ref is reset at the start of it 2 and the Solver had not moved: z = 0 for both pairs, so each pair's
    # loss is log 2 and the batch's (pair weights summing to 1) is log 2 = 0.693147; margin 0, accuracy 0
    assert out["actor/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert out["actor/dpo_margin"] == pytest.approx(0.0, abs=1e-5) and out["actor/dpo_accuracy"] == 0.0
    m = read_metrics(reference.dir)[3]
    assert m["execution/dpo_margin"] == pytest.approx(0.0, abs=1e-5) and m["socratic/pairs"] == 2
    assert m["socratic/teacher_tasks"] == 1 and m["socratic/solver_success"] == 0.0
    (rec,) = [r for r in records(reference.dir) if r["meta"]["block"] == "execution"
              and r["meta"]["outer_iteration"] == 2 and r["trajectories"]]
    assert rec["meta"]["teacher_problem"] and rec["meta"]["preference_pairs"] == [[sz.REFERENCE, 0], [sz.REFERENCE, 1]]
    assert rec["expected_answer"] == "48"


def test_resume_after_a_stop_between_the_blocks_equals_an_uninterrupted_run(reference, teacher_url, tmp_path):
    def stop(event, loop, slot):
        if event == "block_end" and slot.iteration == 2 and slot.role == "planning":
            raise StopRun

    first = run(tmp_path, teacher_url, hooks=[stop])
    assert first.state.completed == 3 and not first.finished
    saved = torch.load(tmp_path / "state.pt", weights_only=False)["method_loop"]
    assert len(saved["curriculum"]["items"]) == 1 and saved["fresh"] == [] and len(saved["failures"]) == 1
    loop = run(tmp_path, teacher_url, ["resume=true"])
    assert loop.finished
    assert records(tmp_path) == records(reference.dir)
    assert no_timing(tmp_path) == no_timing(reference.dir)
    for role in ("planning", "execution"):
        a = torch.load(reference.dir / "checkpoints" / "iter2" / role / "model.pt", weights_only=True)
        b = torch.load(tmp_path / "checkpoints" / "iter2" / role / "model.pt", weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role
    assert (torch.load(tmp_path / "state.pt", weights_only=False)["method_loop"]
            == torch.load(reference.dir / "state.pt", weights_only=False)["method_loop"])


# ------------------------------------------------------------------ the pieces, by hand


def rollout(answer, text):
    return SimpleNamespace(final_answer=answer, text=text,
                           segments=[Segment([7], trainable=False), Segment([1, 2], trainable=True, logprobs=[-1.0] * 2)])


def test_socratic_loop_pieces_by_hand(teacher_url):
    cfg = compose(["method=socratic_zero", f"method.extra.teacher_endpoint={teacher_url}",
                   "method.extra.teacher_model=judge", "method.extra.failure_pool=2",
                   "method.extra.imitation_per_phase=1"])
    ml = build_method(cfg)
    assert isinstance(ml, sz.SocraticZero)
    tok = build_byte_tokenizer()
    # a method without a loop of its own (R-Zero): no state, no prompts of its own, the GRPO batch
    rz = build_method(compose(["method=r_zero"]))
    assert not isinstance(rz, sz.SocraticZero) and rz.state_dict() is None
    assert rz.planning_prompts(tok, cfg.player, 2) is None and rz.minibatch_samples("execution", [], tok, cfg.player) is None
    assert ml.planning_prompts(tok, cfg.player, 2) is None  # no failure yet: the topic prompts
    gen = [PlanningTask("", f"g{i}?", "1", True) for i in range(3)]
    groups, tasks, unused = ml.phase_tasks("execution", [gen], gen, [], 2)
    assert tasks == gen[:2] and unused == gen[2:] and groups == [gen]  # empty curriculum: the Generator's
    # g0: one right (48), one wrong -> pair (0, 1); g1: both wrong, no reference -> no pair
    played = [PlayedTask(t, rs) for t, rs in zip(tasks, [[rollout("48", "a"), rollout("5", "b")],
                                                         [rollout("6", "c"), rollout("7", "d")]])]
    ml.after_rollouts("execution", played)
    assert ml.failures == [("g0?", "b"), ("g1?", "c")]
    assert [i.question for i in ml.curriculum.items] == [refined("g0?"), refined("g1?")] and len(ml.fresh) == 2
    assert [(s.advantage, s.group) for s in ml.minibatch_samples("execution", played, tok, cfg.player)] == [(1.0, 0), (-1.0, 0)]
    assert ml.minibatch_samples("execution", played[1:], tok, cfg.player) == []
    assert ml.record_meta(played[1])["refinement"] == refined("g1?")
    assert ml.record_meta(played[0])["teacher_grades"] == [1.0, 0.0]
    # the Generator's prompts: the 3 most recent failures, cycled over the 2 kept (failure_pool = 2)
    prompts = ml.planning_prompts(tok, cfg.player, 3)
    assert [t for t, _ in prompts] == ["failure"] * 3
    assert ["g0?" in p for _, p in prompts] == [True, False, True] and "got this problem wrong" in prompts[0][1]
    # Planning: the Generator's tasks plus imitation_per_phase = 1 fresh refinement, as one more group
    groups, tasks, _ = ml.phase_tasks("planning", [gen[:1]], gen[:1], [], 1)
    assert [t.question for t in tasks] == ["g0?", refined("g0?")] and len(groups) == 2 and tasks[1].prompt_index == 1
    assert len(ml.fresh) == 1
    # the refinement solved 1 of 2 times: s = 0.5, U = exp(0) = 1; the Generator's own task gives no example
    played = [PlayedTask(t, rs) for t, rs in zip(tasks, [[rollout("1", "x"), rollout("2", "y")],
                                                         [rollout("48", "z"), rollout("3", "w")]])]
    ml.after_rollouts("planning", played)
    assert len(ml.curriculum) == 2 and ml.failures == [("g0?", "b"), ("g1?", "c")]  # Planning refines nothing
    (sft,) = ml.minibatch_samples("planning", played, tok, cfg.player)
    assert sft.advantage == 1.0 and ml.minibatch_metrics("planning", played)["socratic/imitation_weight_mean"] == 1.0
    # the state round-trips through plain JSON
    again = build_method(cfg)
    again.load_state_dict(json.loads(json.dumps(ml.state_dict())))
    assert again.state_dict() == ml.state_dict() and again.failures == ml.failures


@pytest.mark.parametrize("extra,match", [
    ([], "method.extra.teacher_endpoint"),
    (["trainer.roles.execution.kl_coef=0.0"], "kl_coef, which must be > 0"),
    (["trainer.micro_batch_size=3"], "even trainer.micro_batch_size"),
    (["trainer.grad_accum_steps=2"], "grad_accum_steps=0"),
    (["trainer.roles.execution.policy_loss=grpo_clip"], "policy_loss=dpo"),
    (["trainer.roles.planning.policy_loss=grpo_clip"], "policy_loss=weighted_sft"),
])
def test_start_up_checks(extra, match, teacher_url, tmp_path):
    endpoint = [] if match == "method.extra.teacher_endpoint" else [f"method.extra.teacher_endpoint={teacher_url}",
                                                                    "method.extra.teacher_model=judge"]
    with pytest.raises(ValueError, match=re.escape(match)):
        OuterLoop(compose(["experiment=tiny", "method=socratic_zero", *endpoint, *extra]), tmp_path)


def test_resume_inside_a_phase_of_two_units_equals_an_uninterrupted_run(teacher_url, tmp_path):
    """S = 2: a phase samples two minibatches at once (phase.pt); a stop after the first DPO step of it 2's
    Execution phase resumes on the saved minibatches, with the curriculum as it stood after the phase's sampling."""
    s2 = ["schedule.planning_updates=2", "schedule.execution_updates=2", "schedule.evaluation_updates=0",
          "schedule.steps_per_generation=2"]
    ref = run(tmp_path / "ref", teacher_url, s2)

    def stop(event, loop, slot):
        if event == "update_end" and slot.iteration == 2 and slot.role == "execution" and slot.step_in_phase == 0:
            raise StopRun

    first = run(tmp_path / "b", teacher_url, s2, hooks=[stop])
    assert first.state.completed == 7 and (tmp_path / "b" / "phase.pt").is_file()
    run(tmp_path / "b", teacher_url, s2 + ["resume=true"])
    assert records(tmp_path / "b") == records(tmp_path / "ref")
    metrics = no_timing(tmp_path / "ref")
    assert no_timing(tmp_path / "b") == metrics
    # it 2's Execution phase: two curriculum problems (one per minibatch), each minibatch a DPO step on its two pairs
    assert [m.get("socratic/pairs") for m in metrics[6:]] == [2, 2]
    assert all("execution/dpo_margin" in m for m in metrics[6:])
    assert ref.method.state_dict() == torch.load(tmp_path / "b" / "state.pt", weights_only=False)["method_loop"]


def test_socratic_zero_trains_adapter_players(tmp_path, teacher_url):
    """Socratic-Zero's loop (its Teacher the stub endpoint) with adapter players (trainer.lora.rank > 0): it runs to its
    end on one backbone, every player an adapter."""
    from unifiedplayers import lora

    loop = run(tmp_path, teacher_url, extra=["trainer.lora.rank=4"])
    assert loop.finished
    backbone = {id(p) for p in loop.players["planning"].model.parameters() if not p.requires_grad}
    for role, player in loop.players.items():
        assert lora.is_adapted(player.model), role
        assert {id(p) for p in player.model.parameters() if not p.requires_grad} == backbone, role
