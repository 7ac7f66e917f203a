"""The interaction record ξ(q) = (q, T(q), V(q), T_adv(q), Z(q), ρ_red(q)) (§3.1, Eq. 1; Appendix B.1).

One :class:`InteractionRecord` per task, appended durably as one JSON line to ``<run_dir>/records.jsonl`` (a torn
last line: :func:`unifiedplayers.rundir.iter_jsonl`). Load for analysis with :func:`records_dataframe`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from unifiedplayers.feedback.trajectory import Trajectory
from unifiedplayers.feedback.verdict import check_error_summary
from unifiedplayers.rundir import iter_jsonl, repair_tail


@dataclass
class InteractionRecord:
    """ξ(q) of one task.

    trajectories: the K originals T(q). verifiers: the valid verifier sources V(q) (row i of Z).
    variants: K rows of P perturbed trajectories T_adv(q) (None where a rule could not apply).
    z_orig, z_adv, adv_mask, valid, error_orig, error_adv, runtime_invalid: the verdict matrix Z(q), as
    :class:`unifiedplayers.feedback.verdict.VerdictMatrix` defines them; num_generated: M.
    redundancy: ρ_red(q), (M_q,). rules: the P rule names, in column order.
    rewards: the rewards derived from this record (filled by the caller; free-form but JSON-able).
    """

    question: str
    trajectories: list[Trajectory]
    verifiers: list[str]
    variants: list[list[Optional[Trajectory]]]
    z_orig: np.ndarray
    z_adv: np.ndarray
    adv_mask: np.ndarray
    redundancy: np.ndarray
    rules: list[str]
    valid: list[int]
    num_generated: int
    task_id: Optional[str] = None
    iteration: Optional[int] = None
    expected_answer: Optional[str] = None  # Planning's claimed answer: for filtering/analysis only
    rewards: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error_orig: Any = None  # None: no errors
    error_adv: Any = None
    runtime_invalid: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k, m_q, p = len(self.trajectories), len(self.verifiers), len(self.rules)
        self.z_orig = np.asarray(self.z_orig, dtype=np.int8).reshape(m_q, k)
        self.z_adv = np.asarray(self.z_adv, dtype=np.int8).reshape(m_q, k, p)
        self.adv_mask = np.asarray(self.adv_mask, dtype=bool).reshape(k, p)
        self.error_orig = (np.zeros((m_q, k), dtype=bool) if self.error_orig is None
                           else np.asarray(self.error_orig, dtype=bool).reshape(m_q, k))
        self.error_adv = (np.zeros((m_q, k, p), dtype=bool) if self.error_adv is None
                          else np.asarray(self.error_adv, dtype=bool).reshape(m_q, k, p))
        self.runtime_invalid = {int(i): str(why) for i, why in (self.runtime_invalid or {}).items()}
        self.redundancy = np.asarray(self.redundancy, dtype=np.float64).reshape(m_q)
        if len(self.variants) != k or any(len(r) != p for r in self.variants):
            raise ValueError(f"variants must be {k} rows of {p} entries")
        if len(self.valid) != m_q:
            raise ValueError(f"{len(self.valid)} valid indices for {m_q} verifiers")

    @property
    def z(self) -> np.ndarray:
        """Z(q) = [Z_orig | Z_adv], (M_q, K(1+P)) (Eq. 10)."""
        m_q, k, p = self.z_adv.shape
        return np.concatenate([self.z_orig, self.z_adv.reshape(m_q, k * p)], axis=1)

    def error_summary(self) -> dict[str, Any]:
        """Check-error counts of this task: ``checks``, ``errors_orig``, ``errors_adv``, ``error_rate``,
        ``runtime_invalid`` (``verdict.check_error_summary``)."""
        return check_error_summary(self.error_orig, self.error_adv, self.adv_mask, len(self.runtime_invalid))

    @classmethod
    def from_verdict(cls, question: str, trajectories: Sequence[Trajectory],
                     variants: Sequence[Sequence[Optional[Trajectory]]], verdict: Any, redundancy: Any,
                     rules: Sequence[str], **extra: Any) -> "InteractionRecord":
        """Assemble ξ(q) from a ``VerdictMatrix`` and the inputs it was computed from."""
        return cls(question=question, trajectories=list(trajectories), verifiers=verdict.valid_sources,
                   variants=[list(r) for r in variants] if variants else [[] for _ in trajectories],
                   z_orig=verdict.z_orig, z_adv=verdict.z_adv, adv_mask=verdict.adv_mask, redundancy=redundancy,
                   rules=list(rules), valid=list(verdict.valid), num_generated=verdict.num_generated,
                   error_orig=verdict.error_orig, error_adv=verdict.error_adv,
                   runtime_invalid=dict(verdict.runtime_invalid), **extra)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "iteration": self.iteration,
            "question": self.question,
            "expected_answer": self.expected_answer,
            "trajectories": [t.to_dict() for t in self.trajectories],
            "verifiers": list(self.verifiers),
            "variants": [[None if v is None else v.to_dict() for v in row] for row in self.variants],
            "z_orig": self.z_orig.tolist(),
            "z_adv": self.z_adv.tolist(),
            "adv_mask": self.adv_mask.tolist(),
            "redundancy": self.redundancy.tolist(),
            "rules": list(self.rules),
            "valid": list(self.valid),
            "num_generated": self.num_generated,
            "error_orig": self.error_orig.tolist(),
            "error_adv": self.error_adv.tolist(),
            "runtime_invalid": {str(i): why for i, why in self.runtime_invalid.items()},
            "rewards": _jsonable(self.rewards),
            "meta": _jsonable(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InteractionRecord":
        kw = {f.name: d[f.name] for f in fields(cls) if d.get(f.name) is not None}
        kw["trajectories"] = [Trajectory.from_dict(t) for t in d["trajectories"]]
        kw["variants"] = [[None if v is None else Trajectory.from_dict(v) for v in row] for row in d["variants"]]
        return cls(**kw)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


class RecordWriter:
    """Appends records to one JSONL file; each append is durable (flush + fsync) before it returns."""

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._f = open(self.path, "ab")

    def append(self, record: InteractionRecord) -> None:
        line = json.dumps(record.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n"
        self._f.write(line.encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iter_records(path: Union[str, os.PathLike]) -> Iterator[InteractionRecord]:
    """Records of a file in order, streamed (:func:`unifiedplayers.rundir.iter_jsonl`)."""
    return (InteractionRecord.from_dict(d) for d in iter_jsonl(path))


def load_records(path: Union[str, os.PathLike]) -> list[InteractionRecord]:
    return list(iter_records(path))


def records_dataframe(source: Union[str, os.PathLike, Sequence[InteractionRecord]]) -> Any:
    """One row per task: sizes, the verdict summaries and the rewards (a pandas DataFrame)."""
    import pandas as pd

    records = load_records(source) if isinstance(source, (str, os.PathLike)) else list(source)
    rows = []
    for r in records:
        m_q, k, p = r.z_adv.shape
        errors = r.error_summary()
        row: dict[str, Any] = {
            "task_id": r.task_id,
            "iteration": r.iteration,
            "question": r.question,
            "K": k,
            "M": r.num_generated,
            "M_q": m_q,
            "P": p,
            "variants_present": int(r.adv_mask.sum()),
            "orig_accept_rate": float(r.z_orig.mean()) if r.z_orig.size else float("nan"),
            "adv_reject_rate": float(1 - r.z_adv[:, r.adv_mask].mean()) if m_q and r.adv_mask.any() else float("nan"),
            "redundancy_mean": float(r.redundancy.mean()) if m_q else float("nan"),
            "checks": errors["checks"], "check_errors_orig": errors["errors_orig"],
            "check_errors_adv": errors["errors_adv"], "check_error_rate": errors["error_rate"],
            "runtime_invalid": errors["runtime_invalid"],
            "answers": [t.final_answer for t in r.trajectories],
        }
        for key, value in r.rewards.items():
            row[f"reward/{key}"] = value
        rows.append(row)
    return pd.DataFrame(rows)
