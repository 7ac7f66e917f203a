"""The Execution player's fixed diagnostic pool (§4.4, Appendix D.2).

Every ``schedule.execution_pool.every`` Execution updates the Execution player answers the first ``math_size`` and
``general_size`` problems of two benchmark files greedily, with its own tool loop and prompt, graded as the
evaluation harness grades (docs/running.md). Each evaluation is logged to ``execution_pool.jsonl``
(:class:`PoolLog`), which a resumed run reuses; a missing dataset file is a warning, never a crash.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from unifiedplayers.data.benchmarks import REGISTRY, load_benchmark
from unifiedplayers.feedback.answers import extract_answer, grade
from unifiedplayers.players.prompts import fill, option_fields, render_prompt
from unifiedplayers.players.tool_loop import ToolLoopConfig, run_tool_loop
from unifiedplayers.rundir import EXECUTION_POOL, iter_jsonl, repair_tail

DOMAINS = ("math", "general")
TEXT_TAIL_CHARS = 1000  # the end of each transcript is kept (the answer is there), not the whole of it


# --------------------------------------------------------------------------------------------------
# The statistics (pure)


def negative_steps(accuracy: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float]]:
    """(negative-step rate, maximum drop) of a sequence of checkpoint accuracies (Appendix D.2):

    negative-step rate = #{i : a_{i+1} < a_i} / (n − 1) over the n checkpoints in order;
    maximum drop = max(0, max_i (a_i − a_{i+1})), in the units of ``accuracy``.
    ``None`` entries (an evaluation that could not run) are left out; fewer than two values give ``(None, None)``.
    """
    acc = [float(a) for a in accuracy if a is not None]
    if len(acc) < 2:
        return None, None
    diffs = [b - a for a, b in zip(acc, acc[1:])]
    return sum(d < 0 for d in diffs) / len(diffs), max(0.0, -min(diffs))


# --------------------------------------------------------------------------------------------------
# The pool


@dataclass
class PoolQuestion:
    """One question of the pool: its domain, its benchmark, and the harness's ``Problem``."""

    domain: str  # math | general
    benchmark: str
    problem: Any  # unifiedplayers.data.benchmarks.Problem

    @property
    def answer_type(self) -> str:
        return REGISTRY[self.benchmark].answer_type


def build_pool(pool_cfg: Any) -> tuple[list[PoolQuestion], list[str]]:
    """(questions, messages): the first ``math_size`` math and ``general_size`` general problems; one
    message per file that is missing or unreadable (that share of the pool is then empty)."""
    questions: list[PoolQuestion] = []
    missing: list[str] = []
    for domain in DOMAINS:
        name, path, size = (getattr(pool_cfg, f"{domain}_{k}") for k in ("benchmark", "path", "size"))
        if size <= 0:
            continue
        if name not in REGISTRY:
            raise ValueError(f"schedule.execution_pool.{domain}_benchmark={name!r}: not one of {sorted(REGISTRY)}")
        if REGISTRY[name].answer_type not in ("math", "option"):
            raise ValueError(f"schedule.execution_pool.{domain}_benchmark={name!r}: the pool takes math or "
                             f"multiple-choice questions, not {REGISTRY[name].answer_type!r}")
        try:
            problems = load_benchmark(name, path, limit=size)
        except Exception as exc:  # FileNotFoundError (MissingDataset), a torn file, a wrong field mapping
            missing.append(f"execution pool: no {domain} questions ({name} at {path}): {type(exc).__name__}: {exc}. "
                           f"Point schedule.execution_pool.{domain}_path at the file, or set "
                           f"schedule.execution_pool.{domain}_size=0.")
            continue
        questions.extend(PoolQuestion(domain, name, p) for p in problems)
    return questions, missing


def user_message(q: PoolQuestion, pool_cfg: Any) -> str:
    """The question as the Execution player sees it (inside its own prompt template)."""
    if q.answer_type == "option":
        return fill(pool_cfg.option_template, question=q.problem.question, **option_fields(q.problem.options or []))
    return fill(pool_cfg.math_template, question=q.problem.question)


def grade_text(q: PoolQuestion, text: str) -> tuple[Optional[str], bool]:
    """(extracted answer, correct) of one tool-loop transcript, graded as the harness grades its tool mode."""
    answer = extract_answer(q.answer_type, text, len(q.problem.options or []), tool=True)
    return answer, bool(grade(q.answer_type, answer, q.problem.reference))


def answer_questions(engine: Any, sandbox: Any, tokenizer: Any, player_cfg: Any, pool_cfg: Any,
                     questions: Sequence[PoolQuestion]) -> list[dict[str, Any]]:
    """One graded item per question, in order: the Execution player's greedy answer, in tool-loop calls of
    ``pool_cfg.batch_size`` questions (greedy: an answer does not depend on the seed nor on its batch-mates)."""
    limits = {"max_turns": pool_cfg.max_turns, "max_new_tokens": pool_cfg.max_new_tokens}
    loop_cfg = ToolLoopConfig.from_player_config(player_cfg, greedy=True, **{k: v for k, v in limits.items() if v})
    prompts = [render_prompt(tokenizer, player_cfg.execution, include_prefix=False, question=user_message(q, pool_cfg))
               for q in questions]
    step = pool_cfg.batch_size if pool_cfg.batch_size > 0 else max(len(prompts), 1)
    rollouts = []
    for start in range(0, len(prompts), step):
        chunk = list(range(start, min(start + step, len(prompts))))
        out = run_tool_loop(engine, sandbox, [prompts[i] for i in chunk],
                            [questions[i].problem.question for i in chunk], loop_cfg, n=1, seed=0)
        rollouts.extend(row[0] for row in out)
    items = []
    for q, r in zip(questions, rollouts):
        answer, correct = grade_text(q, r.text)
        items.append({"domain": q.domain, "benchmark": q.benchmark, "id": q.problem.id, "extracted": answer,
                      "reference": q.problem.reference, "correct": correct, "status": r.status,
                      "tool_calls": r.num_tool_calls, "text_tail": r.text[-TEXT_TAIL_CHARS:]})
    return items


Split = Callable[..., Optional[list[list[Any]]]]  # DistContext.split_prompts: (generate, num_prompts, to_all)


def evaluate_pool(engine: Any, sandbox: Any, tokenizer: Any, player_cfg: Any, pool_cfg: Any,
                  questions: Sequence[PoolQuestion], split: Optional[Split] = None) -> Optional[dict[str, Any]]:
    """Greedy answers of the Execution player to ``questions``, graded (:func:`summarise`). ``split``: over several
    ranks, :meth:`unifiedplayers.distributed.DistContext.split_prompts`, called on every rank: each rank answers its
    block, rank 0 gathers and summarises them (the other ranks get ``None``)."""
    def answer(mine: range) -> list[list[dict[str, Any]]]:
        return [[item] for item in answer_questions(engine, sandbox, tokenizer, player_cfg, pool_cfg,
                                                    [questions[i] for i in mine])]

    rows = answer(range(len(questions))) if split is None else split(answer, len(questions), to_all=False)
    return None if rows is None else summarise([row[0] for row in rows])


def summarise(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracies (overall and per domain, ``None`` for none), counts and statuses of graded items."""
    def acc(rows: list[dict[str, Any]]) -> Optional[float]:
        return sum(bool(r["correct"]) for r in rows) / len(rows) if rows else None

    out: dict[str, Any] = {"accuracy": acc(items), "num_questions": len(items)}
    for d in DOMAINS:
        rows = [r for r in items if r["domain"] == d]
        out[f"accuracy_{d}"] = acc(rows)
        out[f"num_{d}"] = len(rows)
    out["statuses"] = dict(Counter(r["status"] for r in items))
    out["items"] = items
    return out


# --------------------------------------------------------------------------------------------------
# The log in the run directory


class PoolLog:
    """``execution_pool.jsonl``: one line per evaluated checkpoint, keyed by ``execution_step`` (the first stands).
    Append-only and durable (fsync); a torn last line is dropped when the file is opened."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[int, dict[str, Any]] = {}
        if self.path.exists():
            repair_tail(self.path)
            for entry in iter_jsonl(self.path):
                self.entries.setdefault(int(entry["execution_step"]), entry)

    def get(self, execution_step: int) -> Optional[dict[str, Any]]:
        return self.entries.get(int(execution_step))

    def append(self, entry: dict[str, Any]) -> None:
        step = int(entry["execution_step"])
        if step in self.entries:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        self.entries[step] = entry


def metrics_of(entry: dict[str, Any]) -> dict[str, Any]:
    """The metrics-line keys of one evaluation (``execution/pool_*``; ``None`` where it could not run)."""
    return {
        "execution/pool_step": entry["execution_step"],
        "execution/pool_accuracy": entry.get("accuracy"),
        "execution/pool_accuracy_math": entry.get("accuracy_math"),
        "execution/pool_accuracy_general": entry.get("accuracy_general"),
        "execution/pool_size": entry.get("num_questions", 0),
        "timing/pool_s": entry.get("seconds", 0.0),
    }


def pool_summary(metrics: list[dict[str, Any]], run_dir: Path) -> Optional[dict[str, Any]]:
    """The run summary's ``execution_pool`` section: the accuracy per checkpoint (from the metrics lines, so only
    completed updates count), :func:`negative_steps` and the missing-file messages. ``None`` when the pool was off."""
    # The initial checkpoint (update 0, Appendix D.2) is on the first Execution update's line as pool0_*.
    rows = []
    for m in metrics:
        for prefix in ("execution/pool0_", "execution/pool_"):
            if prefix + "step" in m:
                rows.append({k.replace(prefix, "execution/pool_"): v for k, v in m.items() if k.startswith(prefix)})
    log_path = Path(run_dir) / EXECUTION_POOL
    if not rows and not log_path.exists():
        return None
    accuracy = [m.get("execution/pool_accuracy") for m in rows]
    rate, drop = negative_steps(accuracy)
    missing: list[str] = []
    if log_path.exists():
        for entry in PoolLog(log_path).entries.values():
            missing.extend(x for x in entry.get("missing", []) if x not in missing)
    return {
        "steps": [m["execution/pool_step"] for m in rows],
        "accuracy": accuracy,
        "accuracy_math": [m.get("execution/pool_accuracy_math") for m in rows],
        "accuracy_general": [m.get("execution/pool_accuracy_general") for m in rows],
        "negative_step_rate": rate,
        "max_drop": drop,
        "max_drop_points": None if drop is None else 100.0 * drop,
        "missing": missing,
    }


class FixedPool:
    """The pool of one run and its log: ``evaluate(...)`` for a checkpoint, or its logged result."""

    def __init__(self, pool_cfg: Any, run_dir: Path) -> None:
        self.cfg = pool_cfg
        self.questions, self.missing = build_pool(pool_cfg)
        for msg in self.missing:
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            print(f"[warning] {msg}")
        self.log = PoolLog(Path(run_dir) / EXECUTION_POOL)

    def due(self, execution_step: int) -> bool:
        """Whether the checkpoint after ``execution_step`` Execution updates is evaluated."""
        return self.cfg.every > 0 and execution_step >= 0 and execution_step % self.cfg.every == 0

    def decodes(self, execution_step: int) -> bool:
        """Whether :meth:`evaluate` answers the pool for this checkpoint: it has questions and no logged line."""
        return bool(self.questions) and self.log.get(execution_step) is None

    def evaluate(self, execution_step: int, where: dict[str, Any], answer: Callable[[], Any]) -> dict[str, Any]:
        """The logged evaluation of this checkpoint if there is one, else a new one (appended to the log).
        ``answer()``: :func:`evaluate_pool` of the pool's questions, called exactly when :meth:`decodes` is true."""
        entry = self.log.get(execution_step)
        if entry is not None:
            return entry
        t = time.perf_counter()
        if self.decodes(execution_step):
            result = answer()
        else:
            result = summarise([])
            result["skipped"] = "no pool questions (see missing)"
        entry = {"execution_step": int(execution_step), **where, **result, "missing": list(self.missing),
                 "seconds": time.perf_counter() - t}
        self.log.append(entry)
        return entry
