"""One sampling phase of a block (§3.3, Appendix B.3; SPEC §6): fixed records, several optimizer steps.

A block of ``<role>_updates`` optimizer steps is cut into phases of S × μ steps (S =
``schedule.steps_per_generation``, μ = ``trainer.num_iterations``). A phase samples the data of S steps at
once with the policies as they stand at its start, builds the perturbations, verdict matrices and rewards
once, and splits the active player's GRPO groups into S disjoint *units* (mini-batches). The trainer then
takes μ passes over the S units, one optimizer step per unit, always against the behaviour log-probs
recorded at sampling (sg[D_p^(b)]): π_θ moves away from π_old inside the phase, so the ratio of Eq. 18
moves off 1 and the clip of Eq. 19 can bind.

This module holds the pure parts of a phase: how steps map to units, how tasks are split into units,
the active player's groups and advantages (Eq. 17), the interaction records and the metrics of a unit.
The outer loop (:mod:`unifiedplayers.schedule`) does the sampling, which needs the models and the sandbox.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from unifiedplayers import grpo
from unifiedplayers.methods import GroupShape, shape_advantages
from unifiedplayers.records import InteractionRecord
from unifiedplayers.trainer import sample_from_completion, sample_from_segments

PHASE_FILE = "phase.pt"

# Trainer metrics logged per update, under the active role (``<role>/<name>``).
TRAINER_METRICS = {
    "actor/grad_norm": "grad_norm", "actor/kl": "kl", "actor/ratio_outside_clip_frac": "clip_frac",
    "actor/pg_clipfrac": "pg_clip_frac", "actor/ratio_mean": "ratio_mean", "actor/ratio_min": "ratio_min",
    "actor/ratio_max": "ratio_max", "entropy_bank/retention": "entropy_ratio", "actor/entropy": "entropy",
    "actor/loss": "loss", "actor/lr": "lr", "actor/num_tokens": "num_tokens", "perf/update_tflop": "update_tflop",
    # the preference and imitation losses (Socratic-Zero's Solver and Generator)
    "actor/dpo_margin": "dpo_margin", "actor/dpo_accuracy": "dpo_accuracy", "actor/nll": "nll",
}


def unit_of_step(step_in_phase: int, steps_per_generation: int) -> tuple[int, int]:
    """(pass, unit) of the ``step_in_phase``-th optimizer step of a phase: passes over the S units in order."""
    return step_in_phase // steps_per_generation, step_in_phase % steps_per_generation


def split_units(n: int, units: int) -> list[list[int]]:
    """``n`` items (tasks or questioner prompts) into ``units`` contiguous, disjoint chunks of near-equal size.

    With ``units`` × per-update items sampled every chunk holds exactly the per-update number; a shortfall
    (too few well-formed tasks) is spread so that no unit is left much smaller than another.
    """
    return [list(map(int, c)) for c in np.array_split(np.arange(n), units)]


@dataclass
class Unit:
    """One mini-batch of a phase: what its optimizer steps train on, and what its metrics line reports."""

    batch: list[Any]  # TrainSample (empty: the step is skipped)
    metrics: dict[str, Any]  # sampling and feedback metrics of its tasks (no trainer metrics)


@dataclass
class Phase:
    """A sampled phase: its first update and its units (empty on ranks other than 0, which receive each
    step's batch by broadcast)."""

    first: int
    units: list[Unit]
    timing: dict[str, float] = field(default_factory=dict)  # generation_s, sandbox_s, feedback_s of the phase

    def to_state(self) -> dict[str, Any]:
        return {"first": self.first, "timing": dict(self.timing),
                "units": [{"batch": u.batch, "metrics": u.metrics} for u in self.units]}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "Phase":
        return cls(d["first"], [Unit(u["batch"], u["metrics"]) for u in d["units"]], dict(d["timing"]))


def group_samples(role: str, groups: Sequence[Sequence[Any]], tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]],
                  verifiers: Sequence[Sequence[Any]], role_rewards: dict[str, list[Any]],
                  malformed_reward: float) -> tuple[list[Callable[[float], Any]], list[float], list[int]]:
    """(sample makers, rewards, group ids) of the active player, one maker per candidate.

    Groups (SPEC §1): Planning, the G_T tasks of one questioner prompt (a malformed task gets
    ``malformed_reward``); Execution, the K trajectories of a task; Evaluation, the M verifiers of a task.
    ``tasks``, ``rollouts``, ``verifiers`` and ``role_rewards`` are aligned (index i is task i).
    """
    makers: list[Callable[[float], Any]] = []
    rewards: list[float] = []
    gids: list[int] = []
    if role == "planning":
        reward_of = {id(task): r for task, r in zip(tasks, role_rewards["planning"])}
        for g, group in enumerate(groups):
            for task in group:
                r = reward_of[id(task)] if task.valid else malformed_reward
                makers.append(lambda a, c=task.completion, g=g: sample_from_completion(c, a, g))
                rewards.append(float(r))
                gids.append(g)
    elif role == "execution":
        for i, task_rollouts in enumerate(rollouts):
            for r, rew in zip(task_rollouts, role_rewards["execution"][i]):
                makers.append(lambda a, s=r.segments, g=i: sample_from_segments(s, a, g))
                rewards.append(float(rew))
                gids.append(i)
    else:
        for i, task_verifiers in enumerate(verifiers):
            for v, rew in zip(task_verifiers, role_rewards["evaluation"][i]):
                makers.append(lambda a, c=v.completion, g=i: sample_from_completion(c, a, g))
                rewards.append(float(rew))
                gids.append(i)
    return makers, rewards, gids


def training_batch(makers: Sequence[Callable[[float], Any]], rewards: Sequence[float], group_ids: Sequence[int],
                   trainer_cfg: Any, drop_zero_advantage_groups: bool,
                   shapes: Optional[dict[int, GroupShape]] = None) -> list[Any]:
    """The unit's samples with their group-relative advantages (Eq. 17); zero-advantage groups dropped when asked.

    ``shapes``: a baseline's shape of each group (:func:`unifiedplayers.methods.group_shape`: groups left
    out, advantages scaled, a per-sample upper clip; Agent0's ADPO, R-Zero's band). Plain GRPO without.
    """
    if not makers:
        return []
    adv = grpo.get_adv_estimator(trainer_cfg.adv_estimator)(
        torch.tensor(list(rewards), dtype=torch.float64), torch.tensor(list(group_ids)), eps=trainer_cfg.adv_eps
    ).tolist()
    batch = []
    for n, a, clip_high in shape_advantages(shapes or {}, group_ids, adv):
        sample = makers[n](a)
        if clip_high is not None:
            sample = dataclasses.replace(sample, clip_high=float(clip_high))
        batch.append(sample)
    if drop_zero_advantage_groups:
        live = {g for g, a in zip(group_ids, adv) if a != 0.0}
        batch = [s for s in batch if s.group in live]
    return batch


def _mean(xs: Sequence[float]) -> Optional[float]:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def unit_metrics(groups: Sequence[Sequence[Any]], tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]],
                 verdicts: Sequence[Any], feedback: Sequence[Any], role_rewards: dict[str, list[Any]],
                 role: str, malformed_reward: float) -> dict[str, Any]:
    """The sampling and feedback metrics of one unit's tasks (rewards, formats, verdict statistics)."""
    m: dict[str, Any] = {}
    all_tasks = [t for g in groups for t in g]
    plan_r = list(role_rewards["planning"])
    if role == "planning":
        plan_r = plan_r + [malformed_reward] * sum(1 for t in all_tasks if not t.valid)
    m["planning/reward_mean"] = _mean(plan_r)
    m["planning/valid_rate"] = sum(t.valid for t in all_tasks) / max(len(all_tasks), 1)
    m["planning/num_tasks"] = len(tasks)
    m["planning/U"] = _mean([f.rewards.uncertainty for f in feedback])
    m["planning/V"] = _mean([f.rewards.writability for f in feedback])
    m["planning/R"] = _mean([f.rewards.repetition for f in feedback])
    m["execution/reward_mean"] = _mean([x for arr in role_rewards["execution"] for x in arr])
    statuses = [r.status for tr in rollouts for r in tr]
    for s in ("answered", "turn_limit", "no_answer", "error"):
        m[f"execution/{s}_rate"] = statuses.count(s) / len(statuses) if statuses else None
    m["execution/tool_calls_mean"] = _mean([r.num_tool_calls for tr in rollouts for r in tr])
    # Accuracy against the verifier pool: share of trajectories accepted by a strict majority of the
    # valid verifiers of their task (tasks with at least one valid verifier).
    acc = [float(col > vm.z_orig.shape[0] / 2) for vm in verdicts if vm.z_orig.shape[0]
           for col in vm.z_orig.sum(axis=0)]
    m["execution/accuracy_vs_pool"] = _mean(acc)
    m["evaluation/reward_mean"] = _mean([x for arr in role_rewards["evaluation"] for x in arr])
    generated = sum(vm.num_generated for vm in verdicts)
    m["evaluation/valid_rate"] = sum(len(vm.valid) for vm in verdicts) / generated if generated else None
    m["evaluation/rho_gold"] = _mean([x for f in feedback for x in f.rewards.gold])
    m["evaluation/rho_adv"] = _mean([x for f in feedback for x in f.rewards.adv])
    m["evaluation/rho_red"] = _mean([x for f in feedback for x in f.rewards.red])
    # Check errors (raises, timeouts, no verdict), kept apart from rejections: their share of the checks
    # behind Z, and the share of verifiers made invalid by erroring on every original trajectory.
    errors = [vm.error_summary() for vm in verdicts]
    checks = sum(e["checks"] for e in errors)
    m["evaluation/check_error_rate"] = (sum(e["errors_orig"] + e["errors_adv"] for e in errors) / checks
                                        if checks else None)
    m["evaluation/runtime_invalid_rate"] = (sum(e["runtime_invalid"] for e in errors) / generated
                                            if generated else None)
    for kind in ("raised", "timeout", "bad_return"):
        m[f"evaluation/errors_{kind}"] = sum(e[f"errors/{kind}"] for e in errors)
    return m


def trainer_metrics_line(role: str, trainer_metrics: dict[str, float], global_step: int) -> dict[str, Any]:
    """The trainer's metrics of one optimizer step under ``<role>/...`` (ratio, clip fraction, KL, grad-norm)."""
    m = {f"{role}/{dst}": trainer_metrics[src] for src, dst in TRAINER_METRICS.items() if src in trainer_metrics}
    if "perf/update_tflop_per_s" in trainer_metrics:  # a rate: varies between runs, so with the timings
        m["timing/update_tflop_per_s"] = trainer_metrics["perf/update_tflop_per_s"]
    m[f"{role}/step"] = global_step
    return m


def phase_records(groups: Sequence[Sequence[Any]], tasks: Sequence[Any], unused: Sequence[Any],
                  rollouts: Sequence[Sequence[Any]], verifiers: Sequence[Sequence[Any]], verdicts: Sequence[Any],
                  variants_flat: Sequence[Any], feedback: Sequence[Any], role_rewards: dict[str, list[Any]],
                  rules: Sequence[str], meta_of_task: Callable[[Optional[int], int], dict[str, Any]],
                  malformed_reward: float) -> list[InteractionRecord]:
    """One interaction record ξ(q) per Planning output of the phase, malformed and unused ones included.

    ``meta_of_task(i, g)`` gives the metadata of the output of group (questioner prompt) ``g`` that is
    played task ``i``, or not played when ``i`` is None: its phase, the update that trains on it, the
    checkpoints that produced it.
    """
    out: list[InteractionRecord] = []
    played = {id(t): i for i, t in enumerate(tasks)}
    unused_ids = {id(t) for t in unused}
    for g, group in enumerate(groups):
        for task in group:
            i = played.get(id(task))
            meta = dict(meta_of_task(i, g), topic=task.topic, prompt_index=task.prompt_index,
                        planning_output=task.text)
            task_id = f"u{meta['global_update']:06d}-t{len(out):03d}"
            if i is not None:
                vm, fb = verdicts[i], feedback[i]
                tr = fb.rewards
                meta.update(
                    status="played",
                    trajectory_status=[r.status for r in rollouts[i]],
                    trajectory_detail=[r.detail for r in rollouts[i]],
                    tool_calls=[r.num_tool_calls for r in rollouts[i]],
                    verifier_outputs=[v.source for v in verifiers[i]],
                    verifier_validity=vm.validity,
                    # every check that raised, timed out or gave no verdict (invalid verifiers' included), as
                    # unifiedplayers.feedback records them; the counts behind Z are record.error_summary()
                    check_errors=[{"verifier": c.verifier, "trajectory": c.trajectory, "variant": c.variant,
                                   "kind": c.outcome.kind, "reason": c.outcome.reason} for c in vm.errors],
                )
                rewards = {
                    "execution": role_rewards["execution"][i], "evaluation": role_rewards["evaluation"][i],
                    "planning": role_rewards["planning"][i], "U": tr.uncertainty, "V": tr.writability,
                    "R": tr.repetition, "rho_gold": tr.gold, "rho_adv": tr.adv, "rho_red": tr.red,
                }
                k = len(rollouts[i])
                out.append(InteractionRecord.from_verdict(
                    task.question, [r.trajectory for r in rollouts[i]], variants_flat[i * k:(i + 1) * k], vm, tr.red,
                    list(rules), task_id=task_id, iteration=meta["outer_iteration"],
                    expected_answer=task.expected_answer, rewards=rewards, meta=meta,
                ))
            else:
                status = "unused" if id(task) in unused_ids else "malformed_task"
                meta.update(status=status, reason=task.reason or "well-formed; beyond tasks_per_update")
                rewards = {"planning": float(malformed_reward)} if status == "malformed_task" else {}
                out.append(InteractionRecord(
                    question=task.question or "", trajectories=[], verifiers=[], variants=[], z_orig=[],
                    z_adv=[], adv_mask=[], redundancy=[], rules=list(rules), valid=[], num_generated=0,
                    task_id=task_id, iteration=meta["outer_iteration"], expected_answer=task.expected_answer,
                    rewards=rewards, meta=meta,
                ))
    return out
