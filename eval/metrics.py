"""Benchmark metrics (§4.1, Appendix G.2): greedy pass@1, mean@k (the paper's mean@32 for AMC, AIME24, AIME25),
unit-test pass@1 (a program passes when all its unit tests pass). Scores are in points (0-100).
"""
from __future__ import annotations

from typing import Sequence


def mean_at_k(verdicts: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of the per-problem accuracy of its samples (``verdicts[i][j]``: sample ``j`` of problem
    ``i`` is correct), in points; with one sample per problem this is pass@1."""
    if not verdicts:
        return float("nan")
    per_problem = []
    for row in verdicts:
        if not row:
            raise ValueError("a problem with no samples")
        per_problem.append(sum(bool(v) for v in row) / len(row))
    return 100.0 * sum(per_problem) / len(per_problem)


def pass_at_1(verdicts: Sequence[bool]) -> float:
    return mean_at_k([[v] for v in verdicts])


def score(metric: str, verdicts: Sequence[Sequence[bool]]) -> float:
    if metric in ("pass@1", "unit_test_pass@1"):
        if any(len(row) != 1 for row in verdicts):
            raise ValueError(f"{metric} takes exactly one completion per problem")
        return pass_at_1([row[0] for row in verdicts])
    if metric == "mean@k":
        return mean_at_k(verdicts)
    raise ValueError(f"unknown metric {metric!r}")
