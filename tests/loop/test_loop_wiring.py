"""The outer loop's wiring of rewards, advantages and updates, on a scripted scenario with SPREAD rewards.

Other loop tests run the tiny random model, whose groups mostly get equal rewards: no policy gradient, so a
flipped loss sign, an inverted reward, a dropped weight or negated advantages all pass them. Here a scripted
engine speaks for all three players so that every group of every block (Planning, Execution, Evaluation) has
distinct rewards, and the tests check, against numbers worked out by hand below:

1. the rewards of Eq. 2, 4 and 5 written to records.jsonl, in each block (``test_records_hold_hand_computed_rewards``);
2. the sign of every candidate's advantage in the training batch saved in phase.pt (Eq. 17;
   ``test_training_batch_advantage_signs``);
3. that one GRPO update raises the summed log-prob of the group's best candidate, for each player
   (``test_update_raises_the_best_candidates_logprob``; weight decay 0, so only the policy gradient moves it).

One run of the tiny random Llama (byte tokenizer), one outer iteration, each block one phase of two optimizer
steps on the same minibatch (S = 1, μ = 2), so phase.pt holds the batch after the block's first update; weight
decay 0 and lr 3e-4 (see OVERRIDES). The scripted engine reports the real behaviour log-probs of the model
that samples (not a constant), so the first step's ratio is 1 and the clip does not silence the
negative-advantage candidates. "Before" an update is the backbone (``unifiedplayers.models.load_model``):
each player's first block starts from it (§3.2, Appendix E), which the test checks against the recorded behaviour
log-probs.

Only the loop's stable surface is used: OuterLoop(cfg, run_dir, rollout_factory=..., hooks=[...]), run(),
loop.players[role].model, records.jsonl, metrics.jsonl (block, phase_step, <role>/skipped,
<role>/reward_mean), phase.pt.

------------------------------------------------------------------------------------------------------------
The scenario and its rewards, by hand (conf/reward/default.yaml: α, β, γ = 0.4, 0.5, 0.1; w_unc, w_ver,
w_rep = 1.0, 1.0, 0.5; invalid verifier -1; a variant error earns no ρ_adv credit (none occurs here); a missing answer joins no
cluster; ρ_red = difflib ratio of canonical code tokens; R(q) = max sentence-BLEU/100 against the history;
perturbation=all: P = 5 rules, a rule that cannot apply is masked out of ρ_adv and V(q)).

Planning (G_T = 2 from one questioner prompt): task A "Ann has 6 bags with 7 apples ..." (answer 42) and
task B "Bo has 12 slices and eats 4 ..." (answer 8). Both well formed, so both are played in the Planning
block; in the Execution and Evaluation blocks tasks_per_update = 1 plays A only (B is "unused").

Execution on task A (K = 4), steps as the tool loop records them:
  τ0 = [reason "Compute.", code print(6 * 7), output "42", reason "... \\boxed{42}."]   answer 42
  τ1 = [reason "I guess \\boxed{40}."]                                                   answer 40
  τ2 = [reason "Compute.", code print(6 + 7), output "13", reason "... \\boxed{13}."]   answer 13
  τ3 = [reason "No idea."]                                                               no answer
Execution on task B: four copies of [reason, code print(12 - 4), output "8", reason "\\boxed{8}"].

Evaluation (M = 3) for a task with answer a (42 or 8):
  vA = return trajectory.final_answer == 'a'
  vS = s = trajectory.steps; return len(s) == 4 and s[1].type == 'code' and s[1].lang == 'python'
                                    and s[2].result == trajectory.final_answer
  vX = does not compile -> invalid, r_C = -1, not in I_valid, M_q = 2.

Variants (which variant a rule picks is random, but every verdict below holds for every draw):
  τ0: all 5 apply. arg_mutation changes 6 or 7 by ±1/±2 -> output in {28,35,49,56,30,36,48,54} != 42,
      answer still 42; step_drop leaves 3 steps; step_swap moves the code span to index 0 or 2;
      early_terminate cuts at step 1 or 3 and sets a distractor of 42 (41,43,40,46,38,0); tool_substitute
      sets lang bash. vA rejects only early_terminate (1 of 5); vS rejects all 5.
  τ2: all 5 apply; arg_mutation outputs {11,12,14,15} != 13; distractors of 13 (12,14,10,0). vA rejects all 5
      (13 != 42 and no distractor is 42); vS rejects all 5 (as for τ0).
  τ1, τ3: one reason step: only step_drop and early_terminate apply (2 each). Answers 40 / none, distractors
      of 40 (39,41,44,36,0) / "0": vA and vS reject all 4.
  Task B's τ: all 5 apply; arg_mutation outputs {10,11,13,14 -> 6,7,9,10; 2,3,5,6 -> 10,9,7,6} != 8,
      distractors of 8 (7,9,10,0): vA rejects only early_terminate (4 of 20), vS all 20.

ρ_red: canonical tokens (names renumbered v0.., strings STR, NEWLINE/INDENT/DEDENT kept):
  vA = def v0 ( v1 ) : NL IN return v1 . final_answer == STR NL DE                          (16 tokens)
  vS = def v0 ( v1 ) : NL IN v2 = v1 . steps NL return len ( v2 ) == 4 and v2 [ 1 ] . type == STR
       and v2 [ 1 ] . lang == STR and v2 [ 2 ] . result == v1 . final_answer NL DE                (52 tokens)
  difflib matching blocks: "def .. IN" (8), then "return" (1), "v1 . final_answer" (3), "NL DE" (2) = 14,
  ratio = 2·14 / (16 + 52) = 7/17 for both (each is the other's only valid peer).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.diagnostics.records import load_records
from unifiedplayers.rollout.types import flatten_segments
from tests.players.scripted import ScriptedEngine

from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.loop.phase import Phase, load_phase_state
from unifiedplayers.roles import ROLES

pytestmark = pytest.mark.cpu

TASK_A = "Ann has 6 bags with 7 apples in each bag. How many apples does she have?"
TASK_B = "Bo has 12 slices and eats 4 of them. How many slices are left?"
V_ANSWER = "```python\ndef check(trajectory):\n    return trajectory.final_answer == '{a}'\n```"
V_STRICT = ("```python\ndef check(trajectory):\n    s = trajectory.steps\n    return len(s) == 4 and s[1].type == "
            "'code' and s[1].lang == 'python' and s[2].result == trajectory.final_answer\n```")
V_BROKEN = "```python\ndef check(trajectory):\n    return (\n```"
EXEC_A = ["Compute.\n```python\nprint(6 * 7)\n```\n", "I guess \\boxed{40}.",
          "Compute.\n```python\nprint(6 + 7)\n```\n", "No idea."]

# Each candidate of the trained groups, named by a piece of text only its trainable tokens hold.
CANDIDATES = {
    "planning": {"A": "Ann has 6 bags", "B": "Bo has 12 slices"},
    "execution": {"τ0": "print(6 * 7)", "τ1": "boxed{40}", "τ2": "print(6 + 7)", "τ3": "No idea."},
    "evaluation": {"vA": "final_answer == '42'\n", "vS": "s[2].result", "vX": "return (\n"},
}

# ---- Hand calculation (see the module docstring for the verdicts) ------------------------------------------
ALPHA, BETA, GAMMA, W_UNC, W_VER, W_REP = 0.4, 0.5, 0.1, 1.0, 1.0, 0.5
RHO_RED = 2 * 14 / (16 + 52)  # = 7/17, both valid verifiers of either task
# Task A. Z_orig rows (τ0..τ3): vA = [1,0,0,0] (only τ0 answers 42); vS = [1,0,1,0] (τ0 and τ2 are
# 4 steps, python code, output == answer).
A_EXECUTION = [(1 + 1) / 2, (0 + 0) / 2, (0 + 1) / 2, (0 + 0) / 2]  # Eq. 4: column means = [1, 0, 0.5, 0]
A_RHO_GOLD = [1 / 4, 2 / 4]  # row means of Z_orig
# Existing variants: 5 + 2 + 5 + 2 = 14. Rejections: vA 1 + 2 + 5 + 2 = 10, vS 14.
A_RHO_ADV = [10 / 14, 14 / 14]
A_EVALUATION = [ALPHA * A_RHO_GOLD[0] + BETA * A_RHO_ADV[0] - GAMMA * RHO_RED,  # 0.1 + 5/14 - 0.7/17 = 0.41597
                ALPHA * A_RHO_GOLD[1] + BETA * A_RHO_ADV[1] - GAMMA * RHO_RED,  # 0.2 + 0.5 - 0.7/17 = 0.65882
                -1.0]  # vX: invalid_verifier_reward
A_U = 0.25  # answers 42, 40, 13, none: largest cluster 1 of K = 4, p̂ = 1/4, U = min(1/4, 3/4)
A_V = (A_RHO_ADV[0] + A_RHO_ADV[1]) / 3  # Eq. 3: (1/M) Σ_valid ρ_adv = (5/7 + 1) / 3 = 4/7
# Task B. Z_orig: all four identical correct trajectories accepted by both valid verifiers.
B_EXECUTION = [1.0, 1.0, 1.0, 1.0]
B_RHO_GOLD = [1.0, 1.0]
B_RHO_ADV = [4 / 20, 20 / 20]
B_EVALUATION = [ALPHA * 1.0 + BETA * 0.2 - GAMMA * RHO_RED,  # 0.4 + 0.1 - 0.7/17 = 0.45882
                ALPHA * 1.0 + BETA * 1.0 - GAMMA * RHO_RED,  # 0.4 + 0.5 - 0.7/17 = 0.85882
                -1.0]
B_U = 0.0  # all four answer 8: p̂ = 1
B_V = (B_RHO_ADV[0] + B_RHO_ADV[1]) / 3  # (0.2 + 1) / 3 = 0.4
# R(q): the Planning block's history is empty (R = 0); A and B join it at the block end, so in the
# Execution and Evaluation blocks task A is compared with itself: sentence-BLEU 100, R = 1.
PLANNING_A_FIRST_BLOCK = W_UNC * A_U + W_VER * A_V - W_REP * 0.0  # 0.25 + 4/7 = 0.82143
PLANNING_B_FIRST_BLOCK = W_UNC * B_U + W_VER * B_V - W_REP * 0.0  # 0 + 0.4 = 0.4
PLANNING_A_LATER = W_UNC * A_U + W_VER * A_V - W_REP * 1.0  # 0.82143 - 0.5 = 0.32143

# The advantage sign of each candidate of the trained group (Eq. 17: sign of r - mean(r) in the group):
#   Planning   r_T = (A 0.821, B 0.4), mean 0.611: A +, B -.
#   Execution  r_S = (1, 0, 0.5, 0), mean 0.375: τ0 +, τ1 -, τ2 +, τ3 -.
#   Evaluation r_C = (0.416, 0.659, -1), mean 0.025: vA +, vS +, vX -.
EXPECTED_SIGNS = {
    "planning": {"A": 1, "B": -1},
    "execution": {"τ0": 1, "τ1": -1, "τ2": 1, "τ3": -1},
    "evaluation": {"vA": 1, "vS": 1, "vX": -1},
}


def eq17(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """Eq. 17 with the population std (grpo.group_advantages' documented choice), ε = trainer.adv_eps."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (std + eps) for r in rewards]


# Planning (0.821, 0.4): ±1 (two candidates are one std either side of their mean).
# Execution (1, 0, 0.5, 0): mean 0.375, std sqrt(0.6875/4) = 0.41458 -> (1.508, -0.905, 0.302, -0.905).
# Evaluation (0.416, 0.659, -1): mean 0.025, std 0.732 -> (0.535, 0.867, -1.401).
EXPECTED_ADVANTAGES = {
    "planning": dict(zip("AB", eq17([PLANNING_A_FIRST_BLOCK, PLANNING_B_FIRST_BLOCK]))),
    "execution": dict(zip(["τ0", "τ1", "τ2", "τ3"], eq17(A_EXECUTION))),
    "evaluation": dict(zip(["vA", "vS", "vX"], eq17(A_EVALUATION))),
}
BEST = {"planning": "A", "execution": "τ0", "evaluation": "vS"}  # the highest reward of each group
WORST = {"planning": "B", "execution": "τ1", "evaluation": "vX"}  # a lowest (τ1 and τ3 tie)


def respond(ctx: str, index: int) -> str:
    """The three players' text: Planning index 0 writes task A, 1 task B; Execution and Evaluation by task."""
    reply = ctx.split("<|im_start|>assistant\n")[-1]
    if "Write a math problem" in ctx:
        return [f"{TASK_A}\nAnswer: \\boxed{{42}}", f"{TASK_B}\nAnswer: \\boxed{{8}}"][index % 2]
    on_a = TASK_A in ctx
    if "Write check(trajectory)" in ctx:
        return [V_ANSWER.format(a="42" if on_a else "8"), V_STRICT, V_BROKEN][index % 3]
    if on_a:
        if reply == "":
            return EXEC_A[index % 4]
        if "print(6 * 7)" in reply:
            return "So the answer is \\boxed{42}."
        if "print(6 + 7)" in reply:
            return "So the answer is \\boxed{13}."
    elif TASK_B in ctx:
        return "Compute.\n```python\nprint(12 - 4)\n```\n" if reply == "" else "So the answer is \\boxed{8}."
    raise AssertionError(f"unexpected context {reply!r}")


@torch.no_grad()
def token_logprobs(model, ids) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under ``model`` (temperature 1), with 0 at t = 0."""
    x = torch.as_tensor(list(ids), dtype=torch.long)[None]
    logits = model(input_ids=x).logits[0, :-1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


class BehaviourEngine(ScriptedEngine):
    """Scripted text, with the behaviour log-probs of the model that samples (the player's weights), so the
    first update's ratio is 1. Sample index = position within each call for multi-turn contexts."""

    def __init__(self, tokenizer, respond_fn, model):
        super().__init__(tokenizer, respond_fn)
        self.model = model

    def _complete(self, ids, j, max_new_tokens, stop):
        c = super()._complete(ids, j, max_new_tokens, stop)
        lp = token_logprobs(self.model, list(c.prompt_ids) + list(c.token_ids))[len(c.prompt_ids):]
        return dataclasses.replace(c, logprobs=lp.tolist())

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls += 1
        return [[self._complete(flatten_segments(ctx)[0], i * n + j, max_new_tokens, stop) for j in range(n)]
                for i, ctx in enumerate(contexts)]


OVERRIDES = [
    "experiment=tiny", "seed=3",
    "player.planning.response_prefix=", "player.evaluation.response_prefix=", "player.evaluation.stop=[]",
    "player.planning_max_new_tokens=200", "player.execution_max_new_tokens=200",
    "player.evaluation_max_new_tokens=200", "player.tasks_per_prompt=2", "player.num_trajectories=4",
    "player.num_verifiers=3", "sandbox.timeout_s=5", "perturbation=all",
    # one phase per block of S x μ = 1 x 2 optimizer steps on the same minibatch: phase.pt is on disk after step 1
    "schedule.planning_updates=2", "schedule.execution_updates=2", "schedule.evaluation_updates=2",
    "schedule.steps_per_generation=1", "trainer.num_iterations=2",
    # Only the policy gradient moves the weights. Adam's first step moves every weight by about lr: the tiny
    # preset's 1e-3 overshoots the linear regime (the shared byte-level tokens of the two Planning tasks then
    # drag the better one down with the worse); 3e-4 moves each best candidate by several nats.
    "trainer.weight_decay=0", "trainer.lr=3e-4",
]


def name_of(role: str, text: str) -> str:
    names = [n for n, key in CANDIDATES[role].items() if key in text]
    assert len(names) == 1, f"{role}: cannot tell which candidate wrote {text!r}"
    return names[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run; after each block's first update: the phase's batch (from phase.pt), each candidate's
    trainable tokens decoded, and its summed log-prob under the player's updated weights."""
    from unifiedplayers.models import load_model

    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("loop_wiring")
    cfg = compose(OVERRIDES)
    seen: dict[str, dict] = {}
    tok_box: list = []

    def factory(rc, model, tok):
        tok_box.append(tok)
        return BehaviourEngine(tok, respond, model)

    def hook(event, loop, slot):
        if event != "update_end":
            return
        line = read_metrics(run_dir)[-1]
        role = line["block"]
        if line["phase_step"] != 0 or role in seen:
            return
        saved = Phase.from_state(load_phase_state(run_dir / "phase.pt"))
        model = loop.players[role].model
        cands, count = {}, 0
        for minibatch in saved.minibatches:
            for s in minibatch.batch:
                mask = torch.as_tensor(list(s.loss_mask), dtype=torch.bool)
                ids = list(s.token_ids)
                text = tok_box[0].decode([t for t, m in zip(ids, mask.tolist()) if m])
                after = float(token_logprobs(model, ids)[mask].sum())
                cands[name_of(role, text)] = {"sample": s, "ids": ids, "mask": mask, "after": after}
                count += 1
        lengths = [len(s.token_ids) for minibatch in saved.minibatches for s in minibatch.batch]  # batch order
        seen[role] = {"metrics": line, "candidates": cands, "count": count, "lengths": lengths}

    loop = OuterLoop(cfg, run_dir, rollout_factory=factory, hooks=[hook])
    loop.run()
    backbone, _ = load_model(cfg.model)  # every player's weights before its first update (§3.2, Appendix E)
    for role in seen:
        for c in seen[role]["candidates"].values():
            c["before"] = float(token_logprobs(backbone, c["ids"])[c["mask"]].sum())
    return {"cfg": cfg, "dir": run_dir, "seen": seen, "records": load_records(run_dir / "records.jsonl"),
            "metrics": read_metrics(run_dir)}


def test_records_hold_hand_computed_rewards(run):
    """Eq. 2, 4, 5 (and their terms) in records.jsonl, block by block, against the hand calculation."""
    r = run["cfg"].reward
    # The hand calculation uses the config's weights: fail loudly if the preset changes under it.
    assert (r.alpha, r.beta, r.gamma, r.w_unc, r.w_ver, r.w_rep) == (ALPHA, BETA, GAMMA, W_UNC, W_VER, W_REP)
    assert r.invalid_verifier_reward == -1.0 and r.use_verifiability
    played = {}
    for rec in run["records"]:
        key = (rec.meta["block"], "A" if rec.question == TASK_A else "B")
        if rec.meta["status"] == "played":
            played[key] = rec
        else:  # task B beyond tasks_per_update = 1 in the Execution and Evaluation blocks
            assert rec.meta["status"] == "unused" and key[1] == "B" and key[0] != "planning", rec.meta
    assert sorted(played) == sorted([("planning", "A"), ("planning", "B"), ("execution", "A"),
                                     ("evaluation", "A")])

    def check(rec, execution, evaluation, rho_gold, rho_adv, u, v, rep, planning):
        got = rec.rewards
        assert rec.valid == [0, 1] and rec.num_generated == 3
        assert got["execution"] == pytest.approx(execution, abs=1e-9), "Eq. 4"
        assert got["rho_gold"] == pytest.approx(rho_gold, abs=1e-9)
        assert got["rho_adv"] == pytest.approx(rho_adv, abs=1e-9)
        assert got["rho_red"] == pytest.approx([RHO_RED, RHO_RED], abs=1e-9)
        assert got["evaluation"] == pytest.approx(evaluation, abs=1e-9), "Eq. 5"
        assert (got["U"], got["V"], got["R"]) == pytest.approx((u, v, rep), abs=1e-9)
        assert got["planning"] == pytest.approx(planning, abs=1e-9), "Eq. 2"

    check(played["planning", "A"], A_EXECUTION, A_EVALUATION, A_RHO_GOLD, A_RHO_ADV, A_U, A_V, 0.0,
          PLANNING_A_FIRST_BLOCK)
    check(played["planning", "B"], B_EXECUTION, B_EVALUATION, B_RHO_GOLD, B_RHO_ADV, B_U, B_V, 0.0,
          PLANNING_B_FIRST_BLOCK)
    for block in ("execution", "evaluation"):
        check(played[block, "A"], A_EXECUTION, A_EVALUATION, A_RHO_GOLD, A_RHO_ADV, A_U, A_V, 1.0, PLANNING_A_LATER)
    # the verdicts behind them (a check error would be a 0 in Z for another reason)
    rec = played["execution", "A"]
    assert rec.rules == ["arg_mutation", "step_drop", "step_swap", "early_terminate", "tool_substitute"]
    assert rec.z_orig.tolist() == [[1, 0, 0, 0], [1, 0, 1, 0]]
    present, one_step = [True] * 5, [False, True, False, True, False]  # τ1, τ3: step_drop, early_terminate
    assert rec.adv_mask.tolist() == [present, one_step, present, one_step]
    no = [0] * 5
    # vA accepts τ0's variants but the early-terminated one (its answer stays 42); everything else is rejected
    assert rec.z_adv.tolist() == [[[1, 1, 1, 0, 1], no, no, no], [no, no, no, no]]
    assert rec.meta["check_errors"] == []
    # the metrics line of each block's first update reports the mean of its minibatch's rewards
    first = {m["block"]: m for m in reversed(run["metrics"])}
    assert first["planning"]["planning/reward_mean"] == pytest.approx(
        (PLANNING_A_FIRST_BLOCK + PLANNING_B_FIRST_BLOCK) / 2)
    assert first["execution"]["execution/reward_mean"] == pytest.approx(sum(A_EXECUTION) / 4)  # 0.375
    assert first["evaluation"]["evaluation/reward_mean"] == pytest.approx(sum(A_EVALUATION) / 3)


def test_verifier_kinds_in_the_metrics_and_the_summary(run):
    """What the Evaluation reward pays each kind of verifier: each update's kind shares and mean advantages, and the summary's table per outer iteration.
    Task A's verifiers: vA (Z_orig [1,0,0,0]) and vS ([1,0,1,0]) discriminate, vX is invalid; no check errors."""
    import json

    from unifiedplayers.diagnostics.summary import write_summary

    adv = EXPECTED_ADVANTAGES["evaluation"]
    line = next(m for m in run["metrics"] if m["block"] == "evaluation")  # plays task A only
    assert line["evaluation/kind/invalid/share"] == pytest.approx(1 / 3)
    assert line["evaluation/kind/discriminating/share"] == pytest.approx(2 / 3)
    for kind in ("crashes_answered", "rejects_all", "accepts_all"):
        assert line[f"evaluation/kind/{kind}/share"] == 0.0 and line[f"evaluation/kind/{kind}/advantage"] is None
    assert line["evaluation/kind/invalid/advantage"] == pytest.approx(adv["vX"], rel=1e-6)
    assert line["evaluation/kind/discriminating/advantage"] == pytest.approx((adv["vA"] + adv["vS"]) / 2, rel=1e-6)
    summary, text = write_summary(run["dir"], png=False)
    table = summary["verifier_kinds"]  # the Evaluation block's records: task A, played once
    assert list(table) == [1] and table[1]["invalid"]["n"] == 1 and table[1]["discriminating"]["n"] == 2
    assert table[1]["discriminating"]["advantage"] == pytest.approx((adv["vA"] + adv["vS"]) / 2, rel=1e-6)
    assert "| 1 | 33%, -1.40 | 0%, – | 0%, – | 0%, – | 67%, +0.70 |" in text
    assert json.loads((run["dir"] / "summary.json").read_text())["verifier_kinds"]["1"]["invalid"]["n"] == 1


@pytest.mark.parametrize("role", ROLES)
def test_pad_share_of_each_update_in_the_metrics_and_the_summary(run, role):
    """``<role>/pad_share``: the padded positions of the update's micro-batches over those processed, from the batch's
    lengths (phase.pt); the summary gives each player's mean over its updates."""
    from unifiedplayers.config import role_trainer_config
    from unifiedplayers.diagnostics.summary import write_summary
    from unifiedplayers.trainer.batching import micro_batch_members, pad_share

    lengths = run["seen"][role]["lengths"]
    members = micro_batch_members(lengths, role_trainer_config(run["cfg"].trainer, role))
    expected = pad_share(lengths, members)
    assert len(set(lengths)) > 1 and 0.0 < expected < 1.0
    assert run["seen"][role]["metrics"][f"{role}/pad_share"] == pytest.approx(expected, abs=1e-12)
    values = [m[f"{role}/pad_share"] for m in run["metrics"] if f"{role}/pad_share" in m]
    summary, text = write_summary(run["dir"], png=False)
    assert summary["pad_share"][role] == pytest.approx(sum(values) / len(values), abs=1e-12)
    assert f"{role} {100 * summary['pad_share'][role]:.1f} %" in text.split("padding in the updates' micro-batches")[1]


@pytest.mark.parametrize("role", ROLES)
def test_training_batch_advantage_signs(run, role):
    """Eq. 17 in the batch the trainer gets (phase.pt): above the group mean +, below it -, one group."""
    cands = run["seen"][role]["candidates"]
    assert sorted(cands) == sorted(EXPECTED_SIGNS[role]), "the batch holds exactly the group's candidates"
    assert run["seen"][role]["count"] == len(cands), "each candidate once"
    assert len({c["sample"].group for c in cands.values()}) == 1
    for name, sign in EXPECTED_SIGNS[role].items():
        adv = float(cands[name]["sample"].advantage)
        assert adv * sign > 0.1, f"{role} {name}: advantage {adv:+.3f}, expected sign {sign:+d}"
    assert float(cands[BEST[role]]["sample"].advantage) == max(float(c["sample"].advantage) for c in cands.values())
    for name, adv in EXPECTED_ADVANTAGES[role].items():
        assert float(cands[name]["sample"].advantage) == pytest.approx(adv, rel=1e-5), f"{role} {name}"


@pytest.mark.parametrize("role", ROLES)
def test_update_raises_the_best_candidates_logprob(run, role):
    """One GRPO step (weight decay 0) raises log π(best candidate) and widens its lead over a worst one."""
    seen = run["seen"][role]
    assert seen["metrics"][f"{role}/skipped"] == 0.0
    cands = seen["candidates"]
    # The behaviour log-probs recorded at sampling are the backbone's: "before" is the player's start.
    for c in cands.values():
        old = torch.as_tensor(list(c["sample"].old_logprobs), dtype=torch.float32)[c["mask"]].sum()
        assert float(old) == pytest.approx(c["before"], abs=1e-3)
    best, worst = cands[BEST[role]], cands[WORST[role]]
    rise = best["after"] - best["before"]
    lead = (best["after"] - worst["after"]) - (best["before"] - worst["before"])
    # (At lr 3e-4 the rises are about 4 nats and the leads 7-13; numerical noise is below 1e-3.)
    assert rise > 1.0, f"{role}: log-prob of the best candidate moved by {rise:+.3f} nats"
    assert lead > 2.0, f"{role}: the best candidate's lead over the worst moved by {lead:+.3f} nats"
