"""Generation and grading of one benchmark in one mode (``vanilla`` or ``tool``: the Execution player's tool loop),
under the one protocol of §4.1 and Appendix G: :func:`evaluate_benchmark`.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from unifiedplayers.data.benchmarks import REGISTRY, Benchmark, Problem, load_benchmark
from eval.extract import humaneval_program
from unifiedplayers.feedback.answers import extract_answer as grading_extract_answer
from eval.humaneval import run_unit_tests
from eval.metrics import score
from eval.prompts import build_prompt
from unifiedplayers.rollout.types import Completion

MODES = ("vanilla", "tool")


@dataclass
class Generation:
    """One completion of one problem: the text to grade and, in tool mode, how the loop ended."""

    text: str
    status: Optional[str] = None
    num_tool_calls: int = 0
    finish_reason: Optional[str] = None
    detail: str = ""
    generated_tokens: Optional[int] = None  # tokens the model generated for it (all turns)


@dataclass
class BenchmarkResult:
    name: str
    mode: str
    metric: str
    score: float  # points
    num_problems: int
    samples: int
    seconds: float
    answered_share: float  # share of completions with an extractable answer
    tool_calls_mean: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    token_budget: int = 0  # generated tokens allowed per completion, all turns together (both modes)
    generated_tokens_mean: float = 0.0


def extract_answer(bench: Benchmark, problem: Problem, text: str, mode: str = "vanilla") -> Optional[str]:
    """The answer of a completion in ``mode``: the program for HumanEval, else
    :func:`unifiedplayers.feedback.answers.extract_answer`."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if bench.answer_type == "program":
        return humaneval_program(problem.meta["prompt"], text, problem.meta["entry_point"])
    if bench.answer_type in ("math", "option", "string"):
        return grading_extract_answer(bench.answer_type, text, len(problem.options or []), tool=mode == "tool")
    raise ValueError(f"unknown answer type {bench.answer_type!r}")


def samples_for(bench: Benchmark, entry: Any, eval_cfg: Any) -> int:
    if bench.metric != "mean@k":
        return 1
    if eval_cfg.samples_override:
        return int(eval_cfg.samples_override)
    return int(entry.samples or bench.default_samples)


def generate_vanilla(engine: Any, prompts: list[str], k: int, max_new_tokens: int, eval_cfg: Any) -> list[list[Generation]]:
    """k completions per prompt: greedy when k == 1, sampled otherwise; in batches of ``batch_size``."""
    per_call, greedy = max(1, eval_cfg.batch_size // k), k == 1
    out: list[list[Generation]] = []
    for start in range(0, len(prompts), per_call):
        completions = engine.generate(
            prompts[start:start + per_call], n=k, max_new_tokens=max_new_tokens,
            temperature=None if greedy else eval_cfg.sample_temperature,
            top_p=None if greedy else eval_cfg.sample_top_p,
            greedy=greedy, seed=eval_cfg.seed + start,
        )
        out.extend([[Generation(c.text, finish_reason=c.finish_reason, generated_tokens=len(c.token_ids))
                     for c in row] for row in completions])
    return out


class TotalTokenBudget:
    """An engine view that caps the tokens *generated* for each context over all its turns (observations are
    inserted, not generated, and do not count), so a tool-mode sample gets the budget of one vanilla completion.

    A call asks the engine for at most the largest budget left among its contexts and cuts each completion to its
    own context's remainder (finish_reason ``length``); a spent context gets an empty ``length`` completion, so the
    loop ends it. Contexts are identified by object (the tool loop passes each sample's own segment list on every
    turn): use one view per ``run_tool_loop`` call.
    """

    def __init__(self, engine: Any, budget: int) -> None:
        if budget < 1:
            raise ValueError(f"token budget {budget}: need at least one token per problem")
        self.engine, self.budget = engine, int(budget)
        self.spent: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:  # tokenizer, model, generate, ...
        return getattr(self.engine, name)

    def left(self, context: Any) -> int:
        return self.budget - self.spent.get(id(context), 0)

    def continue_segments(self, contexts: Sequence[Any], n: int = 1, max_new_tokens: Optional[int] = None,
                          **kwargs: Any) -> list[list[Completion]]:
        if n != 1:
            raise ValueError(f"TotalTokenBudget: n={n}; the tool loop continues each sample with n=1")
        lefts = [self.left(c) for c in contexts]
        live = [i for i, left in enumerate(lefts) if left > 0]
        out: list[Optional[list[Completion]]] = [None] * len(contexts)
        if live:
            cap = max(lefts[i] for i in live)
            cap = min(cap, max_new_tokens) if max_new_tokens is not None else cap
            got = self.engine.continue_segments([contexts[i] for i in live], n=1, max_new_tokens=cap, **kwargs)
            for i, row in zip(live, got):
                c = self._cut(row[0], lefts[i])
                self.spent[id(contexts[i])] = self.spent.get(id(contexts[i]), 0) + len(c.token_ids)
                out[i] = [c]
        for i, left in enumerate(lefts):
            if left <= 0:
                prompt = [t for seg in contexts[i] for t in seg.token_ids]
                out[i] = [Completion(prompt_ids=prompt, token_ids=[], text="", logprobs=[], finish_reason="length")]
        return out  # type: ignore[return-value]

    def _cut(self, c: Completion, left: int) -> Completion:
        if len(c.token_ids) <= left:
            return c
        ids = list(c.token_ids[:left])
        text = self.engine.tokenizer.decode(ids, skip_special_tokens=True)
        if len(text) > len(c.text):  # cannot happen for a true prefix; keep what the engine said
            text = c.text
        return Completion(prompt_ids=c.prompt_ids, token_ids=ids, text=text, logprobs=list(c.logprobs[:left]),
                          finish_reason="length", stop_str=None)


def generate_tool(engine: Any, sandbox: Any, prompts: list[str], questions: list[str], k: int,
                  max_new_tokens: int, eval_cfg: Any) -> list[list[Generation]]:
    """k tool-loop samples per prompt (``unifiedplayers.players.tool_loop``), batched like vanilla;
    ``max_new_tokens`` is each sample's total over all its turns (:class:`TotalTokenBudget`)."""
    from unifiedplayers.players.tool_loop import ToolLoopConfig, run_tool_loop

    greedy = k == 1
    cfg = ToolLoopConfig(
        max_turns=eval_cfg.tool.max_turns, max_new_tokens=max_new_tokens,
        observation_max_chars=eval_cfg.tool.observation_max_chars, timeout_s=eval_cfg.tool.timeout_s,
        greedy=greedy, temperature=1.0 if greedy else eval_cfg.sample_temperature,
        top_p=1.0 if greedy else eval_cfg.sample_top_p,
    )
    per_call = max(1, eval_cfg.batch_size // k)
    out: list[list[Generation]] = []
    for start in range(0, len(prompts), per_call):
        budgeted = TotalTokenBudget(engine, max_new_tokens)
        rollouts = run_tool_loop(budgeted, sandbox, prompts[start:start + per_call], questions[start:start + per_call],
                                 cfg, n=k, seed=eval_cfg.seed + start)
        out.extend([[Generation(r.text, status=r.status, num_tool_calls=r.num_tool_calls, detail=r.detail,
                                generated_tokens=budgeted.spent.get(id(r.segments), 0)) for r in row]
                    for row in rollouts])
    return out


def grade_generations(bench: Benchmark, problems: list[Problem], gens: list[list[Generation]], sandbox: Any,
                      unit_test_timeout_s: float, *, mode: str
                      ) -> tuple[list[list[Optional[str]]], list[list[bool]], list[list[str]]]:
    """Extracted answers (per ``mode``: :func:`extract_answer`), verdicts and (HumanEval) test details,
    aligned to ``gens``."""
    extracted = [[extract_answer(bench, p, g.text, mode) for g in row] for p, row in zip(problems, gens)]
    details = [["" for _ in row] for row in gens]
    if bench.answer_type == "program":
        flat = [(i, j) for i, row in enumerate(gens) for j in range(len(row))]
        outcomes = run_unit_tests(sandbox, [problems[i] for i, _ in flat], [extracted[i][j] for i, j in flat],
                                  timeout_s=unit_test_timeout_s)
        verdicts = [[False] * len(row) for row in gens]
        for (i, j), o in zip(flat, outcomes):
            verdicts[i][j] = o.passed
            details[i][j] = o.detail
        return extracted, verdicts, details
    verdicts = [[bench.grade(a, p.reference) for a in row] for p, row in zip(problems, extracted)]
    return extracted, verdicts, details


def evaluate_benchmark(name: str, entry: Any, mode: str, engine: Any, sandbox: Any, eval_cfg: Any,
                       out_dir: Path, log=print, execution_prompts: Optional[Any] = None) -> BenchmarkResult:
    """Evaluate benchmark ``name`` in ``mode``; write ``out_dir/<name>.<mode>.jsonl``. Raises ``MissingDataset``
    when its file is absent."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    bench = REGISTRY[name]
    limit = eval_cfg.limit if eval_cfg.limit is not None else entry.limit
    problems = load_benchmark(name, entry.path, dict(entry.fields), limit=limit, split=entry.split)
    k = samples_for(bench, entry, eval_cfg)
    max_new = int(entry.max_new_tokens or eval_cfg.max_new_tokens)
    t0 = time.time()
    if eval_cfg.tool_prompt not in ("player", "eval"):
        raise ValueError(f"eval.tool_prompt={eval_cfg.tool_prompt!r}: use player or eval")
    exec_prompts = execution_prompts if eval_cfg.tool_prompt == "player" else None
    prompts = [build_prompt(bench, p, mode, eval_cfg.prompts, engine.tokenizer, eval_cfg.chat_template, exec_prompts)
               for p in problems]
    log(f"[eval] {name} ({mode}): {len(problems)} problems x {k} sample(s), max_new_tokens={max_new}")
    if mode == "vanilla":
        gens = generate_vanilla(engine, prompts, k, max_new, eval_cfg)
    else:
        gens = generate_tool(engine, sandbox, prompts, [p.question for p in problems], k, max_new, eval_cfg)
    extracted, verdicts, details = grade_generations(bench, problems, gens, sandbox, eval_cfg.unit_test_timeout_s,
                                                     mode=mode)
    seconds = time.time() - t0

    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{name}.{mode}.jsonl", "w", encoding="utf-8") as f:
        for p, prompt, row_g, row_a, row_v, row_d in zip(problems, prompts, gens, extracted, verdicts, details):
            for j, (g, a, v, d) in enumerate(zip(row_g, row_a, row_v, row_d)):
                line = {"benchmark": name, "mode": mode, "id": p.id, "sample": j, "prompt": prompt,
                        "completion": g.text, "extracted": a, "reference": p.reference, "verdict": bool(v)}
                if p.options:
                    line["options"] = p.options
                if g.status is not None:
                    line["status"], line["num_tool_calls"] = g.status, g.num_tool_calls
                    if g.detail:
                        line["status_detail"] = g.detail
                if g.finish_reason is not None:
                    line["finish_reason"] = g.finish_reason
                if g.generated_tokens is not None:
                    line["generated_tokens"] = g.generated_tokens
                if d:
                    line["test_detail"] = d
                f.write(json.dumps(line, ensure_ascii=False) + "\n")

    flat_gens = [g for row in gens for g in row]
    statuses = dict(Counter(g.status for g in flat_gens if g.status is not None))
    answered = sum(a is not None for row in extracted for a in row) / max(1, len(flat_gens))
    result = BenchmarkResult(
        name=name, mode=mode, metric=bench.metric, score=score(bench.metric, verdicts) if problems else float("nan"),
        num_problems=len(problems), samples=k, seconds=seconds, answered_share=answered,
        tool_calls_mean=sum(g.num_tool_calls for g in flat_gens) / max(1, len(flat_gens)), statuses=statuses,
        token_budget=max_new,
        generated_tokens_mean=sum(g.generated_tokens or 0 for g in flat_gens) / max(1, len(flat_gens)),
    )
    log(f"[eval] {name} ({mode}): {bench.metric} = {result.score:.1f} over {len(problems)} problems "
        f"in {seconds:.0f}s (answer extracted in {100 * answered:.0f}%)")
    return result
