"""Held-out probes of each player: is a checkpoint better at its role than the backbone?

Each probe runs a player on a fixed set of ``eval/probes/data/`` with fixed seeds and returns rates with their
standard errors (eval/README.md): Execution (:func:`probe_execution`, and the tool probe
:func:`probe_execution_tool`), Evaluation (:func:`probe_evaluation`) and Planning (:func:`probe_planning`).
"""
from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from unifiedplayers import lora, rundir
from unifiedplayers.data.benchmarks import Problem
from unifiedplayers.diagnostics.execution_pool import PoolQuestion
from unifiedplayers.roles import ROLES

DATA_DIR = Path(__file__).resolve().parent / "data"
PROBE_SEED = 0  # the sampling seed of every probe (not the training seed)


# Statistics (pure)


def binomial_se(p: Optional[float], n: int) -> Optional[float]:
    """Standard error of a rate p measured on n independent items: sqrt(p (1 − p) / n)."""
    if p is None or n <= 0:
        return None
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def mean_se(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    """(mean, standard error of the mean = sample SD / sqrt(n)); SE is None below two values."""
    if not values:
        return None, None
    x = np.asarray(values, dtype=float)
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None)


def _rate(k: float, n: int) -> Optional[float]:
    return float(k) / n if n else None


@dataclass
class ProbeSizes:
    """How much of each probe set to use (None: all of it) and the draws per item."""

    execution: Optional[int] = None  # problems (the set holds 100)
    evaluation: Optional[int] = None  # questions (the set holds 50)
    evaluation_verifiers: int = 2  # M per question
    planning_topics: Optional[int] = None  # topic prompts (the set holds 25)
    planning_tasks_per_topic: Optional[int] = None  # None: the set's (4)
    planning_u_tasks: int = 16  # well-formed tasks whose U(q) is measured
    planning_u_samples: int = 4  # K trajectories per such task
    execution_tool: Optional[int] = None  # tool-probe problems (the set holds 50), run with the Execution probe


# The probe sets


def load_execution_set(path: Path = DATA_DIR / "execution.jsonl", limit: Optional[int] = None) -> list[Any]:
    """The Execution probe's problems as the diagnostic pool's ``PoolQuestion``; ``limit`` keeps the first
    ``limit // 2`` of each domain (math first), so a short probe stays balanced."""
    rows = rundir.read_jsonl(path)
    questions = [PoolQuestion(r["domain"], r["benchmark"], Problem(r["id"], r["question"], r["reference"], r.get("options")))
                 for r in rows]
    if limit is not None and limit < len(questions):
        by_domain = {d: [q for q in questions if q.domain == d] for d in ("math", "general")}
        half = limit // 2
        questions = by_domain["math"][:limit - half] + by_domain["general"][:half]
    return questions


TOOL_BENCHMARK = "execution_tool"  # the tool probe's name in its items (not a benchmark of the harness)


class ToolProbeQuestion(PoolQuestion):
    """A tool-probe problem: graded as math (an exact integer) by the pool's own grading."""

    @property
    def answer_type(self) -> str:
        return "math"


def load_execution_tool_set(path: Path = DATA_DIR / "execution_tool.jsonl", limit: Optional[int] = None) -> list[Any]:
    """The tool probe's problems (the first ``limit``) as the diagnostic pool's questions (domain math)."""
    rows = rundir.read_jsonl(path)[:limit]
    return [ToolProbeQuestion("math", TOOL_BENCHMARK, Problem(r["id"], r["question"], r["answer"], None)) for r in rows]


@dataclass
class EvaluationItem:
    """One Evaluation probe question: its correct trajectory and the engine's variants (None: rule n/a)."""

    id: str
    question: str
    answer: str
    original: Any  # Trajectory
    rules: list[str]
    variants: list[Any]  # Trajectory or None, one per rule


def load_evaluation_set(path: Path = DATA_DIR / "evaluation.jsonl", limit: Optional[int] = None) -> list[EvaluationItem]:
    from unifiedplayers.feedback.trajectory import Trajectory

    return [EvaluationItem(r["id"], r["question"], r["answer"], Trajectory.from_dict(r["original"]), list(r["rules"]),
                           [None if v is None else Trajectory.from_dict(v) for v in r["variants"]])
            for r in rundir.read_jsonl(path)[:limit]]


def load_planning_set(path: Path = DATA_DIR / "planning.json", topics: Optional[int] = None,
                      tasks_per_topic: Optional[int] = None) -> tuple[list[str], int]:
    data = json.loads(Path(path).read_text())
    return list(data["topics"])[:topics], int(tasks_per_topic or data["tasks_per_topic"])


# Execution


def execution_metrics(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy and answered rate (with SEs) of graded tool-loop answers (``evaluate_pool``'s items)."""
    n = len(items)
    acc = _rate(sum(bool(i["correct"]) for i in items), n)
    answered = _rate(sum(i["status"] == "answered" for i in items), n)
    out: dict[str, Any] = {"n": n, "accuracy": acc, "accuracy_se": binomial_se(acc, n),
                           "answered": answered, "answered_se": binomial_se(answered, n)}
    for d in ("math", "general"):
        rows = [i for i in items if i["domain"] == d]
        out[f"accuracy_{d}"] = _rate(sum(bool(i["correct"]) for i in rows), len(rows))
        out[f"n_{d}"] = len(rows)
    out["statuses"] = dict(Counter(i["status"] for i in items))
    return out


def probe_execution(engine: Any, sandbox: Any, tokenizer: Any, cfg: Any, questions: Sequence[Any]) -> dict[str, Any]:
    """Greedy tool-loop answers of the Execution player (its prompt, turns and token budget) to ``questions``."""
    from unifiedplayers.config import resolve_player_config
    from unifiedplayers.diagnostics.execution_pool import evaluate_pool

    result = evaluate_pool(engine, sandbox, tokenizer, resolve_player_config(cfg), cfg.schedule.execution_pool, questions)
    out = execution_metrics(result["items"])
    out["items"] = [{k: i[k] for k in ("id", "domain", "extracted", "reference", "correct", "status", "tool_calls")}
                    for i in result["items"]]
    return out


def probe_execution_tool(engine: Any, sandbox: Any, tokenizer: Any, cfg: Any, questions: Sequence[Any]) -> dict[str, Any]:
    """The tool probe: :func:`probe_execution` on the arithmetic problems (its accuracy is ``accuracy_tool``)."""
    if not questions:
        return {"n": 0, "accuracy": None, "accuracy_se": None, "answered": None, "answered_se": None, "items": []}
    return probe_execution(engine, sandbox, tokenizer, cfg, questions)


# Evaluation


def evaluation_metrics(verdicts: Sequence[Any], rules: Sequence[str]) -> dict[str, Any]:
    """The Evaluation probe's rates from one verdict matrix per question (one original trajectory each):

    - valid = Σ M_q / Σ M (compilation and run-time validity, :mod:`unifiedplayers.feedback.verdict`);
    - original_acceptance = mean of Z_orig over the valid verifiers;
    - adv_rejection = share of the valid verifiers' checks of applied variants that rejected (an error is none);
    - writability = mean over questions of Eq. 12's V(q);
    - check_errors = share of the valid verifiers' checks that raised, timed out or returned a non-verdict;
    - original_errors, original_rejections = the shares of the generated verifiers' checks of the originals that
      errored and that rejected with a verdict (a verifier that errors on a question's one original is invalid);
    - discrimination = §4.5's verifier-level balanced accuracy (original_acceptance + adv_rejection) / 2
      (:func:`eval.analysis.discrimination.discrimination`).
    """
    from eval.analysis.discrimination import discrimination
    from unifiedplayers.feedback.rewards import adversarial_rejection_rate, verifier_writability

    generated = sum(v.num_generated for v in verdicts)
    valid = sum(len(v.valid) for v in verdicts)
    orig_n = sum(int(np.asarray(v.z_orig).size) for v in verdicts)
    orig_acc = sum(float(np.asarray(v.z_orig).sum()) for v in verdicts)
    adv_n, adv_rej, records = 0, 0.0, []
    for v in verdicts:
        z_adv = np.asarray(v.z_adv, dtype=bool)
        errors = np.asarray(v.error_adv, dtype=bool)
        mask = np.broadcast_to(np.asarray(v.adv_mask, dtype=bool), z_adv.shape)
        rejected = ~z_adv & ~errors & mask
        adv_n += int(mask.sum())
        adv_rej += float(rejected.sum())
        records.append(SimpleNamespace(z_orig=v.z_orig, z_adv=v.z_adv, adv_mask=v.adv_mask, rules=list(rules),
                                       error_orig=v.error_orig, error_adv=v.error_adv))
    # Every generated verifier's checks of the originals, its run-time-invalid ones too: accepted, rejected with a
    # verdict, or errored (no verdict); a verifier that does not compile runs none.
    on_orig = [c.outcome for v in verdicts for c in v.checks if c.variant is None]
    orig_slots = sum(v.num_generated * int(np.asarray(v.z_orig).shape[1]) for v in verdicts)
    orig_errors = sum(o.is_error for o in on_orig)
    orig_rejections = sum(o.kind == "rejected" for o in on_orig)
    errors_summary = [v.error_summary() for v in verdicts]
    checks = sum(e["checks"] for e in errors_summary)
    errored = sum(e["errors_orig"] + e["errors_adv"] for e in errors_summary)
    disc = discrimination(records)
    level = disc["levels"]["verifier"]
    p_valid, p_acc, p_rej = _rate(valid, generated), _rate(orig_acc, orig_n), _rate(adv_rej, adv_n)
    se_acc, se_rej = binomial_se(p_acc, orig_n), binomial_se(p_rej, adv_n)
    writability, writability_se = mean_se([verifier_writability(adversarial_rejection_rate(
        v.z_adv, v.adv_mask, v.error_adv), v.num_generated) for v in verdicts])
    return {
        "questions": len(verdicts), "verifiers": generated, "valid_verifiers": valid,
        "valid": p_valid, "valid_se": binomial_se(p_valid, generated),
        "original_acceptance": p_acc, "original_acceptance_se": se_acc, "n_original_checks": orig_n,
        "adv_rejection": p_rej, "adv_rejection_se": se_rej, "n_variant_checks": adv_n,
        "discrimination": disc["headline"],
        # SE of a mean of two independent rates: (1/2) sqrt(SE_a² + SE_b²)
        "discrimination_se": None if se_acc is None or se_rej is None else 0.5 * math.sqrt(se_acc ** 2 + se_rej ** 2),
        "discrimination_pool_level": disc["levels"]["pool"]["balanced_accuracy"],
        "per_rule_rejection": {r: v["rejection"] for r, v in level["per_rule"].items()},
        "writability": writability, "writability_se": writability_se,
        "check_errors": _rate(errored, checks), "n_checks": checks,
        "runtime_invalid": sum(e["runtime_invalid"] for e in errors_summary),
        "original_errors": _rate(orig_errors, orig_slots), "original_errors_n": orig_errors,
        "original_rejections": _rate(orig_rejections, orig_slots), "n_original_slots": orig_slots,
    }


def probe_evaluation(engine: Any, sandbox: Any, tokenizer: Any, cfg: Any, items: Sequence[EvaluationItem],
                     m: int = 2, seed: int = PROBE_SEED) -> dict[str, Any]:
    """M verifiers per probe question from the Evaluation player, run on the original and its variants."""
    from unifiedplayers.config import resolve_player_config
    from unifiedplayers.players.evaluation import write_verifiers
    from unifiedplayers.feedback.verdict import verdict_matrix

    if not items:
        raise ValueError("the Evaluation probe needs at least one question")
    outs = write_verifiers(engine, tokenizer, resolve_player_config(cfg), [it.question for it in items], m, seed=seed)
    verdicts = [verdict_matrix([s.source for s in row], [it.original], [it.variants], sandbox)
                for it, row in zip(items, outs)]
    out = evaluation_metrics(verdicts, items[0].rules)
    out["invalid_reasons"] = dict(Counter(why.split(":")[0].split(" (")[0] for v in verdicts for why in v.validity
                                          if why != "valid"))
    out["sample_verifier"] = next((v.compiled[v.valid[0]].source for v in verdicts if v.valid), None)
    return out


# Planning


class _WithTopics:
    """A player config whose ``topics`` are the probe's (everything else is the run's own)."""

    def __init__(self, player_cfg: Any, topics: Sequence[str]) -> None:
        self._cfg = player_cfg
        self.topics = list(topics)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


def planning_metrics(tasks: Sequence[Any], uncertainties: Sequence[float]) -> dict[str, Any]:
    """Well-formed rate over all Planning outputs (binomial SE) and mean U(q) over the measured tasks (SE of the mean)."""
    n = len(tasks)
    wf = _rate(sum(bool(t.valid) for t in tasks), n)
    u, u_se = mean_se(list(uncertainties))
    return {"n": n, "well_formed": wf, "well_formed_se": binomial_se(wf, n),
            "U": u, "U_se": u_se, "n_U": len(uncertainties),
            "malformed_reasons": dict(Counter(t.reason for t in tasks if not t.valid))}


def planning_tasks(engine: Any, tokenizer: Any, cfg: Any, topics: Sequence[str], tasks_per_topic: int,
                   seed: int = PROBE_SEED) -> list[Any]:
    """The Planning player's outputs for the fixed topic prompts (``tasks_per_topic`` each, fixed seed), parsed."""
    from unifiedplayers.config import resolve_player_config
    from unifiedplayers.players import generate_tasks

    player = _WithTopics(resolve_player_config(cfg), topics)
    return [t for g in generate_tasks(engine, tokenizer, player, 0, len(topics), tasks_per_topic, seed=seed) for t in g]


def probe_planning(tasks: Sequence[Any], exec_engine: Any, sandbox: Any, tokenizer: Any, cfg: Any,
                   u_tasks: int = 16, u_samples: int = 4, seed: int = PROBE_SEED) -> dict[str, Any]:
    """Rates of the Planning outputs ``tasks``; U(q) of the first ``u_tasks`` well-formed ones from ``u_samples``
    trajectories of ``exec_engine`` (the fixed Execution policy) at the Execution player's temperature."""
    from unifiedplayers.config import resolve_player_config, role_temperature
    from unifiedplayers.players import solve
    from unifiedplayers.feedback.rewards import uncertainty

    measured = [t for t in tasks if t.valid][:u_tasks]
    rollouts = solve(exec_engine, sandbox, tokenizer, resolve_player_config(cfg), [t.question for t in measured],
                     u_samples, seed=seed + 1, temperature=role_temperature(cfg, "execution"), top_p=cfg.rollout.top_p)
    u = [uncertainty([r.final_answer for r in row], cfg.reward.missing_answer_in_majority, cfg.reward.answer_match_timeout_s)
         for row in rollouts]
    out = planning_metrics(tasks, u)
    out["u_trajectories_answered"] = _rate(sum(r.status == "answered" for row in rollouts for r in row),
                                           sum(len(row) for row in rollouts))
    out["sample_tasks"] = [t.question for t in measured[:3]]
    return out


# Checkpoints and the whole probe


@dataclass
class Checkpoint:
    """What to probe: per role, a ``model.pt`` or None (the backbone)."""

    label: str
    weights: dict[str, Optional[Path]] = field(default_factory=dict)


def resolve_checkpoint(target: str, roles: Sequence[str] = ROLES) -> Checkpoint:
    """``backbone``; a role directory (``.../iter2/execution``, holding ``model.pt``); an iteration directory
    (``.../checkpoints/iter2``, holding ``<role>/model.pt``); or a run directory (its latest iteration).
    A role without a checkpoint there (an untrained player) is probed with the backbone."""
    if target == "backbone":
        return Checkpoint("backbone", {r: None for r in roles})
    path = Path(target).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"probe target {target!r}: not 'backbone' and not a directory")
    if (path / rundir.MODEL_WEIGHTS).is_file():
        if path.name not in ROLES:
            raise ValueError(f"{path} holds a model.pt but is not named after a role {ROLES}")
        return Checkpoint(str(path), {r: (path / rundir.MODEL_WEIGHTS if r == path.name else None) for r in roles})
    if (path / rundir.CHECKPOINTS).is_dir():
        iters = sorted((p for p in (path / rundir.CHECKPOINTS).glob("iter*") if p.name[4:].isdigit()), key=lambda p: int(p.name[4:]))
        if not iters:
            raise FileNotFoundError(f"{path}/checkpoints holds no iter<N> directory")
        path = iters[-1]
    found = {r: (path / r / rundir.MODEL_WEIGHTS if (path / r / rundir.MODEL_WEIGHTS).is_file() else None) for r in roles}
    if not any(found.values()):
        raise FileNotFoundError(f"{path}: no <role>/model.pt for any of {list(roles)}")
    return Checkpoint(str(path), found)


def find_run_config(target: str) -> Optional[Path]:
    """The ``config.yaml`` of the run a checkpoint path lies in (searched upwards), if any."""
    if target == "backbone":
        return None
    for p in [Path(target).resolve(), *Path(target).resolve().parents]:
        if (p / rundir.CONFIG).is_file() and (p / rundir.CHECKPOINTS).is_dir():
            return p / rundir.CONFIG
    return None


def run_probes(cfg: Any, ckpt: Checkpoint, roles: Sequence[str] = ROLES, sizes: Optional[ProbeSizes] = None,
               data_dir: Path = DATA_DIR, backbone: Optional[tuple[Any, Any]] = None, log: Any = print) -> dict[str, Any]:
    """Probe ``roles`` of ``ckpt`` under the run config ``cfg``. Returns ``{"checkpoint", "sources", "metrics" (flat
    keys as figure1.json's series, with ``_se``), <role>: full result, "seconds", "probe_set"}``. ``backbone``: an
    already loaded (model, tokenizer)."""
    import copy

    import torch

    from unifiedplayers.config import role_temperature
    from unifiedplayers.models import load_model
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.rollout.prefix_cache import for_evaluation
    from unifiedplayers.sandbox import Sandbox
    from unifiedplayers.loop.engines import SamplingTemperature

    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown roles {unknown}; known: {list(ROLES)}")
    sizes = sizes or ProbeSizes()
    t0, c0 = time.perf_counter(), time.process_time()
    model, tokenizer = backbone if backbone is not None else load_model(cfg.model)
    model.eval()
    seconds: dict[str, float] = {"load": time.perf_counter() - t0}
    engine = build_rollout(for_evaluation(cfg.rollout), model, tokenizer)  # prefix cache on unless set
    work: dict[str, Any] = {"model": None}

    def policy(role: str, backbone: bool = False) -> Any:
        """The engine with ``role``'s weights swapped in (the backbone's when it has no checkpoint, or ``backbone``),
        at ``role``'s temperature."""
        path = None if backbone else ckpt.weights.get(role)
        if path is None:
            engine.update_weights(model)
        else:
            if work["model"] is None:
                work["model"] = copy.deepcopy(model)
            state = lora.checkpoint_weights(model, path)  # an adapter player's: folded into the backbone
            work["model"].load_state_dict(state)  # strict: another backbone's checkpoint fails here, loudly
            work["model"].eval()
            engine.update_weights(work["model"])
        return SamplingTemperature(engine, role_temperature(cfg, role))

    result: dict[str, Any] = {"checkpoint": ckpt.label,
                              "sources": {r: (str(ckpt.weights.get(r)) if ckpt.weights.get(r) else "backbone") for r in roles},
                              "probe_set": json.loads((Path(data_dir) / "manifest.json").read_text())}
    metrics: dict[str, Any] = {}
    probe = _RoleProbe(cfg, tokenizer, sizes, Path(data_dir), result, metrics, seconds, log)
    with torch.no_grad(), Sandbox(cfg.sandbox) as sandbox:
        if "execution" in roles:
            probe.execution(policy("execution"), sandbox)
        if "evaluation" in roles:
            probe.evaluation(policy("evaluation"), sandbox)
        if "planning" in roles:
            probe.planning(policy("planning"), lambda: policy("execution", backbone=True), sandbox)
    seconds["total"] = time.perf_counter() - t0
    seconds["cpu_total"] = time.process_time() - c0  # this process's CPU time (the sandbox's calls not included)
    result["metrics"] = metrics
    result["seconds"] = seconds
    return result


@dataclass
class _RoleProbe:
    """One checkpoint's probes, role by role: each adds its full result, its flat metrics and its seconds."""

    cfg: Any
    tokenizer: Any
    sizes: ProbeSizes
    data_dir: Path
    result: dict[str, Any]
    metrics: dict[str, Any]
    seconds: dict[str, float]
    log: Any

    def execution(self, policy: Any, sandbox: Any) -> None:
        """The Execution probe, then the tool probe (its metrics always written, None for an empty set: figure1's
        resume reads them)."""
        for name, suffix, load, run, limit in (
                ("execution", "", load_execution_set, probe_execution, self.sizes.execution),
                ("execution_tool", "_tool", load_execution_tool_set, probe_execution_tool, self.sizes.execution_tool)):
            t = time.perf_counter()
            res = run(policy, sandbox, self.tokenizer, self.cfg, load(self.data_dir / f"{name}.jsonl", limit))
            self.seconds[name] = time.perf_counter() - t
            self.result[name] = res
            for k in ("accuracy", "answered"):
                key = f"execution/{k}{suffix}"
                self.metrics[key], self.metrics[f"{key}_se"] = res[k], res[f"{k}_se"]
            self.log(f"[probe] {name.replace('_tool', ' tool probe')}: accuracy {_pct(res['accuracy'], res['accuracy_se'])}, answered "
                     f"{_pct(res['answered'], res['answered_se'])} (n={res['n']}, {self.seconds[name]:.0f} s)")

    def evaluation(self, policy: Any, sandbox: Any) -> None:
        metrics, seconds = self.metrics, self.seconds
        t = time.perf_counter()
        items = load_evaluation_set(self.data_dir / "evaluation.jsonl", self.sizes.evaluation)
        res = probe_evaluation(policy, sandbox, self.tokenizer, self.cfg, items, self.sizes.evaluation_verifiers)
        seconds["evaluation"] = time.perf_counter() - t
        self.result["evaluation"] = res
        for k in ("valid", "adv_rejection", "discrimination", "writability"):
            metrics[f"evaluation/{k}"], metrics[f"evaluation/{k}_se"] = res[k], res[f"{k}_se"]
        metrics["evaluation/originals_accepted"] = res["original_acceptance"]
        metrics["evaluation/originals_accepted_se"] = res["original_acceptance_se"]
        for k in ("original_errors", "original_rejections", "runtime_invalid"):
            metrics[f"evaluation/{k}"] = res[k]
        self.log(f"[probe] evaluation: valid {_pct(res['valid'], res['valid_se'])} (n={res['verifiers']}), originals "
                 f"accepted {_pct(res['original_acceptance'], res['original_acceptance_se'])}, variants rejected "
                 f"{_pct(res['adv_rejection'], res['adv_rejection_se'])}, errors on originals "
                 f"{_pct(res['original_errors'], None)}, discrimination "
                 f"{_pct(res['discrimination'], res['discrimination_se'])} ({seconds['evaluation']:.0f} s)")

    def planning(self, policy: Any, backbone: Callable[[], Any], sandbox: Any) -> None:
        """``backbone()`` swaps the backbone's weights into the engine once the tasks are written: U moves only
        with the Planning player."""
        cfg, sizes, seconds = self.cfg, self.sizes, self.seconds
        t = time.perf_counter()
        topics, per_topic = load_planning_set(self.data_dir / "planning.json", sizes.planning_topics,
                                              sizes.planning_tasks_per_topic)
        tasks = planning_tasks(policy, self.tokenizer, cfg, topics, per_topic)
        res = probe_planning(tasks, backbone(), sandbox, self.tokenizer, cfg, sizes.planning_u_tasks,
                             sizes.planning_u_samples)
        seconds["planning"] = time.perf_counter() - t
        self.result["planning"] = res
        for k in ("U", "well_formed"):
            self.metrics[f"planning/{k}"], self.metrics[f"planning/{k}_se"] = res[k], res[f"{k}_se"]
        u = "-" if res["U"] is None else f"{res['U']:.3f} ± {res['U_se'] or 0:.3f}"
        self.log(f"[probe] planning: well-formed {_pct(res['well_formed'], res['well_formed_se'])} (n={res['n']}), "
                 f"U(q) {u} (n={res['n_U']}, backbone Execution; {seconds['planning']:.0f} s)")


def _pct(p: Optional[float], se: Optional[float]) -> str:
    if p is None:
        return "-"
    return f"{100 * p:.1f}%" + ("" if se is None else f" ± {100 * se:.1f}")
