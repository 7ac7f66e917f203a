"""Degenerate strategies, priced: ``python -m eval.analysis.strategies [--reward PRESET]`` (docs/method.md).

What each player's reward pays for the degenerate strategies of §3.2 (an Evaluation player that accepts or rejects
all, or whose checks error), through the real feedback: hand-made tasks and Execution samples, the Planning parser,
the sandbox, the five rules of ``conf/perturbation/all.yaml`` and Eq. 2-5
(:func:`unifiedplayers.feedback.pipeline.phase_feedback`). Task A has two right originals of K = 5, task B none
(where Eq. 5 leaves ties). Each Evaluation strategy is priced in a pool of M = 2 beside the same honest companion
(Appendix I.3's Verifier 1.2), so ρ_red is comparable across rows; Execution and Planning are priced with three
honest verifiers (:data:`HONEST`). Perturbation seed 0; no number here depends on the sandbox's CPU limit.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator, Optional, Sequence

SEED = 0  # the perturbation engine's seed
SANDBOX_TIMEOUT_S = 0.5  # CPU seconds per check (wall clock: 3x, SandboxConfig.wall_timeout_factor)

# Planning outputs (what the Planning player writes; parse_task splits question and answer)

PLANNING_A = ("Mia buys 7 boxes of 12 pencils and gives 15 pencils away. How many pencils does she have left?\n"
              "Answer: \\boxed{69}")
PLANNING_ALL = ("A train travels at 60 km per hour for 3 hours, then at 45 km per hour for 2 hours. "
                "How many kilometres does it travel in all?\nAnswer: \\boxed{270}")
PLANNING_NONE = "How many ordered pairs of positive integers (a, b) satisfy a^2 + b^2 = 5^20?\nAnswer: \\boxed{20}"
PLANNING_SHORT = "Compute 7 x 12.\nAnswer: \\boxed{84}"  # a question under player.task_min_chars (20)
PLANNING_NO_BOX = ("Mia buys 7 boxes of 12 pencils and gives 15 pencils away. How many pencils does she have "
                   "left?\nAnswer: 69")
HISTORY = (  # R(q)'s earlier questions (the repeat strategy adds task A's own question)
    "A farmer has 3 fields of 40 sheep each and sells 25 sheep. How many sheep are left?",
    "What is the sum of the first 20 positive even numbers?",
    "A rectangle is 8 cm long and 5 cm wide. What is its area in square centimetres?",
)

# Execution samples: ("text", reasoning) and ("code", python) parts; the sandbox prints each code part's output,
# written as the tool loop writes observations, and parse_transcript reads the transcript.


@dataclass(frozen=True)
class Sample:
    """One hand-made Execution sample: ``key``, a table ``label`` and its transcript parts."""

    key: str
    label: str
    parts: tuple[tuple[str, str], ...]


SAMPLES_A = (
    Sample("correct_tool", "correct, with a tool call", (
        ("text", "She buys 7 boxes of 12 pencils and gives 15 away; compute it."),
        ("code", "print(7 * 12 - 15)"),
        ("text", "So the answer is \\boxed{69}."))),
    Sample("wrong_tool", "wrong (99), with a tool call", (
        ("text", "She has 7 boxes of 12 pencils and 15 more; compute it."),
        ("code", "print(7 * 12 + 15)"),
        ("text", "So the answer is \\boxed{99}."))),
    Sample("boxed_no_tool", "boxed answer, no tool call (right: 69)", (
        ("text", "7 boxes of 12 make 84 pencils and 84 - 15 = 69. So the answer is \\boxed{69}."),)),
    Sample("question_copied", "the question copied", (
        ("text", "Mia buys 7 boxes of 12 pencils and gives 15 pencils away. How many pencils does she have left?"),)),
    Sample("empty", "empty", ()),
)
WRONG_84 = Sample("wrong_84", "wrong (84), with a tool call", (
    ("text", "She buys 7 boxes of 12 pencils; count them."),
    ("code", "print(7 * 12)"),
    ("text", "So the answer is \\boxed{84}.")))
SAMPLES_B = (SAMPLES_A[1], WRONG_84, SAMPLES_A[3], SAMPLES_A[4])
SAMPLES_ALL = (
    Sample("all_1", "270, tool", (("text", "Distance is speed times time, for each part."),
                                  ("code", "print(60 * 3 + 45 * 2)"), ("text", "So the answer is \\boxed{270}."))),
    Sample("all_2", "270, tool", (("text", "Compute both parts of the trip."),
                                  ("code", "first = 60 * 3\nsecond = 45 * 2\nprint(first + second)"),
                                  ("text", "So the answer is \\boxed{270}."))),
    Sample("all_3", "270, tool", (("text", "Sum speed times time over the two legs."),
                                  ("code", "print(sum(v * t for v, t in [(60, 3), (45, 2)]))"),
                                  ("text", "So the answer is \\boxed{270}."))),
    Sample("all_4", "270, tool", (("text", "Add the two legs."), ("code", "legs = [60 * 3, 45 * 2]\nprint(sum(legs))"),
                                  ("text", "So the answer is \\boxed{270}."))),
)
SAMPLES_NONE = (  # every sample stops before an answer (out of tokens or turns)
    Sample("none_1", "no answer", (("text", "Factor the right-hand side first."), ("code", "print(5 ** 20)"),
                                   ("text", "Now count the ways to write 95367431640625 as a sum of two"))),
    Sample("none_2", "no answer", (("text", "b is at most the square root."),
                                   ("code", "import math\nprint(math.isqrt(5 ** 20))"),
                                   ("text", "So a runs from 1 to 9765625 and for each a we"))),
    Sample("none_3", "no answer", (("text", "Try small powers of 5 to see a pattern."),
                                   ("code", "print([5 ** k for k in range(1, 5)])"))),
    Sample("none_4", "no answer", (("text", "Each prime 5 = (2+i)(2-i) splits in the Gaussian integers, so the "
                                            "count depends on the exponent 20 and"),)),
)

# Verifiers (what the Evaluation player writes)

COMPANION = '''def check(trajectory):
    outs = [s.result for s in trajectory.steps if s.type == "output"]
    if not outs or str(outs[-1]).strip() != str(trajectory.final_answer).strip():
        return False, "code output and final answer mismatch"
    return True, "passed"
'''  # Appendix I.3, Verifier 1.2

TAMPER_DETECTOR = '''def check(trajectory):
    steps = trajectory.steps
    answer = trajectory.final_answer
    if answer is None or not steps or steps[0].type != "reason":
        return (False, 0)
    outputs = []
    for i, s in enumerate(steps):
        if s.type == "code" and (s.lang != "python" or i + 1 == len(steps) or steps[i + 1].type != "output"):
            return (False, i)
        if s.type == "output":
            if i == 0 or steps[i - 1].type != "code":
                return (False, i)
            outputs.append(str(s.result).strip())
    last = len(steps) - 1
    if not outputs or steps[last].type != "reason" or "\\\\boxed{" + answer + "}" not in steps[last].text:
        return (False, last)
    if outputs[-1] != answer.strip():
        return (False, last)
    return True
'''  # the form of a tool trajectory: reason first, python code each with its output, the last output boxed last


def answer_checker(answer: str) -> str:
    """A perfect answer checker of a task whose answer is the integer ``answer`` (it knows the answer, which the
    Evaluation player is never shown: the best an answer check can do)."""
    return f'''def check(trajectory):
    expected = {int(answer)}
    try:
        right = int(str(trajectory.final_answer).strip()) == expected
    except ValueError:
        right = False
    return True if right else (False, max(0, len(trajectory.steps) - 1))
'''


@dataclass(frozen=True)
class Strategy:
    """One Evaluation strategy: ``key``, a table ``label`` and its verifier source."""

    key: str
    label: str
    source: str


EVALUATION_STRATEGIES = (
    Strategy("raises", "raises on all (`trajectory.step`: AttributeError)",
             "def check(trajectory):\n    n = len(trajectory.step)\n    return n > 0\n"),
    Strategy("returns_none", "returns None on all (no return)",
             "def check(trajectory):\n    ok = trajectory.final_answer == '69'\n"),
    Strategy("prefix_raises", "prefix-crasher: rejects unanswered, raises on answered",
             "def check(trajectory):\n    if trajectory.final_answer is None:\n        return (False, 0)\n"
             "    raise NotImplementedError('compare the answer with the work')\n"),
    Strategy("prefix_none", "prefix-crasher: rejects unanswered, returns None on answered",
             "def check(trajectory):\n    if trajectory.final_answer is None:\n        return (False, 0)\n"
             "    answer = trajectory.final_answer.strip()\n"),
    Strategy("prefix_timeout", "prefix-sleeper: rejects unanswered, sleeps past the limit on answered",
             "import time\n\n\ndef check(trajectory):\n    if trajectory.final_answer is None:\n"
             "        return (False, 0)\n    while True:\n        time.sleep(1)\n"),
    Strategy("reject_all", "clean reject-all", "def check(trajectory):\n    return (False, 0)\n"),
    Strategy("accept_all", "accept-all", "def check(trajectory):\n    return True\n"),
    Strategy("answer_checker", "checks answers perfectly", answer_checker("69")),
    Strategy("tamper_detector", "detects tampering (tool-trajectory form)", TAMPER_DETECTOR),
    Strategy("near_copy", "near-copy of the companion",
             "def check(traj):\n    printed = [step.result for step in traj.steps if step.type == 'output']\n"
             "    if len(printed) == 0 or str(printed[-1]).strip() != str(traj.final_answer).strip():\n"
             "        return False, 'the last output is not the final answer'\n    return True, 'ok'\n"),
)
HONEST = (("answer checker", None), ("tamper detector", TAMPER_DETECTOR), ("companion", COMPANION))


def fenced(source: str) -> str:
    """An Evaluation-player output: a sentence, then the verifier in a python fence."""
    return f"Here is my verifier.\n\n```python\n{source.strip()}\n```\n"


def honest_pool(answer: str) -> list[str]:
    """The M = 3 honest verifiers of a task with answer ``answer`` (Execution and Planning are priced with them)."""
    return [fenced(answer_checker(answer) if src is None else src) for _, src in HONEST]


# Building and pricing


def sandbox_config() -> Any:
    """The project's sandbox defaults with a 0.5 s CPU limit per call, so that the sleeping check is killed soon."""
    from unifiedplayers.sandbox import SandboxConfig

    return SandboxConfig(timeout_s=SANDBOX_TIMEOUT_S, memory_mb=512)


def compose_config(reward: str = "default") -> Any:
    """The project config with ``reward=<reward>`` and ``perturbation=all``."""
    from unifiedplayers.config import compose

    return compose([f"reward={reward}", "perturbation=all"])


def _trajectories(question: str, samples: Sequence[Sample], sandbox: Any, max_chars: int) -> list[Any]:
    """The parsed transcripts of ``samples``, each code part followed by the sandbox's output as the tool loop
    writes it."""
    from unifiedplayers.feedback.observation import observation_body
    from unifiedplayers.feedback.trajectory import parse_transcript

    codes = [c for s in samples for kind, c in s.parts if kind == "code"]
    outputs: Iterator[str] = iter([observation_body(r, max_chars) for r in sandbox.run_many(codes)] if codes else [])
    return [parse_transcript(question, "\n\n".join(
        f"```python\n{body}\n```\n\n```output\n{next(outputs)}\n```" if kind == "code" else body
        for kind, body in s.parts)) for s in samples]


def _task(question: str, trajectories: Sequence[Any], sources: Sequence[str], answer: Optional[str]) -> Any:
    """One played task as :func:`unifiedplayers.feedback.pipeline.phase_feedback` reads it."""
    return SimpleNamespace(question=question, trajectories=list(trajectories), verifier_sources=list(sources),
                           expected_answer=answer, answer_check=None,
                           tool_calls=[sum(s.type == "code" for s in t.steps) for t in trajectories])


def _evaluation_row(fb: Any, strategy: Strategy) -> dict[str, Any]:
    """The terms of Eq. 5 of the strategy (verifier 0 of its pool), its kind and V(q) of the pool."""
    from unifiedplayers.feedback.kinds import task_kinds

    vm, t = fb.verdicts, fb.terms
    answered = [a is not None for a in fb.answers]
    kind = task_kinds(vm.num_generated, vm.valid, vm.z_orig, vm.z_adv, vm.adv_mask, vm.error_orig, answered)[0]
    own = [c for c in vm.errors if c.verifier == 0]  # its checks that errored: on originals, on variants
    errors = (sum(c.variant is None for c in own), sum(c.variant is not None for c in own))
    row = {"label": strategy.label, "kind": kind, "valid": 0 in vm.valid, "errors": errors,
           "gold": None, "adv": None, "red": None, "reward": float(t.evaluation[0]), "writability": t.writability}
    if 0 in vm.valid:
        r = vm.valid.index(0)
        row.update(gold=float(t.gold[r]), adv=float(t.adv[r]), red=float(t.red[r]))
    return row


def _planning_row(label: str, text: str, fb: Any, reward_cfg: Any, limits: tuple[int, int, int]) -> dict[str, Any]:
    """Eq. 2 of one Planning output: the malformed reward when ``parse_task`` refuses it (``limits``: the player's
    task_min_chars, task_max_chars, answer_max_chars), else U, V, R and r_T of its feedback ``fb``."""
    from unifiedplayers.players.planning import parse_task

    parsed = parse_task(text, *limits)
    if not parsed.valid:
        return {"label": label, "parsed": parsed.reason, "U": None, "V": None, "R": None,
                "reward": float(reward_cfg.malformed_task_reward)}
    t = fb.terms
    return {"label": label, "parsed": "valid", "U": t.uncertainty, "V": t.writability, "R": t.repetition,
            "reward": float(t.planning)}


def strategy_table(sandbox: Any = None, reward_cfg: Any = None,
                   evaluation: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Every player's reward for each degenerate strategy under ``reward_cfg`` (default: ``conf/reward/default.yaml``);
    ``evaluation`` restricts the Evaluation strategies to those keys. Returns ``{"reward", "K", "variants",
    "evaluation": {"A": {key: row}, "B": {key: row}}, "execution": {key: row}, "planning": {key: row}}``."""
    from unifiedplayers.feedback.perturbation import PerturbationEngine
    from unifiedplayers.feedback.pipeline import FeedbackContext, phase_feedback
    from unifiedplayers.players.planning import parse_task
    from unifiedplayers.sandbox import Sandbox

    if sandbox is None:
        with Sandbox(sandbox_config()) as sb:
            return strategy_table(sb, reward_cfg, evaluation)
    cfg = compose_config()
    reward_cfg = cfg.reward if reward_cfg is None else reward_cfg
    max_chars = int(cfg.player.observation_max_chars)
    engine = PerturbationEngine.from_config(cfg.perturbation, seed=SEED, sandbox=sandbox,
                                            observation_max_chars=max_chars)
    strategies = [s for s in EVALUATION_STRATEGIES if evaluation is None or s.key in evaluation]
    unknown = set(evaluation or ()) - {s.key for s in EVALUATION_STRATEGIES}
    if unknown or not strategies:
        raise ValueError(f"unknown Evaluation strategies {sorted(unknown)}" if unknown else "no Evaluation strategy")

    limits = (int(cfg.player.task_min_chars), int(cfg.player.task_max_chars), int(cfg.player.answer_max_chars))
    task_a, task_all, task_none = (parse_task(t, *limits) for t in (PLANNING_A, PLANNING_ALL, PLANNING_NONE))
    traj_a = _trajectories(task_a.question, SAMPLES_A, sandbox, max_chars)
    traj_b = _trajectories(task_a.question, SAMPLES_B, sandbox, max_chars)
    traj_all = _trajectories(task_all.question, SAMPLES_ALL, sandbox, max_chars)
    traj_none = _trajectories(task_none.question, SAMPLES_NONE, sandbox, max_chars)

    tasks = [_task(task_a.question, traj, [fenced(s.source), fenced(COMPANION)], task_a.expected_answer)
             for traj in (traj_a, traj_b) for s in strategies]
    honest_a = _task(task_a.question, traj_a, honest_pool(task_a.expected_answer), task_a.expected_answer)
    tasks += [honest_a] + [_task(t.question, traj, honest_pool(t.expected_answer), t.expected_answer)
                           for t, traj in ((task_all, traj_all), (task_none, traj_none))]
    fbs = phase_feedback(tasks, FeedbackContext(engine, sandbox, reward_cfg, list(HISTORY)))
    # the repeat: task A played again once its question is in R(q)'s history
    (repeat,) = phase_feedback([honest_a], FeedbackContext(engine, sandbox, reward_cfg,
                                                           list(HISTORY) + [task_a.question]))
    n = len(strategies)
    fb_a, fb_all, fb_none = fbs[2 * n:]

    execution = {}
    for j, s in enumerate(SAMPLES_A):
        t = traj_a[j]
        execution[s.key] = {"label": s.label, "answer": t.final_answer,
                            "tool_calls": sum(st.type == "code" for st in t.steps),
                            "accepted": [int(z) for z in fb_a.verdicts.z_orig[:, j]],
                            "reward": float(fb_a.terms.execution[j])}
    planning = {key: _planning_row(label, text, fb, reward_cfg, limits) for key, label, text, fb in (
        ("honest", "task A (two of five right)", PLANNING_A, fb_a),
        ("malformed", "malformed (question under 20 characters)", PLANNING_SHORT, None),
        ("no_boxed", "no boxed answer", PLANNING_NO_BOX, None),
        ("all_solve", "a task every trajectory solves", PLANNING_ALL, fb_all),
        ("none_solve", "a task none solves (no answer)", PLANNING_NONE, fb_none),
        ("repeat", "task A again, its question in the history", PLANNING_A, repeat))}
    return {
        "reward": {k: getattr(reward_cfg, k) for k in ("name", "alpha", "beta", "gamma", "w_unc", "w_ver", "w_rep",
                                                       "variant_error_credit", "invalid_verifier_reward",
                                                       "malformed_task_reward")},
        "K": {"A": len(traj_a), "B": len(traj_b), "all_solve": len(traj_all), "none_solve": len(traj_none)},
        "variants": {"A": int(fb_a.verdicts.adv_mask.sum()), "B": int(fbs[n].verdicts.adv_mask.sum()),
                     "P": engine.num_rules},
        "evaluation": {"A": {s.key: _evaluation_row(fbs[i], s) for i, s in enumerate(strategies)},
                       "B": {s.key: _evaluation_row(fbs[n + i], s) for i, s in enumerate(strategies)}},
        "execution": execution,
        "planning": planning,
    }


# Markdown


def _f(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.3f}"


def _evaluation_markdown(rows: dict[str, dict[str, Any]]) -> list[str]:
    from unifiedplayers.feedback.kinds import LABELS

    lines = ["| strategy | kind | check errors (orig + var) | ρ_gold | ρ_adv | ρ_red | r_C | V(q) of the pool |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows.values():
        lines.append(f"| {r['label']} | {LABELS[r['kind']]} | {r['errors'][0]} + {r['errors'][1]} | {_f(r['gold'])} "
                     f"| {_f(r['adv'])} | {_f(r['red'])} | {_f(r['reward'])} | {_f(r['writability'])} |")
    return lines


def to_markdown(table: dict[str, Any]) -> str:
    w, k, v = table["reward"], table["K"], table["variants"]
    lines = [f"Reward preset `{w['name']}`: (α, β, γ) = ({w['alpha']:g}, {w['beta']:g}, {w['gamma']:g}), "
             f"(w_unc, w_ver, w_rep) = ({w['w_unc']:g}, {w['w_ver']:g}, {w['w_rep']:g}), "
             f"variant_error_credit = {str(bool(w['variant_error_credit'])).lower()}, invalid verifier "
             f"{w['invalid_verifier_reward']:g}, malformed task {w['malformed_task_reward']:g}. "
             f"P = {v['P']} rules, seed {SEED}.", ""]
    for task, what in (("A", f"K = {k['A']}: correct and wrong with a tool, boxed without a tool, question copied, "
                             f"empty; {v['A']} of {k['A'] * v['P']} variants apply"),
                       ("B", f"no right original, K = {k['B']}: wrong 99 and 84 with a tool, question copied, "
                             f"empty; {v['B']} of {k['B'] * v['P']} variants apply")):
        lines += [f"**Evaluation, task {task}** ({what}); pool: the strategy and the honest companion, M = 2", ""]
        lines += _evaluation_markdown(table["evaluation"][task]) + [""]
    lines += ["**Execution, task A** (r_S over the M = 3 honest verifiers: answer checker, tamper detector, "
              "companion)", "",
              "| trajectory | final answer | tool calls | accepted by (answer, tamper, companion) | r_S |",
              "|---|---|---|---|---|"]
    for r in table["execution"].values():
        answer = "–" if r["answer"] is None else r["answer"]
        lines.append(f"| {r['label']} | {answer} | {r['tool_calls']} | {', '.join(map(str, r['accepted']))} "
                     f"| {_f(r['reward'])} |")
    lines += ["", f"**Planning** (r_T = w_unc U + w_ver V − w_rep R, the honest verifiers; K = {k['A']}, "
              f"{k['all_solve']}, {k['none_solve']} for task A, all-solve, none-solve; R against "
              f"{len(HISTORY)} earlier questions)", "",
              "| strategy | parse_task | U | V | R | r_T |", "|---|---|---|---|---|---|"]
    for r in table["planning"].values():
        lines.append(f"| {r['label']} | {r['parsed']} | {_f(r['U'])} | {_f(r['V'])} "
                     f"| {_f(r['R'])} | {_f(r['reward'])} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m eval.analysis.strategies",
                                 description="Degenerate strategies, priced through the real feedback")
    ap.add_argument("--reward", default="default", help="a conf/reward/ preset (default: default)")
    args = ap.parse_args(argv)
    text = to_markdown(strategy_table(reward_cfg=compose_config(args.reward).reward))
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
