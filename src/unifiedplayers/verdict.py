"""The verdict matrix Z(q) = [Z_orig | Z_adv] of one task (SPEC §5; paper Eq. 9-10).

``verdict_matrix`` compiles the M verifier outputs, then runs every valid verifier on the K originals
and their K·P variants as ONE parallel sandbox batch (``sandbox.call_many``): M_q·K·(1+P) checks, fewer
where a rule could not apply (those variants are ``None`` and masked out, never run).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.trajectory import Trajectory
from unifiedplayers.verifier import (
    ENTRY_POINT,
    CheckOutcome,
    CompiledVerifier,
    compile_verifier,
    outcome_of,
    sandbox_source,
)


@dataclass(frozen=True)
class CheckRecord:
    """The outcome of one check: verifier ``verifier`` (index among the M generated) on trajectory
    ``trajectory``, original (``variant`` None) or its variant ``variant``."""

    verifier: int
    trajectory: int
    variant: Optional[int]
    outcome: CheckOutcome


@dataclass
class VerdictMatrix:
    """Binary verdicts of the valid verifiers (rows) on originals and variants (columns).

    z_orig: (M_q, K) int8, Z_orig[i, k] = v_i(τ_k)                         Eq. 9
    z_adv:  (M_q, K, P) int8, Z_adv[i, k, j] = v_i(τ_adv[k, j]); 0 where masked
    adv_mask: (K, P) bool, False where rule j could not apply to τ_k
    valid: indices of the valid verifiers among the M generated (row i of Z is verifier valid[i])
    compiled: the M compilation results (validity reasons of the invalid ones)
    checks: every executed check with its outcome (rejection reasons included)
    """

    z_orig: np.ndarray
    z_adv: np.ndarray
    adv_mask: np.ndarray
    valid: list[int]
    compiled: list[CompiledVerifier]
    checks: list[CheckRecord] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        """M, the verifiers generated (valid or not)."""
        return len(self.compiled)

    @property
    def z(self) -> np.ndarray:
        """Z(q) = [Z_orig | Z_adv] in {0,1}^{M_q × K(1+P)}, (k, j) flattened k-major (Eq. 10)."""
        m_q, k, p = self.z_adv.shape
        return np.concatenate([self.z_orig, self.z_adv.reshape(m_q, k * p)], axis=1)

    @property
    def errors(self) -> list[CheckRecord]:
        """Checks that raised, timed out or returned something other than a verdict."""
        return [c for c in self.checks if c.outcome.kind in ("raised", "timeout", "bad_return")]

    @property
    def valid_sources(self) -> list[str]:
        return [self.compiled[i].source or "" for i in self.valid]


def verdict_matrix(
    verifier_sources: Sequence[str],
    originals: Sequence[Trajectory],
    variants: Optional[Sequence[Sequence[Optional[Trajectory]]]],
    sandbox: Any,
) -> VerdictMatrix:
    """Run all valid verifiers on all originals and variants in one parallel sandbox batch.

    verifier_sources: the M Evaluation outputs (fenced or bare code); invalid ones get no row.
    originals: the K trajectories. variants: K rows of P entries (Trajectory or None); None or [] for P=0.
    """
    compiled = [compile_verifier(s) for s in verifier_sources]
    valid = [i for i, c in enumerate(compiled) if c.valid]
    k = len(originals)
    rows = [list(r) for r in variants] if variants else [[] for _ in range(k)]
    if len(rows) != k:
        raise ValueError(f"variants has {len(rows)} rows for {k} trajectories")
    p = len(rows[0]) if rows else 0
    if any(len(r) != p for r in rows):
        raise ValueError("every trajectory needs the same number of variant slots (one per rule)")
    adv_mask = np.array([[v is not None for v in r] for r in rows], dtype=bool).reshape(k, p)

    payload_orig = [t.to_dict() for t in originals]
    payload_adv = {(kk, j): rows[kk][j].to_dict() for kk in range(k) for j in range(p) if adv_mask[kk, j]}
    calls, where = [], []
    for row, i in enumerate(valid):
        program = sandbox_source(compiled[i].source or "")
        for kk in range(k):
            calls.append((program, ENTRY_POINT, payload_orig[kk]))
            where.append((row, i, kk, None))
            for j in range(p):
                if adv_mask[kk, j]:
                    calls.append((program, ENTRY_POINT, payload_adv[(kk, j)]))
                    where.append((row, i, kk, j))
    results = sandbox.call_many(calls) if calls else []

    z_orig = np.zeros((len(valid), k), dtype=np.int8)
    z_adv = np.zeros((len(valid), k, p), dtype=np.int8)
    checks = []
    for (row, i, kk, j), call in zip(where, results):
        outcome = outcome_of(call)
        if j is None:
            z_orig[row, kk] = int(outcome.accepted)
        else:
            z_adv[row, kk, j] = int(outcome.accepted)
        checks.append(CheckRecord(i, kk, j, outcome))
    return VerdictMatrix(z_orig, z_adv, adv_mask, valid, compiled, checks)
