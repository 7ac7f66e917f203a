"""The verdict matrix Z(q) = [Z_orig | Z_adv] of one task (Appendix B.1, Eq. 9-10).

``verdict_matrix`` compiles the M verifier outputs, then runs every valid verifier on the K originals
and their K·P variants as ONE parallel sandbox batch (``sandbox.call_many``): M_q·K·(1+P) checks, fewer
where a rule could not apply (those variants are ``None`` and masked out, never run).

A check that raises, times out or returns no verdict (``verifier.ERROR_KINDS``) is an *error*: 0 in Z, as Eq. 10
has it, and marked in ``error_orig`` (M_q, K) and ``error_adv`` (M_q, K, P). A verifier whose check errors on EVERY
original is invalid, like one that does not compile (our addition; docs/method.md, "Check errors", says why).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.feedback.trajectory import Trajectory
from unifiedplayers.feedback.verifier import (ENTRY_POINT, ERROR_KINDS, CheckOutcome, CompiledVerifier,
                                              compile_verifier, outcome_of, sandbox_source)


@dataclass(frozen=True)
class CheckRecord:
    """The outcome of one check of a verifier on an original trajectory or on one of its variants."""

    verifier: int  # index among the M generated
    trajectory: int
    variant: Optional[int]  # None: the original
    outcome: CheckOutcome


@dataclass
class VerdictMatrix:
    """Binary verdicts of the valid verifiers (rows) on originals and variants (columns)."""

    z_orig: np.ndarray  # (M_q, K) int8, Z_orig[i, k] = v_i(τ_k) (Eq. 9)
    z_adv: np.ndarray  # (M_q, K, P) int8, Z_adv[i, k, j] = v_i(τ_adv[k, j]); 0 where masked
    adv_mask: np.ndarray  # (K, P) bool, False where rule j could not apply to τ_k
    valid: list[int]  # the valid verifiers' indices among the M generated: row i of Z is verifier valid[i]
    compiled: list[CompiledVerifier]  # the M compilation results (validity reasons of the invalid ones)
    checks: list[CheckRecord] = field(default_factory=list)  # every executed check, runtime-invalid verifiers' too
    error_orig: Optional[np.ndarray] = None  # (M_q, K) bool, True where Z_orig is 0 because the check errored
    error_adv: Optional[np.ndarray] = None  # (M_q, K, P) bool, the same for Z_adv (False where masked)
    # {index among the M: reason} of the verifiers that compiled but errored on every original (not in ``valid``)
    runtime_invalid: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.error_orig is None:
            self.error_orig = np.zeros(np.shape(self.z_orig), dtype=bool)
        if self.error_adv is None:
            self.error_adv = np.zeros(np.shape(self.z_adv), dtype=bool)

    @property
    def num_generated(self) -> int:  # M, valid or not
        return len(self.compiled)

    @property
    def z(self) -> np.ndarray:
        """Z(q) = [Z_orig | Z_adv] in {0,1}^{M_q × K(1+P)}, (k, j) flattened k-major (Eq. 10)."""
        m_q, k, p = self.z_adv.shape
        return np.concatenate([self.z_orig, self.z_adv.reshape(m_q, k * p)], axis=1)

    @property
    def errors(self) -> list[CheckRecord]:
        """Checks that raised, timed out or returned something other than a verdict (all verifiers)."""
        return [c for c in self.checks if c.outcome.kind in ERROR_KINDS]

    @property
    def validity(self) -> list[str]:
        """One entry per generated verifier: "valid", or why it is not (compilation or run time)."""
        return ["valid" if i in self.valid else self.runtime_invalid.get(i, c.reason)
                for i, c in enumerate(self.compiled)]

    def error_summary(self) -> dict[str, Any]:
        """:func:`check_error_summary`, with every executed check's errors by kind (``errors/raised``, ...; the
        runtime-invalid verifiers' checks included)."""
        out = check_error_summary(self.error_orig, self.error_adv, self.adv_mask, len(self.runtime_invalid))
        for kind in ERROR_KINDS:
            out[f"errors/{kind}"] = sum(c.outcome.kind == kind for c in self.checks)
        return out

    @property
    def valid_sources(self) -> list[str]:
        return [self.compiled[i].source or "" for i in self.valid]


def verdict_matrix(verifier_sources: Sequence[str], originals: Sequence[Trajectory],
                   variants: Optional[Sequence[Sequence[Optional[Trajectory]]]], sandbox: Any) -> VerdictMatrix:
    """Run every valid verifier of the M ``verifier_sources`` on the K ``originals`` and their ``variants`` (K rows
    of P entries, None where a rule could not apply; None or [] for P = 0) in one parallel sandbox batch."""
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
    error_orig = np.zeros((len(valid), k), dtype=bool)
    error_adv = np.zeros((len(valid), k, p), dtype=bool)
    checks = []
    for (row, i, kk, j), call in zip(where, results):
        outcome = outcome_of(call)
        if j is None:
            z_orig[row, kk] = int(outcome.accepted)
            error_orig[row, kk] = outcome.is_error
        else:
            z_adv[row, kk, j] = int(outcome.accepted)
            error_adv[row, kk, j] = outcome.is_error
        checks.append(CheckRecord(i, kk, j, outcome))

    # A check that errors on every original says nothing about any trajectory: that verifier is invalid.
    runtime_invalid: dict[int, str] = {}
    if k > 0:
        for row, i in enumerate(valid):
            if error_orig[row].all():
                kinds = sorted({c.outcome.kind for c in checks if c.verifier == i and c.variant is None})
                first = next(c.outcome.reason for c in checks if c.verifier == i and c.variant is None)
                runtime_invalid[i] = f"check errored on every original trajectory ({', '.join(kinds)}): {first}"[:500]
    keep = [row for row, i in enumerate(valid) if i not in runtime_invalid]
    return VerdictMatrix(z_orig[keep], z_adv[keep], adv_mask, [valid[r] for r in keep], compiled, checks,
                         error_orig=error_orig[keep], error_adv=error_adv[keep], runtime_invalid=runtime_invalid)


def check_error_summary(error_orig: np.ndarray, error_adv: np.ndarray, adv_mask: np.ndarray,
                        runtime_invalid: int = 0) -> dict[str, Any]:
    """Per-task check-error counts over the checks behind Z (M_q·K originals + M_q·present variants): ``checks``,
    ``errors_orig``, ``errors_adv``, ``error_rate`` (None without checks) and ``runtime_invalid``."""
    eo = np.asarray(error_orig, dtype=bool)
    ea = np.asarray(error_adv, dtype=bool)
    mask = np.asarray(adv_mask, dtype=bool)
    m_q = eo.shape[0] if eo.ndim == 2 else 0
    checks = int(eo.size + m_q * int(mask.sum()))
    n_orig, n_adv = int(eo.sum()), int((ea & mask[None]).sum()) if ea.size else 0
    return {"checks": checks, "errors_orig": n_orig, "errors_adv": n_adv,
            "error_rate": (n_orig + n_adv) / checks if checks else None, "runtime_invalid": int(runtime_invalid)}
