"""Reward variance: the Execution reward of UnifiedPlayers (Eq. 4) against Agent0-style self-consistency on the
same trajectories (§4.5, Figure 3a,b); eval/README.md defines both.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from eval.analysis.rundir import RunData, single_run_main
from eval.paper_numbers import REWARD_VARIANCE_RATIO


def majority_vote_rewards(answers: Sequence[Optional[str]]) -> np.ndarray:
    """1 for samples in the largest answer cluster (first one on a tie), 0 otherwise. Shape (K,)."""
    from unifiedplayers.feedback.rewards import answer_clusters

    rewards = np.zeros(len(answers))
    clusters = answer_clusters(answers)
    if clusters:
        majority = max(clusters, key=len)
        rewards[majority] = 1.0
    return rewards


def reward_variance(records: Sequence[Any]) -> dict[str, Any]:
    from unifiedplayers.feedback.rewards import execution_rewards

    var_up, var_sc, used = [], [], 0
    skipped_no_verifier = 0
    for rec in records:
        z_orig = np.asarray(rec.z_orig)
        if z_orig.shape[0] == 0 or len(rec.trajectories) < 2:
            skipped_no_verifier += int(z_orig.shape[0] == 0)
            continue
        r_up = execution_rewards(z_orig)
        r_sc = majority_vote_rewards([t.final_answer for t in rec.trajectories])
        var_up.append(float(np.var(r_up)))
        var_sc.append(float(np.var(r_sc)))
        used += 1
    mean_up = float(np.mean(var_up)) if var_up else None
    mean_sc = float(np.mean(var_sc)) if var_sc else None
    ratio = None if not mean_up or not mean_sc else mean_up / mean_sc
    if mean_up is not None and mean_sc == 0.0 and mean_up > 0:
        ratio = float("inf")
    return {
        "num_tasks": len(records), "num_used": used, "skipped_no_valid_verifier": skipped_no_verifier,
        "mean_variance_unifiedplayers": mean_up, "mean_variance_self_consistency": mean_sc, "ratio": ratio,
        "zero_variance_share_unifiedplayers": float(np.mean([v == 0 for v in var_up])) if var_up else None,
        "zero_variance_share_self_consistency": float(np.mean([v == 0 for v in var_sc])) if var_sc else None,
        "per_question": {"unifiedplayers": var_up, "self_consistency": var_sc},
        "paper_ratio": REWARD_VARIANCE_RATIO,
    }


def to_markdown(r: dict[str, Any]) -> str:
    f = lambda x: "–" if x is None else f"{x:.4f}"  # noqa: E731
    ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    return "\n".join([
        "**Per-question reward variance** (Execution reward, same trajectories)", "",
        "| reward | mean variance | zero-variance share |", "|---|---|---|",
        f"| UnifiedPlayers (verdicts, Eq. 4) | {f(r['mean_variance_unifiedplayers'])} | {f(r['zero_variance_share_unifiedplayers'])} |",
        f"| Agent0-style majority vote | {f(r['mean_variance_self_consistency'])} | {f(r['zero_variance_share_self_consistency'])} |",
        "", f"Ratio: {ratio} (paper: {r['paper_ratio']:.2f}x) over {r['num_used']} of {r['num_tasks']} tasks "
        f"({r['skipped_no_valid_verifier']} without a valid verifier left out).", "",
    ])


def plot(r: dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    data = [r["per_question"]["unifiedplayers"], r["per_question"]["self_consistency"]]
    ax.hist(data, bins=12, range=(0, 0.25), label=["UnifiedPlayers", "Agent0-style SC"])
    ax.set_xlabel("per-question reward variance")
    ax.set_ylabel("questions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def analyse(run: RunData) -> dict[str, Any]:
    return reward_variance(run.played_records())


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    return single_run_main(argv, "Per-question reward variance vs majority-vote agreement", "reward_variance",
                           analyse, to_markdown, need_records=True,
                           figure=lambda result, png: plot(result, png) if result["num_used"] else None)


if __name__ == "__main__":
    main()
