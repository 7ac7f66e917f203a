"""One sampling phase of a block (§3.3, Appendix B.3): fixed records, several optimizer steps.

A block of ``<role>_updates`` optimizer steps is cut into phases of S × μ steps (S =
``schedule.steps_per_generation``, μ = ``trainer.num_iterations``). A phase samples the data of S steps at
once with the policies as they stand at its start, builds the perturbations, verdict matrices and rewards
once, and splits the active player's GRPO groups into S disjoint *units* (mini-batches). The trainer then
takes μ passes over the S units, one optimizer step per unit, always against the behaviour log-probs
recorded at sampling (sg[D_p^(b)]): π_θ moves away from π_old inside the phase, so the ratio of Eq. 18
moves off 1 and the clip of Eq. 19 can bind.

This module holds the pure parts of a phase: how steps map to units, how tasks are split into units,
the active player's groups and advantages (Eq. 17) (:func:`build_units`), the interaction records and the
metrics of a unit. The outer loop (:mod:`unifiedplayers.loop`) runs it after sampling
(:mod:`unifiedplayers.sampling`) and feedback (:mod:`unifiedplayers.feedback`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from unifiedplayers import grpo
from unifiedplayers.config import role_trainer_config
from unifiedplayers.methods import GroupShape, shape_advantages
from unifiedplayers.records import InteractionRecord
from unifiedplayers.trainer import sample_from_completion, sample_from_segments

PHASE_FILE = "phase.pt"

# A trainer metric ``<namespace>/<name>`` is logged as ``<role>/<name>`` (any metric a loss returns reaches
# metrics.jsonl); these keep the names the metrics files have always had, and ``perf/*`` timings go with the
# other timings (``timing/*``).
RENAMED_METRICS = {"actor/ratio_outside_clip_frac": "clip_frac", "actor/pg_clipfrac": "pg_clip_frac",
                   "entropy_bank/retention": "entropy_ratio", "perf/update_tflop": "update_tflop"}


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
                  malformed_reward: Callable[[Any], float]) -> tuple[list[Callable[[float], Any]], list[float], list[int]]:
    """(sample makers, rewards, group ids) of the active player, one maker per candidate.

    Groups (Appendix B.3, Eq. 16): Planning, the G_T tasks of one questioner prompt (a malformed task gets
    ``malformed_reward(task)``: the method's ``malformed_task_reward``); Execution, the K trajectories of a
    task; Evaluation, the M verifiers of a task.
    ``tasks``, ``rollouts``, ``verifiers`` and ``role_rewards`` are aligned (index i is task i).
    """
    makers: list[Callable[[float], Any]] = []
    rewards: list[float] = []
    gids: list[int] = []
    if role == "planning":
        reward_of = {id(task): r for task, r in zip(tasks, role_rewards["planning"])}
        for g, group in enumerate(groups):
            for task in group:
                r = reward_of[id(task)] if task.valid else malformed_reward(task)
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

    ``shapes``: a baseline's shape of each group (:meth:`unifiedplayers.methods.Method.group_shape`: groups left
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
                 role: str, malformed_reward: Callable[[Any], float]) -> dict[str, Any]:
    """The sampling and feedback metrics of one unit's tasks (rewards, formats, verdict statistics)."""
    m: dict[str, Any] = {}
    all_tasks = [t for g in groups for t in g]
    plan_r = list(role_rewards["planning"])
    if role == "planning":
        plan_r = plan_r + [malformed_reward(t) for t in all_tasks if not t.valid]
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
    m: dict[str, Any] = {}
    for key, value in trainer_metrics.items():
        namespace, _, name = key.rpartition("/")
        if key in RENAMED_METRICS:
            m[f"{role}/{RENAMED_METRICS[key]}"] = value
        elif namespace == "perf":  # wall times and rates vary between runs: with the timings
            m[f"timing/{name}" if name == "update_tflop_per_s" else f"timing/{role}_{name}"] = value
        elif namespace == "actor" or not namespace:
            m[f"{role}/{name}"] = value
        else:
            m[f"{role}/{namespace}_{name}"] = value
    m[f"{role}/step"] = global_step
    return m


def build_units(role: str, groups: Sequence[Sequence[Any]], tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]],
                verifiers: Sequence[Sequence[Any]], feedback: Sequence[Any], role_rewards: dict[str, list[Any]],
                units: int, cfg: Any, method: Any, tokenizer: Any, player_cfg: Any
                ) -> tuple[list[Unit], list[list[int]], list[list[int]]]:
    """The phase's S units: disjoint mini-batches of the active player's groups, advantages within each group
    (Eq. 17, shaped by the method). Returns (units, the groups of each unit, the tasks of each unit).

    Planning: a unit is a share of the questioner prompts, with their tasks. Other roles: a share of the tasks
    (the Planning outputs are phase-wide figures).
    """
    malformed = method.malformed_task_reward  # task -> reward of a malformed Planning output
    task_index = {id(t): i for i, t in enumerate(tasks)}
    if role == "planning":
        group_units = split_units(len(groups), units)
        task_units = [[task_index[id(t)] for g in idx for t in groups[g] if id(t) in task_index]
                      for idx in group_units]
    else:
        task_units = split_units(len(tasks), units)
        group_units = [list(range(len(groups)))] * units
    trainer_cfg = role_trainer_config(cfg.trainer, role)
    out: list[Unit] = []
    for g_idx, t_idx in zip(group_units, task_units):
        sub = lambda xs: [xs[i] for i in t_idx]  # noqa: E731
        u_groups = [groups[g] for g in g_idx]
        u_rewards = {r: sub(v) for r, v in role_rewards.items()}
        makers, rewards, gids = group_samples(role, u_groups, sub(tasks), sub(rollouts), sub(verifiers), u_rewards,
                                              malformed)
        shapes = None
        if role != "planning":  # group g of the unit is its task g (a method may shape it)
            shapes = {g: method.group_shape(role, fb, float(trainer_cfg.clip_eps)) for g, fb in enumerate(sub(feedback))}
        # A method's own batch (Socratic-Zero: the Solver's DPO pairs, the Generator's imitation) replaces GRPO's.
        own = method.unit_batch(role, t_idx, tokenizer, player_cfg)
        batch = own if own is not None else training_batch(
            makers, rewards, gids, trainer_cfg, cfg.schedule.drop_zero_advantage_groups, shapes)
        m = unit_metrics(u_groups, sub(tasks), sub(rollouts), [fb.verdicts for fb in sub(feedback)], sub(feedback),
                         u_rewards, role, malformed)
        m.update(method.unit_metrics(role, t_idx))
        if shapes is not None:
            m[f"{role}/kept_groups"] = (sum(sh.keep for sh in shapes.values()) / len(shapes)) if shapes else None
        out.append(Unit(batch, m))
    return out, group_units, task_units


def feedback_record(fb: Any, trajectories: Sequence[Any], verifier_sources: Sequence[str], rules: Sequence[str],
                    player_rewards: dict[str, Any], meta: dict[str, Any], **fields: Any) -> InteractionRecord:
    """The interaction record ξ(q) of one played task from its feedback (:func:`unifiedplayers.feedback.phase_feedback`):
    Z, the variants, the verifiers and their validity, every check error, the players' rewards
    (``player_rewards``: the method's, by role) and the terms of Eq. 2-5. ``fields``: task_id, iteration,
    expected_answer."""
    vm, tr = fb.verdicts, fb.rewards
    meta = dict(meta, verifier_outputs=list(verifier_sources), verifier_validity=vm.validity,
                # every check that raised, timed out or gave no verdict (invalid verifiers' included); the counts
                # behind Z are record.error_summary()
                check_errors=[{"verifier": c.verifier, "trajectory": c.trajectory, "variant": c.variant,
                               "kind": c.outcome.kind, "reason": c.outcome.reason} for c in vm.errors])
    rewards = {**player_rewards, "U": tr.uncertainty, "V": tr.writability, "R": tr.repetition, "rho_gold": tr.gold,
               "rho_adv": tr.adv, "rho_red": tr.red}
    return InteractionRecord.from_verdict(fb.question, list(trajectories), list(fb.variants), vm, tr.red, list(rules),
                                          rewards=rewards, meta=meta, **fields)


def phase_records(groups: Sequence[Sequence[Any]], tasks: Sequence[Any], unused: Sequence[Any],
                  rollouts: Sequence[Sequence[Any]], verifiers: Sequence[Sequence[Any]], feedback: Sequence[Any],
                  role_rewards: dict[str, list[Any]], rules: Sequence[str],
                  meta_of_task: Callable[[Optional[int], int], dict[str, Any]],
                  malformed_reward: Callable[[Any], float]) -> list[InteractionRecord]:
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
                meta.update(status="played", trajectory_status=[r.status for r in rollouts[i]],
                            trajectory_detail=[r.detail for r in rollouts[i]],
                            tool_calls=[r.num_tool_calls for r in rollouts[i]])
                out.append(feedback_record(
                    feedback[i], [r.trajectory for r in rollouts[i]], [v.source for v in verifiers[i]], rules,
                    {role: role_rewards[role][i] for role in ("execution", "evaluation", "planning")}, meta,
                    task_id=task_id, iteration=meta["outer_iteration"], expected_answer=task.expected_answer))
            else:
                status = "unused" if id(task) in unused_ids else "malformed_task"
                meta.update(status=status, reason=task.reason or "well-formed; beyond tasks_per_update")
                rewards = {"planning": float(malformed_reward(task))} if status == "malformed_task" else {}
                out.append(InteractionRecord(
                    question=task.question or "", trajectories=[], verifiers=[], variants=[], z_orig=[],
                    z_adv=[], adv_mask=[], redundancy=[], rules=list(rules), valid=[], num_generated=0,
                    task_id=task_id, iteration=meta["outer_iteration"], expected_answer=task.expected_answer,
                    rewards=rewards, meta=meta,
                ))
    return out


def record_meta_of(slot: Any, versions: dict[str, Any], group_units: Sequence[Sequence[int]],
                   task_units: Sequence[Sequence[int]], method: Any) -> Callable[[Optional[int], int], dict[str, Any]]:
    """``meta_of_task(i, g)`` for :func:`phase_records`: the phase, the update that trains on the output (Planning:
    a prompt's outputs, malformed ones included, train in its unit; else the task's unit; an output not played in
    another block: the phase's first update), the checkpoints that produced it, and the method's own fields."""
    unit_of_group = {g: u for u, idx in enumerate(group_units) for g in idx}
    unit_of_task = {i: u for u, idx in enumerate(task_units) for i in idx}

    def meta_of_task(i: Optional[int], g: int) -> dict[str, Any]:
        u = unit_of_group[g] if slot.role == "planning" else (unit_of_task.get(i, 0) if i is not None else 0)
        meta = {"outer_iteration": slot.iteration, "block": slot.role, "phase": slot.phase,
                "update": slot.update + u, "global_update": slot.phase + u, "checkpoints": versions}
        if i is not None:  # e.g. Socratic-Zero's Teacher grades, the failure
            meta.update(method.record_meta(i))
        return meta

    return meta_of_task


def update_metrics(slot: Any, phase: Phase, unit: Unit, n_pass: int, unit_index: int,
                   trainer_metrics: dict[str, float], global_step: int, update_s: float) -> dict[str, Any]:
    """The metrics line of one update: its unit's sampling and feedback figures (on the unit's first pass only:
    each sample counted once), the trainer's figures, its place in the run, and its timings (the phase's
    sampling and feedback are timed on the phase's first step)."""
    metrics: dict[str, Any] = dict(unit.metrics) if n_pass == 0 else {}
    metrics[f"{slot.role}/skipped"] = float(not trainer_metrics)
    metrics.update(trainer_metrics_line(slot.role, trainer_metrics, global_step))
    sampled_here = slot.first_of_phase
    metrics.update({
        "outer_iteration": slot.iteration, "block": slot.role, "update": slot.update, "global_update": slot.index,
        "phase": slot.phase, "phase_step": slot.step_in_phase, "phase_pass": n_pass, "phase_unit": unit_index,
        "timing/generation_s": phase.timing["generation_s"] if sampled_here else 0.0,
        "timing/sandbox_s": phase.timing["sandbox_s"] if sampled_here else 0.0,
        "timing/update_s": update_s,
        "timing/total_s": update_s + (phase.timing["total_s"] if sampled_here else 0.0),
    })
    return metrics


def train_step(slot: Any, phase: Phase, team: Any, dist: Any, steps_per_generation: int, per_phase: int,
               stage: Callable[[str], None]) -> tuple[dict[str, Any], float]:
    """One optimizer step of the active player on its unit of the phase (rank 0 broadcasts the batch; the update
    is data-parallel): (the step's metrics line, empty on other ranks; the update's seconds)."""
    n_pass, u = unit_of_step(slot.step_in_phase, steps_per_generation)
    unit = phase.units[u] if dist.is_main else None
    stage(f"GRPO update of {slot.role} (phase step {slot.step_in_phase + 1}/{per_phase})")
    batch = dist.broadcast(unit.batch if unit is not None else None)
    trainer_metrics, update_s = team.update(slot.role, slot.iteration, batch, on_policy=slot.step_in_phase == 0)
    if unit is None:
        return {}, update_s
    stage("records, checkpoint")
    return update_metrics(slot, phase, unit, n_pass, u, trainer_metrics, team.players[slot.role].trainer.global_step,
                          update_s), update_s
