"""One sampling phase of a block (§3.3, Appendix B.3; docs/method.md, "Sampling phases"): fixed records, S × μ optimizer
steps against the behaviour log-probs recorded at sampling (sg[D_p^(b)]), so the ratio of Eq. 18 moves off 1 inside
the phase and the clip of Eq. 19 can bind.

The pure parts of a phase, as maps over its played tasks (:class:`~unifiedplayers.loop.sampling.PlayedTask`): the
feedback (:func:`add_feedback`), the active player's groups, advantages (Eq. 17) and minibatches
(:func:`build_minibatches`), a minibatch's metrics and the records (:func:`phase_records`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from unifiedplayers.trainer import grpo
from unifiedplayers.config import role_trainer_config
from unifiedplayers.feedback.pipeline import FeedbackContext, phase_feedback
from unifiedplayers.methods import GroupShape, shape_advantages
from unifiedplayers.diagnostics.records import InteractionRecord
from unifiedplayers.diagnostics.verifier_kinds import kind_metrics, task_kinds_and_advantages
from unifiedplayers.trainer.sample import TrainSample, as_sample, sample_from_completion, sample_from_segments


def minibatch_of_step(step_in_phase: int, steps_per_generation: int) -> tuple[int, int]:
    """(pass, minibatch) of the ``step_in_phase``-th optimizer step of a phase: passes over the S minibatches in order."""
    return step_in_phase // steps_per_generation, step_in_phase % steps_per_generation


def split_minibatches(n: int, minibatches: int) -> list[list[int]]:
    """``n`` items (tasks or questioner prompts) into ``minibatches`` contiguous, disjoint chunks of near-equal size
    (a shortfall of well-formed tasks is spread over them)."""
    return [list(map(int, c)) for c in np.array_split(np.arange(n), minibatches)]


@dataclass
class MiniBatch:
    """One mini-batch of a phase: what its optimizer steps train on, and what its metrics line reports."""

    batch: list[Any]  # TrainSample (empty: the step is skipped)
    metrics: dict[str, Any]  # sampling and feedback metrics of its tasks (no trainer metrics)


@dataclass
class Phase:
    """A sampled phase (rank 0's): its first update and its minibatches."""

    first: int
    minibatches: list[MiniBatch]
    timing: dict[str, float] = field(default_factory=dict)  # generation_s, sandbox_s, feedback_s of the phase

    def to_state(self) -> dict[str, Any]:
        """What phase.pt holds: each sample as a dict of its fields, so that the file names no class of ours."""
        return {"first": self.first, "timing": dict(self.timing),
                "minibatches": [{"batch": [_sample_fields(s) for s in u.batch], "metrics": u.metrics}
                                for u in self.minibatches]}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "Phase":
        """The phase :meth:`to_state` saved, read with :func:`load_phase_state`."""
        minibatches = [MiniBatch([TrainSample(**s) for s in u["batch"]], u["metrics"]) for u in d["minibatches"]]
        return cls(d["first"], minibatches, dict(d["timing"]))


def _sample_fields(sample: Any) -> dict[str, Any]:
    sample = as_sample(sample)  # a method's own batch may hold mappings (the trainer reads them the same way)
    return {f.name: getattr(sample, f.name) for f in dataclasses.fields(TrainSample)}


def load_phase_state(path: Any) -> dict[str, Any]:
    """phase.pt as :meth:`Phase.to_state` wrote it; one this version cannot read is refused, saying what to do."""
    try:
        state = torch.load(path, weights_only=False)
        if not isinstance(state, dict) or "minibatches" not in state:
            raise ValueError("no minibatches in it")
        return state
    except Exception as err:  # noqa: BLE001 - a class that has moved, an old layout, a torn file
        raise RuntimeError(
            f"{path} cannot be read ({type(err).__name__}: {err}): the sampled phase of a run stopped inside it, written "
            "by an older version of this code (or damaged); this version cannot resume that run: start a new run in "
            "another run_dir") from None


def group_samples(role: str, groups: Sequence[Sequence[Any]], played: Sequence[Any],
                  malformed_reward: Callable[[Any], float]) -> tuple[list[Callable[[float], Any]], list[float], list[int]]:
    """(sample makers, rewards, group ids) of the active player in one minibatch, one maker per candidate. Groups
    (Appendix B.3, Eq. 16): Planning, the G_T outputs of a questioner prompt (a malformed one at
    ``malformed_reward(task)``); Execution, the K trajectories of a played task; Evaluation, its M verifiers."""
    makers: list[Callable[[float], Any]] = []
    rewards: list[float] = []
    gids: list[int] = []
    if role == "planning":
        reward_at = {p.place: p.rewards[role] for p in played}
        for g, group in enumerate(groups):
            for task in group:
                r = reward_at[task.place] if task.valid else malformed_reward(task)
                makers.append(lambda a, c=task.completion, g=g: sample_from_completion(c, a, g))
                rewards.append(float(r))
                gids.append(g)
        return makers, rewards, gids
    for g, p in enumerate(played):
        for x, rew in zip(p.rollouts if role == "execution" else p.verifiers, p.rewards[role]):
            if role == "execution":  # a trajectory: its generated segments, the tool outputs between them masked
                makers.append(lambda a, s=x.segments, g=g: sample_from_segments(s, a, g))
            else:
                makers.append(lambda a, c=x.completion, g=g: sample_from_completion(c, a, g))
            rewards.append(float(rew))
            gids.append(g)
    return makers, rewards, gids


def training_batch(makers: Sequence[Callable[[float], Any]], rewards: Sequence[float], group_ids: Sequence[int],
                   trainer_cfg: Any, drop_zero_advantage_groups: bool,
                   shapes: Optional[dict[int, GroupShape]] = None) -> list[Any]:
    """The minibatch's samples with their group-relative advantages (Eq. 17); zero-advantage groups dropped when asked.
    ``shapes``: a baseline's shape of each group (:meth:`unifiedplayers.methods.Method.group_shape`)."""
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


def accuracy_by_verifiers(verdicts: Sequence[Any]) -> Optional[float]:
    """Execution's accuracy as the verifiers judge it: the share of trajectories that a strict majority of their task's
    valid verifiers accept (``z_orig``, valid verifiers x trajectories); tasks without a valid verifier are left out."""
    return _mean([float(col > vm.z_orig.shape[0] / 2) for vm in verdicts if vm.z_orig.shape[0]
                  for col in vm.z_orig.sum(axis=0)])


def minibatch_metrics(role: str, groups: Sequence[Sequence[Any]], played: Sequence[Any],
                 malformed_reward: Callable[[Any], float]) -> dict[str, Any]:
    """The sampling and feedback metrics of one minibatch (rewards, formats, verdict statistics): ``played``, its
    played tasks; ``groups``, the Planning outputs it reports (Planning: its questioner prompts'; else all)."""
    m: dict[str, Any] = {}
    all_tasks = [t for g in groups for t in g]
    feedback = [p.feedback for p in played]
    verdicts = [fb.verdicts for fb in feedback]
    rollouts = [p.rollouts for p in played]
    plan_r = [p.rewards["planning"] for p in played]
    if role == "planning":  # the malformed outputs are in its groups, at the method's reward
        plan_r = plan_r + [malformed_reward(t) for t in all_tasks if not t.valid]
    m["planning/reward_mean"] = _mean(plan_r)
    m["planning/valid_rate"] = sum(t.valid for t in all_tasks) / max(len(all_tasks), 1)
    m["planning/num_tasks"] = len(played)
    m["planning/U"] = _mean([f.terms.uncertainty for f in feedback])
    m["planning/V"] = _mean([f.terms.writability for f in feedback])
    m["planning/R"] = _mean([f.terms.repetition for f in feedback])
    m["execution/reward_mean"] = _mean([x for p in played for x in p.rewards["execution"]])
    statuses = [r.status for tr in rollouts for r in tr]
    for s in ("answered", "turn_limit", "no_answer", "error"):
        m[f"execution/{s}_rate"] = statuses.count(s) / len(statuses) if statuses else None
    m["execution/tool_calls_mean"] = _mean([r.num_tool_calls for tr in rollouts for r in tr])
    m["execution/accuracy_by_verifiers"] = accuracy_by_verifiers(verdicts)
    m["evaluation/reward_mean"] = _mean([x for p in played for x in p.rewards["evaluation"]])
    generated = sum(vm.num_generated for vm in verdicts)
    m["evaluation/valid_rate"] = sum(len(vm.valid) for vm in verdicts) / generated if generated else None
    m["evaluation/rho_gold"] = _mean([x for f in feedback for x in f.terms.gold])
    m["evaluation/rho_adv"] = _mean([x for f in feedback for x in f.terms.adv])
    m["evaluation/rho_red"] = _mean([x for f in feedback for x in f.terms.red])
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
    # What the Evaluation reward pays each kind of verifier: share and mean advantage within the M.
    m.update(kind_metrics([task_kinds_and_advantages(fb.verdicts.num_generated, fb.verdicts.valid, fb.verdicts.z_orig,
                                                     fb.verdicts.z_adv, fb.verdicts.adv_mask, fb.verdicts.error_orig,
                                                     fb.answers, p.rewards.get("evaluation"))
                           for p, fb in zip(played, feedback) if fb.verdicts.num_generated]))
    return m


def trainer_metrics_line(role: str, trainer_metrics: dict[str, float], global_step: int) -> dict[str, Any]:
    """The trainer's metrics of one optimizer step under ``<role>/...`` (ratio, clip fraction, KL, grad-norm)."""
    m: dict[str, Any] = {}
    for key, value in trainer_metrics.items():
        namespace, _, name = key.rpartition("/")
        if namespace == "perf" and name.endswith("_per_s"):  # a rate: varies between runs, with the timings
            m[f"timing/{name}"] = value
        elif namespace == "perf" and name.startswith("time_"):  # a wall time: with the timings, per role
            m[f"timing/{role}_{name}"] = value
        elif namespace == "perf":  # the update's work (update_tflop, pad_share): the data's, not a timing
            m[f"{role}/{name}"] = value
        elif namespace == "actor" or not namespace:
            m[f"{role}/{name}"] = value
        else:
            m[f"{role}/{namespace}_{name}"] = value
    m[f"{role}/step"] = global_step
    return m


def add_feedback(played: Sequence[Any], method: Any, ctx: FeedbackContext) -> None:
    """The feedback stage: each played task's feedback (perturb → verdict matrix → Eq. 2-5), then every player's
    rewards from it (:meth:`~unifiedplayers.methods.Method.phase_rewards`)."""
    for p, fb in zip(played, phase_feedback(played, ctx), strict=True):
        p.feedback = fb
    for p, rewards in zip(played, method.phase_rewards([p.feedback for p in played]), strict=True):
        p.rewards = rewards


@dataclass
class PhaseContext:
    """What a phase's minibatches and records read besides its played tasks."""

    at: Any  # the phase's first update (schedule.Update: its role, iteration, phase and update)
    groups: Sequence[Sequence[Any]]  # every Planning output of the phase, by questioner prompt
    unused: Sequence[Any]  # the well-formed outputs not played
    versions: dict[str, Any]  # the checkpoint each player sampled with
    cfg: Any
    method: Any
    tokenizer: Any = None
    player_cfg: Any = None
    rules: Sequence[str] = ()  # the perturbation rules (the records' columns)
    method_metrics: dict[str, Any] = field(default_factory=dict)  # the method's phase figures (after_rollouts)

    @property
    def role(self) -> str:
        return self.at.role

    @property
    def num_minibatches(self) -> int:
        return int(self.cfg.schedule.steps_per_generation)

    @cached_property
    def group_minibatch(self) -> list[int]:
        """The minibatch of each group: Planning, a share of the questioner prompts; other roles, 0 (phase-wide)."""
        if self.role != "planning":
            return [0] * len(self.groups)
        return [u for u, idx in enumerate(split_minibatches(len(self.groups), self.num_minibatches)) for _ in idx]


def assign_minibatches(played: Sequence[Any], ctx: PhaseContext) -> None:
    """Each played task's minibatch: Planning, its questioner prompt's; other roles, a share of the tasks."""
    if ctx.role == "planning":
        for p in played:
            p.minibatch = ctx.group_minibatch[p.group]
        return
    for u, idx in enumerate(split_minibatches(len(played), ctx.num_minibatches)):
        for i in idx:
            played[i].minibatch = u


def build_minibatches(played: Sequence[Any], ctx: PhaseContext) -> list[MiniBatch]:
    """The phase's S minibatches: disjoint mini-batches of the active player's groups, advantages within each group
    (Eq. 17, shaped by the method), each with its metrics. Sets each played task's ``minibatch``."""
    assign_minibatches(played, ctx)
    trainer_cfg = role_trainer_config(ctx.cfg.trainer, ctx.role)
    out: list[MiniBatch] = []
    for u in range(ctx.num_minibatches):
        minibatch = [p for p in played if p.minibatch == u]
        groups = [group for group, gu in zip(ctx.groups, ctx.group_minibatch)
                  if ctx.role != "planning" or gu == u]
        out.append(build_minibatch(minibatch, groups, ctx, trainer_cfg))
    return out


def build_minibatch(minibatch: Sequence[Any], groups: Sequence[Sequence[Any]], ctx: PhaseContext, trainer_cfg: Any) -> MiniBatch:
    """One minibatch from its played tasks and the Planning outputs it reports (:func:`minibatch_metrics`)."""
    role, method = ctx.role, ctx.method
    makers, rewards, gids = group_samples(role, groups, minibatch, method.malformed_task_reward)
    shapes = None
    if role != "planning":  # group g of the minibatch is its task g (a method may shape it)
        shapes = {g: method.group_shape(role, p.feedback, float(trainer_cfg.clip_eps)) for g, p in enumerate(minibatch)}
    # A method's own batch (Socratic-Zero: the Solver's DPO pairs, the Generator's imitation) replaces GRPO's.
    own = method.minibatch_samples(role, minibatch, ctx.tokenizer, ctx.player_cfg)
    batch = own if own is not None else training_batch(
        makers, rewards, gids, trainer_cfg, ctx.cfg.schedule.drop_zero_advantage_groups, shapes)
    m = minibatch_metrics(role, groups, minibatch, method.malformed_task_reward)
    m.update(method.minibatch_metrics(role, minibatch))
    m.update(ctx.method_metrics)
    if shapes is not None:
        m[f"{role}/kept_groups"] = (sum(sh.keep for sh in shapes.values()) / len(shapes)) if shapes else None
    return MiniBatch(batch, m)


def feedback_record(fb: Any, trajectories: Sequence[Any], verifier_sources: Sequence[str], rules: Sequence[str],
                    player_rewards: dict[str, Any], meta: dict[str, Any], **fields: Any) -> InteractionRecord:
    """The interaction record ξ(q) of one played task from its feedback: Z, the variants, the verifiers and their
    validity, every check error, the players' rewards and the terms of Eq. 2-5."""
    vm, tr = fb.verdicts, fb.terms
    meta = dict(meta, verifier_outputs=list(verifier_sources), verifier_validity=vm.validity,
                # every check that raised, timed out or gave no verdict (invalid verifiers' included); the counts
                # behind Z are record.error_summary()
                check_errors=[{"verifier": c.verifier, "trajectory": c.trajectory, "variant": c.variant,
                               "kind": c.outcome.kind, "reason": c.outcome.reason} for c in vm.errors])
    rewards = {**player_rewards, "U": tr.uncertainty, "V": tr.writability, "R": tr.repetition, "rho_gold": tr.gold,
               "rho_adv": tr.adv, "rho_red": tr.red}
    return InteractionRecord.from_verdict(fb.question, list(trajectories), list(fb.variants), vm, tr.red, list(rules),
                                          rewards=rewards, meta=meta, **fields)


def phase_records(played: Sequence[Any], ctx: PhaseContext) -> list[InteractionRecord]:
    """One interaction record ξ(q) per Planning output of the phase, malformed and unused ones included."""
    out: list[InteractionRecord] = []
    played_at = {p.place: p for p in played}
    unused_at = {t.place for t in ctx.unused}
    for g, group in enumerate(ctx.groups):
        for task in group:
            p = played_at.get(task.place)
            meta = record_meta(ctx, p.minibatch if p is not None else ctx.group_minibatch[g])
            if p is not None:  # e.g. Socratic-Zero's Teacher grades, the failure
                meta.update(ctx.method.record_meta(p))
            meta.update(topic=task.topic, prompt_index=task.prompt_index, planning_output=task.text)
            task_id = f"u{meta['global_update']:06d}-t{len(out):03d}"
            if p is not None:
                out.append(played_record(p, meta, task_id, ctx.rules))
            else:
                status = "unused" if task.place in unused_at else "malformed_task"
                out.append(unplayed_record(task, status, meta, task_id, ctx))
    return out


def record_meta(ctx: PhaseContext, minibatch: int) -> dict[str, Any]:
    """The metadata of every record of the phase: the phase, the update that trains on it, the checkpoints."""
    at = ctx.at
    return {"outer_iteration": at.iteration, "block": at.role, "phase": at.phase_first, "update": at.step_in_block + minibatch,
            "global_update": at.phase_first + minibatch, "checkpoints": ctx.versions}


def played_record(p: Any, meta: dict[str, Any], task_id: str, rules: Sequence[str]) -> InteractionRecord:
    """The record of a played task: its trajectories' statuses, then its feedback (:func:`feedback_record`)."""
    meta.update(status="played", trajectory_status=[r.status for r in p.rollouts],
                trajectory_detail=[r.detail for r in p.rollouts], tool_calls=p.tool_calls)
    return feedback_record(p.feedback, p.trajectories, p.verifier_sources, rules, p.rewards, meta, task_id=task_id,
                           iteration=meta["outer_iteration"], expected_answer=p.expected_answer)


def unplayed_record(task: Any, status: str, meta: dict[str, Any], task_id: str,
                    ctx: PhaseContext) -> InteractionRecord:
    """The record of a Planning output not played: malformed (with its Planning reward) or unused."""
    meta.update(status=status, reason=task.reason or "well-formed; beyond tasks_per_update")
    rewards = {"planning": float(ctx.method.malformed_task_reward(task))} if status == "malformed_task" else {}
    return InteractionRecord(
        question=task.question or "", trajectories=[], verifiers=[], variants=[], z_orig=[], z_adv=[], adv_mask=[],
        redundancy=[], rules=list(ctx.rules), valid=[], num_generated=0, task_id=task_id,
        iteration=meta["outer_iteration"], expected_answer=task.expected_answer, rewards=rewards, meta=meta)


def update_metrics(at: Any, phase: Phase, minibatch: MiniBatch, n_pass: int, minibatch_index: int,
                   trainer_metrics: dict[str, float], global_step: int, update_s: float) -> dict[str, Any]:
    """The metrics line of one update: its minibatch's figures (on its first pass only), the trainer's, its place in
    the run, and its timings (the phase's sampling and feedback on the phase's first step)."""
    metrics: dict[str, Any] = dict(minibatch.metrics) if n_pass == 0 else {}
    metrics[f"{at.role}/skipped"] = float(not trainer_metrics)
    metrics.update(trainer_metrics_line(at.role, trainer_metrics, global_step))
    sampled_here = at.step_in_phase == 0
    metrics.update({
        "outer_iteration": at.iteration, "block": at.role, "update": at.step_in_block, "global_update": at.index,
        "phase": at.phase_first, "phase_step": at.step_in_phase, "phase_pass": n_pass, "phase_minibatch": minibatch_index,
        "timing/generation_s": phase.timing["generation_s"] if sampled_here else 0.0,
        "timing/sandbox_s": phase.timing["sandbox_s"] if sampled_here else 0.0,
        "timing/update_s": update_s,
        "timing/total_s": update_s + (phase.timing["total_s"] if sampled_here else 0.0),
    })
    return metrics


def train_step(at: Any, phase: Phase, team: Any, steps_per_generation: int, per_phase: int,
               progress: Callable[[str], None]) -> tuple[dict[str, Any], float]:
    """One optimizer step of the active player on its minibatch of the phase (over several ranks the team sends the
    batch to every rank, and the update is data-parallel): (the step's metrics line, the update's seconds)."""
    n_pass, u = minibatch_of_step(at.step_in_phase, steps_per_generation)
    minibatch = phase.minibatches[u]
    progress(f"GRPO update of {at.role} (phase step {at.step_in_phase + 1}/{per_phase})")
    trainer_metrics, update_s = team.update(at.role, at.iteration, minibatch.batch,
                                            on_policy=at.step_in_phase == 0)
    progress("records, checkpoint")
    return update_metrics(at, phase, minibatch, n_pass, u, trainer_metrics, team.players[at.role].trainer.global_step,
                          update_s), update_s
