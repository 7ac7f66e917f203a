"""One task's executable feedback end to end: perturb → verdict matrix → rewards → ξ(q).

    record, r = task_feedback(q, trajectories, verifier_outputs, engine, sandbox, cfg.reward, history)
    writer.append(record)      # RecordWriter(run_dir / "records.jsonl")

``r.execution`` (K,), ``r.evaluation`` (M,) and ``r.planning`` are the three players' rewards; the
record holds everything they were derived from (SPEC §5).
"""
from __future__ import annotations

from typing import Any, Sequence

from unifiedplayers import rewards
from unifiedplayers.perturbation import PerturbationEngine
from unifiedplayers.records import InteractionRecord
from unifiedplayers.trajectory import Trajectory
from unifiedplayers.verdict import verdict_matrix


def task_feedback(
    question: str,
    trajectories: Sequence[Trajectory],
    verifier_outputs: Sequence[str],
    engine: PerturbationEngine,
    sandbox: Any,
    reward_cfg: Any,
    history: Sequence[str] = (),
    **record_fields: Any,
) -> tuple[InteractionRecord, rewards.TaskRewards]:
    """Perturb the K trajectories, run the M verifiers on everything (one sandbox batch), derive the
    rewards of Eq. 2, 4 and 5 and assemble ξ(q). ``record_fields``: task_id, iteration, expected_answer."""
    variants = engine.perturb_many(trajectories)
    vm = verdict_matrix(verifier_outputs, trajectories, variants, sandbox)
    r = rewards.task_rewards(
        vm.z_orig, vm.z_adv, vm.valid, vm.num_generated, vm.valid_sources,
        [t.final_answer for t in trajectories], question, history, reward_cfg, vm.adv_mask,
        adv_errors=vm.error_adv,
    )
    meta = dict(record_fields.pop("meta", {}) or {})
    meta["invalid_verifiers"] = {str(i): why for i, why in enumerate(vm.validity) if why != "valid"}
    meta["check_errors"] = [
        {"verifier": c.verifier, "trajectory": c.trajectory, "variant": c.variant, "kind": c.outcome.kind,
         "reason": c.outcome.reason}
        for c in vm.errors
    ]
    record = InteractionRecord.from_verdict(
        question, trajectories, variants, vm, r.red, engine.rules,
        rewards={
            "execution": r.execution, "evaluation": r.evaluation, "planning": r.planning,
            "uncertainty": r.uncertainty, "writability": r.writability, "repetition": r.repetition,
        },
        meta=meta,
        **record_fields,
    )
    return record, r
