"""Golden runs: the whole outer loop, per method, writes exactly the records and metrics it wrote when the
golden files were made (a refactor that must not change behaviour proves it here).

Each run drives the tiny random Llama's players with scripted text (tests/players/scripted.py), chosen so
that every trained player's groups have a spread of rewards: every stage of the loop runs (tasks,
trajectories with tool calls, verifiers, perturbations, verdicts, rewards, GRPO minibatches, updates that are not
skipped, checkpoints, run state), and the trainer's figures (loss, grad-norm, KL, ...) come from real
updates of the tiny model. Socratic-Zero runs with the stub Teacher (tests/methods/stub_teacher.py).

Records (text, integers, verdicts, rewards) match exactly, and so do the metrics computed from them (reward
means, rates, ρ's). The figures that come from the trainer's gradients and log-probs (:data:`TRAINER_FIGURE`:
grad-norms and their spread, KL, losses, ratios, entropies) match to rtol 1e-5: fp32 reductions run through
other kernels on other CPUs. Measured spread against the golden files (made on an AMD EPYC with AVX2 only),
every records.jsonl byte-identical on all three kinds:

- Intel Xeon with AMX-BF16 (``../shared/cross-cpu/golden-intel-xeon-amx``): execution/grad_norm/cv 5.3e-6,
  evaluation/grad_norm/cv 3.3e-6, evaluation/kl 2.9e-6, planning/grad_norm/cv 1.4e-6, evaluation/grad_norm 1.4e-6;
- AMD EPYC (Zen 5) with AVX512-BF16: execution/grad_norm/cv 5.5e-6, evaluation/grad_norm/cv 3.4e-6,
  evaluation/grad_norm 1.3e-6, evaluation/kl 1.3e-6.

1e-5 covers the largest, 5.5e-6, with less than a factor 2 to spare. ``timing/*`` and ``perf/*`` keys are left out.
A change of behaviour on purpose regenerates the files in one commit that says what changed and why:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/golden -q

The files in tests/golden/data/ were made on an AMD EPYC (AVX2, no native bf16), torch 2.13.0 CPU, one
torch thread, at commit cf02bc5's behaviour. Changed on purpose since, with every other value kept as made there:
``<role>/entropy_bank_mean`` and ``<role>/entropy_ratio`` per update are gone (``trainer.entropy_every`` now defaults
to 0: the bank is scored at a block's start and end only; with ``entropy_every=1`` the old files match), and
``<role>/pad_share`` and the verifier kinds' ``evaluation/kind/*`` keys were added (from a run on an Intel Xeon with
AMX; they are counts and shares, not gradient figures). Two keys were renamed, with every line otherwise
byte-identical: ``execution/accuracy_vs_pool`` is ``execution/accuracy_by_verifiers`` ("pool" now means only the
Execution player's fixed diagnostic pool) and ``phase_unit`` is ``phase_minibatch``.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.rollout.types import flatten_segments

from tests.golden.golden_compare import DATA, assert_same, read_lines
from tests.players.scripted import ScriptedEngine
from tests.methods.stub_teacher import serve_teacher

pytestmark = pytest.mark.cpu

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# --------------------------------------------------------------------------------------------------
# What the scripted players write

TASKS = {  # topic -> (question, answer, the code that computes it)
    "arithmetic": ("Ann has 6 bags with 7 apples in each bag. How many apples does she have?", "42", "6 * 7"),
    "fractions": ("A pizza has 12 slices and Bo eats a third of them. How many slices are left?", "8", "12 - 12 // 3"),
}
VERIFIERS = [
    # checks the answer against the task's answer: rejects wrong and missing answers
    "```python\ndef check(trajectory):\n    return trajectory.final_answer in ('42', '8')\n```",
    # a format check: a tool call was made
    "```python\ndef check(trajectory):\n    return len(trajectory.steps) >= 3\n```",
    "```python\ndef check(trajectory):\n    return (\n```",  # does not compile: invalid
]


def _task_of(ctx: str) -> tuple[str, str, str]:
    return next((TASKS[t] for t in TASKS if TASKS[t][0] in ctx), TASKS["arithmetic"])


def math_respond(ctx: str, index: int) -> str:
    """The three UnifiedPlayers players (and the R-Zero / Agent0 questioner and solver) on the tiny prompts."""
    reply = ctx.split("<|im_start|>assistant\n")[-1]
    if "Write a math problem" in ctx:  # Planning: G_T = 2 outputs, the second malformed
        topic = "fractions" if "fractions" in ctx.split("<|im_start|>user\n")[-1] else "arithmetic"
        q, a, _ = TASKS[topic]
        return f"{q}\nAnswer: \\boxed{{{a}}}" if index % 2 == 0 else "I have no idea what to write."
    if "Write check(trajectory)" in ctx:
        return VERIFIERS[index % len(VERIFIERS)]
    q, a, code = _task_of(ctx)
    if reply == "":  # the Execution player's first turn: K = 4 different kinds of solution
        return [f"Compute.\n```python\nprint({code})\n```\n", f"I guess \\boxed{{{int(a) - 1}}}.",
                f"Compute.\n```python\nprint({code})\n```\n", "No idea."][index % 4]
    if reply.startswith("Compute."):
        return f"So the answer is \\boxed{{{a}}}."
    raise AssertionError(f"unexpected context {reply!r}")


def plain_respond(ctx: str, index: int) -> str:
    """Methods without tools (R-Zero): one generation per trajectory, answers that split the majority."""
    if "Write a math problem" in ctx or "Write check(trajectory)" in ctx:
        return math_respond(ctx, index)
    q, a, code = _task_of(ctx)
    return [f"{code} = {a}, so \\boxed{{{a}}}.", f"About \\boxed{{{int(a) - 1}}}.", f"It is \\boxed{{{a}}}.",
            "No idea."][index % 4]


AZR_PROPOSAL = "```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```"


def azr_respond(ctx: str, index: int) -> str:
    """Absolute Zero: a proposer that writes f(x) = 3x with input 4 (or nothing), a solver that answers 12 or 4."""
    if "deterministic Python functions" in ctx:
        return AZR_PROPOSAL if index % 2 == 0 else "I cannot think of a function."
    return ["f(4) = 12, so \\boxed{12}.", "The input is \\boxed{4}.", "\\boxed{12}", "Hmm."][index % 4]


class IndexedEngine(ScriptedEngine):
    """Sample index = position within each call for multi-turn contexts (the tool loop sends each sample as
    its own context, n = 1)."""

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls += 1
        return [[self._complete(flatten_segments(ctx)[0], i * n + j, max_new_tokens, stop) for j in range(n)]
                for i, ctx in enumerate(contexts)]


SCRIPTED = ["player.planning.response_prefix=", "player.evaluation.response_prefix=", "player.evaluation.stop=[]",
            "player.planning_max_new_tokens=200", "player.execution_max_new_tokens=200",
            "player.evaluation_max_new_tokens=200", "player.tasks_per_prompt=2", "player.num_trajectories=4",
            "sandbox.timeout_s=5"]
PHASES = ["schedule.planning_updates=2", "schedule.execution_updates=2", "schedule.evaluation_updates=2",
          "schedule.steps_per_generation=2"]

# method -> (overrides, respond, roles it trains, writes verifiers)
RUNS = {
    "unifiedplayers": (["player.num_verifiers=3", "schedule.outer_iterations=2"] + PHASES, math_respond,
                       ("planning", "execution", "evaluation"), True),
    "r_zero": (["method=r_zero"] + PHASES, plain_respond, ("planning", "execution"), False),
    "agent0": (["method=agent0"] + PHASES, math_respond, ("planning", "execution"), False),
    "absolute_zero": (["method=absolute_zero", "method.shared_model=false", "player.topics=[deduction,abduction]"]
                      + PHASES, azr_respond, ("planning", "execution"), False),
}

def check_against_golden(method: str, run_dir: Path) -> tuple[list, list]:
    records, metrics = read_lines(run_dir / "records.jsonl"), read_lines(run_dir / "metrics.jsonl")
    golden = DATA / method
    if UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for name, lines in (("records.jsonl", records), ("metrics.jsonl", metrics)):
            (golden / name).write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
    assert golden.is_dir(), f"no golden files for {method}: run with UPDATE_GOLDEN=1 once"
    assert_same(records, read_lines(golden / "records.jsonl"), f"{method}/records")
    assert_same(metrics, read_lines(golden / "metrics.jsonl"), f"{method}/metrics", new_keys_allowed=True)
    return records, metrics


def assert_every_stage_ran(records, metrics, roles, verifiers: bool) -> None:
    played = [r for r in records if r["meta"]["status"] == "played"]
    assert played, "no task was played"
    if verifiers:
        assert sum(len(r["valid"]) for r in played) > 0, "no valid verifier"
    for role in roles:
        lines = [m for m in metrics if m["block"] == role]
        assert any(m[f"{role}/skipped"] == 0.0 for m in lines), f"every {role} update was skipped"


def run_loop(overrides, run_dir: Path, respond=None):
    from unifiedplayers.loop.outer import OuterLoop

    torch.set_num_threads(1)
    factory = None if respond is None else (lambda rc, model, tok: IndexedEngine(tok, respond))
    loop = OuterLoop(compose(["experiment=tiny", "seed=3"] + list(overrides)), run_dir, rollout_factory=factory)
    loop.run()
    return loop


@pytest.mark.parametrize("method", sorted(RUNS))
def test_golden_run(method, tmp_path):
    overrides, respond, roles, verifiers = RUNS[method]
    run_loop(SCRIPTED + overrides, tmp_path, respond)
    records, metrics = check_against_golden(method, tmp_path)
    assert_every_stage_ran(records, metrics, roles, verifiers)


def _teacher_reply(prompt: str) -> str:
    if "got this problem wrong" in prompt:
        q = re.search(r"Problem:\n(.*?)\n\nThe student's solution", prompt, re.DOTALL).group(1)
        return f"Problem: Practice after '{q}': what is 6 * 8?\nSolution: 6 * 8 = 48, so \\boxed{{48}}."
    return "CORRECT" if re.search(r"final answer: (.*)\n", prompt).group(1) == "48" else "INCORRECT"


def test_golden_run_socratic_zero(tmp_path):
    """Socratic-Zero with the stub Teacher on the tiny model's own samples (as tests/methods/test_socratic_loop.py):
    its Generator's imitation step and its Solver's DPO step both train in the second outer iteration."""
    with serve_teacher(_teacher_reply) as teacher:
        run_loop(["method=socratic_zero", f"method.extra.teacher_endpoint={teacher.url}",
                  "method.extra.teacher_model=judge", "method.extra.curriculum_share=1.0",
                  "schedule.outer_iterations=2"], tmp_path)
    records, metrics = check_against_golden("socratic_zero", tmp_path)
    assert_every_stage_ran(records, metrics, ("planning", "execution"), False)
