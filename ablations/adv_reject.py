"""Table 15's "Adv. Reject", measured on one fixed held-out set whatever rules the run trained with.

Training's ``evaluation/rho_adv`` (Eq. 11) is measured on the variants of the run's own rules (0 by construction
with ``perturbation=none``), so Table 15's four rule subsets are measured here on one set instead:
``ablations/data/table15_heldout.jsonl``, correct tool-use trajectories for the held-out word problems of
:data:`TASKS`, each with its five variants (Appendix F.1), made once by ``build`` with the real engine and sandbox
and versioned. The run's final Evaluation player writes M verifiers per task (its own ``player`` config), each
valid one is checked on the original and its variants (``verdict_matrix``, the training path), and ρ_adv_i is
averaged as training does (:func:`summarise`), into ``<run>/eval/adv_reject.json``.

    python -m ablations.adv_reject build                 # (re)make the held-out file
    python -m ablations.adv_reject measure RUN_DIR       # measure one finished run
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from eval.run import resolve_checkpoint  # noqa: E402
from unifiedplayers.feedback.observation import observation_body  # noqa: E402
from unifiedplayers.feedback.perturbation import ALL_RULES, PerturbationEngine  # noqa: E402
from unifiedplayers.feedback.rewards import adversarial_rejection_rate, gold_pass_rate  # noqa: E402
from unifiedplayers.feedback.trajectory import Trajectory, parse_transcript  # noqa: E402
from unifiedplayers.feedback.verdict import verdict_matrix  # noqa: E402
from unifiedplayers.models import load_model  # noqa: E402
from unifiedplayers.players.evaluation import write_verifiers  # noqa: E402
from unifiedplayers.rollout import build_rollout  # noqa: E402
from unifiedplayers.sandbox import Sandbox  # noqa: E402
from unifiedplayers import rundir  # noqa: E402

HELDOUT = Path(__file__).resolve().parent / "data" / "table15_heldout.jsonl"
RESULT_FILE = "adv_reject.json"  # under <run>/eval/
HELDOUT_SEED = 15  # the perturbation engine's seed for the held-out variants
OBSERVATION_MAX_CHARS = 1024  # conf/player/default.yaml's observation_max_chars

# (question, reasoning before the code, code, answer). Answers worked out by hand; `build` checks that the
# code prints them. Not in any prompt, few-shot or bank of conf/player.
TASKS: list[tuple[str, str, str, str]] = [
    ("A baker makes 14 trays of 18 rolls and sells 200 rolls. How many rolls are left?",
     "The baker makes 14 * 18 rolls, then 200 are sold.", "made = 14 * 18\nprint(made - 200)", "52"),
    ("A cyclist rides at 16 km per hour for 2.5 hours, then at 12 km per hour for 1.5 hours. How many km does "
     "she ride in total?", "Distance is speed times time for each leg; add the legs.",
     "first = 16 * 2.5\nsecond = 12 * 1.5\nprint(int(first + second))", "58"),
    ("A tank holds 360 liters and is 25% full. How many liters must be added to fill it?",
     "The tank holds 25% of 360 liters now; the rest must be added.", "now = 360 * 25 // 100\nprint(360 - now)", "270"),
    ("The sum of three consecutive integers is 123. What is the largest of them?",
     "With n the smallest, n + (n + 1) + (n + 2) = 123.", "n = (123 - 3) // 3\nprint(n + 2)", "42"),
    ("A class has 28 students and 3/7 of them walk to school. How many students do not walk?",
     "3/7 of 28 walk; the others do not.", "walk = 28 * 3 // 7\nprint(28 - walk)", "16"),
    ("A phone costs 450 dollars after a 10% discount. What was the original price in dollars?",
     "The sale price is 90% of the original price.", "print(450 * 100 // 90)", "500"),
    ("How many multiples of 7 are there from 1 to 200 inclusive?",
     "Count the numbers in the range that 7 divides.", "print(sum(1 for k in range(1, 201) if k % 7 == 0))", "28"),
    ("A garden is 12 m by 9 m with a path 1 m wide all around the outside. What is the area of the path in "
     "square meters?", "The outer rectangle is 14 m by 11 m; subtract the garden.",
     "outer = (12 + 2) * (9 + 2)\nprint(outer - 12 * 9)", "46"),
    ("Lena saves 35 dollars a week. After how many whole weeks will she first have more than 500 dollars?",
     "Add 35 a week until the total passes 500.",
     "weeks, total = 0, 0\nwhile total <= 500:\n    weeks += 1\n    total += 35\nprint(weeks)", "15"),
    ("The mean of 6 numbers is 14. The number 24 is removed. What is the mean of the remaining numbers?",
     "The six numbers sum to 6 * 14; remove 24 and divide by 5.", "print((6 * 14 - 24) // 5)", "12"),
    ("A recipe needs 3 eggs for every 4 cups of flour. How many eggs are needed for 20 cups of flour?",
     "Scale the ratio 3 : 4 up to 20 cups.", "print(20 // 4 * 3)", "15"),
    ("What is the remainder when 2 to the power 10 is divided by 7?",
     "Compute 2**10 and reduce it modulo 7.", "print(2 ** 10 % 7)", "2"),
]


@dataclass
class HeldOutTask:
    id: str
    question: str
    answer: str
    original: Trajectory
    variants: list[Optional[Trajectory]]  # one per rule of ALL_RULES, None where the rule cannot apply


def transcript(reasoning: str, code: str, observation: str, answer: str) -> str:
    """A tool-loop transcript (the format ``unifiedplayers.players.tool_loop`` writes)."""
    return (f"{reasoning}\n```python\n{code}\n```\n```output\n{observation}\n```\n"
            f"So the answer is \\boxed{{{answer}}}.")


def build(sandbox: Any, path: Path = HELDOUT) -> list[HeldOutTask]:
    """Write the held-out file: each task's trajectory (code run in ``sandbox``) and its five variants."""
    results = sandbox.run_many([code for _, _, code, _ in TASKS])
    originals = []
    for (question, reasoning, code, answer), r in zip(TASKS, results):
        body = observation_body(r, OBSERVATION_MAX_CHARS)
        if body.strip() != answer:  # the hand-worked answer and the program must agree
            raise ValueError(f"held-out task {question!r}: the code prints {body!r}, the answer is {answer!r}")
        originals.append(parse_transcript(question, transcript(reasoning, code, body, answer)))
    engine = PerturbationEngine(list(ALL_RULES), seed=HELDOUT_SEED, sandbox=sandbox,
                                observation_max_chars=OBSERVATION_MAX_CHARS)
    variants = engine.perturb_many(originals)
    tasks = [HeldOutTask(f"t{i:02d}", q, a, o, v)
             for i, ((q, _, _, a), o, v) in enumerate(zip(TASKS, originals, variants))]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps({"id": t.id, "question": t.question, "answer": t.answer,
                                "original": t.original.to_dict(),
                                "variants": {r: (v.to_dict() if v is not None else None)
                                             for r, v in zip(ALL_RULES, t.variants)}}) + "\n")
    return tasks


def load(path: Path = HELDOUT) -> list[HeldOutTask]:
    """The held-out tasks; an error names the file when it is missing or was made for other rules."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m ablations.adv_reject build`")
    tasks = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if sorted(d["variants"]) != sorted(ALL_RULES):
            raise ValueError(f"{path}:{n}: variants for {sorted(d['variants'])}, not the five rules {list(ALL_RULES)}")
        tasks.append(HeldOutTask(d["id"], d["question"], d["answer"], Trajectory.from_dict(d["original"]),
                                 [Trajectory.from_dict(d["variants"][r]) if d["variants"][r] else None
                                  for r in ALL_RULES]))
    return tasks


def file_digest(path: Path = HELDOUT) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def summarise(matrices: Sequence[Any], generated: int) -> dict[str, Any]:
    """From one ``VerdictMatrix`` per held-out task: ``adv_reject``, the mean over every valid verifier of every task
    of ρ_adv_i (Eq. 11 over the variants that exist, errors without credit, as training's ``evaluation/rho_adv``);
    ``per_rule``, the share of (valid verifier, variant of that rule) checks that rejected; ``valid_rate``, valid
    verifiers / ``generated``; ``gold_pass``, mean ρ_gold_i. None where there is nothing to average."""
    rho, gold = [], []
    per_rule = {r: [0, 0] for r in ALL_RULES}  # rule -> [rejections, checks]
    for vm in matrices:
        m_q = vm.z_orig.shape[0]
        if m_q == 0:
            continue
        rho.extend(adversarial_rejection_rate(vm.z_adv, vm.adv_mask, vm.error_adv).tolist())
        gold.extend(gold_pass_rate(vm.z_orig).tolist())
        rejected = (vm.z_adv == 0) & ~vm.error_adv & vm.adv_mask  # (M_q, K, P), False where a variant is missing
        for j, rule in enumerate(ALL_RULES):
            per_rule[rule][0] += int(rejected[:, :, j].sum())
            per_rule[rule][1] += m_q * int(vm.adv_mask[:, j].sum())
    valid = sum(vm.z_orig.shape[0] for vm in matrices)
    return {
        "adv_reject": float(np.mean(rho)) if rho else None,
        "gold_pass": float(np.mean(gold)) if gold else None,
        "valid_rate": valid / generated if generated else None,
        "valid_verifiers": valid,
        "generated_verifiers": generated,
        "per_rule": {r: (c[0] / c[1] if c[1] else None) for r, c in per_rule.items()},
        "tasks": len(matrices),
        "variants": int(sum(int(vm.adv_mask.sum()) for vm in matrices)),
        "rules": list(ALL_RULES),
    }


def measure(engine: Any, player_cfg: Any, sandbox: Any, tasks: Sequence[HeldOutTask], m: Optional[int] = None,
            seed: int = 0) -> dict[str, Any]:
    """The Evaluation player behind ``engine`` writes ``m`` (default ``player_cfg.num_verifiers``) verifiers per
    held-out task; each is checked on the original and all five variants (``summarise``)."""
    m = int(m or player_cfg.num_verifiers)
    written = write_verifiers(engine, engine.tokenizer, player_cfg, [t.question for t in tasks], m, seed=seed)
    matrices = [verdict_matrix([v.source for v in row], [t.original], [t.variants], sandbox)
                for t, row in zip(tasks, written)]
    out = summarise(matrices, generated=m * len(tasks))
    out["m"] = m
    return out


def measure_run(run_dir: Path, sandbox_cfg: Any = None, log=print) -> dict[str, Any]:
    """Measure a finished run with its latest Evaluation checkpoint (the backbone if it has none, e.g. a run
    whose Evaluation player was frozen) and write ``<run>/eval/adv_reject.json``."""
    run_cfg = OmegaConf.load(run_dir / rundir.CONFIG)
    tasks = load()
    model, tokenizer = load_model(run_cfg.model)
    source = "backbone (no Evaluation checkpoint)"
    try:
        kind, target = resolve_checkpoint(str(run_dir), player="evaluation")
    except SystemExit:
        kind, target = None, None
    if kind == "state_dict":
        model.load_state_dict(torch.load(target, map_location=next(model.parameters()).device, weights_only=True))
        source = str(target)
    engine = build_rollout(run_cfg.rollout, model, tokenizer)
    with Sandbox(sandbox_cfg if sandbox_cfg is not None else run_cfg.sandbox) as sb:
        out = measure(engine, run_cfg.player, sb, tasks, seed=int(run_cfg.get("seed", 0)))
    out.update(heldout=HELDOUT.name, heldout_sha256=file_digest(), checkpoint=source,
               trained_rules=list(OmegaConf.select(run_cfg, "perturbation.rules") or []))
    (run_dir / rundir.EVAL).mkdir(parents=True, exist_ok=True)
    (run_dir / rundir.EVAL / RESULT_FILE).write_text(json.dumps(out, indent=2))
    log(f"[adv_reject] {run_dir}: Adv. Reject {out['adv_reject']} over {out['valid_verifiers']} valid verifiers "
        f"({source})")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="(re)make the held-out file with the real engine and sandbox")
    mp = sub.add_parser("measure", help="measure one finished run directory")
    mp.add_argument("run_dir")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        with Sandbox() as sb:
            tasks = build(sb)
        n = sum(v is not None for t in tasks for v in t.variants)
        print(f"[adv_reject] wrote {HELDOUT}: {len(tasks)} tasks, {n} variants")
        return 0
    measure_run(Path(args.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
