"""Kinds of verifier by what their checks did on one task: which strategy the Evaluation reward pays.

Every generated verifier of a task is put in the first kind that fits, read from the verdict matrix and its masks:

- ``invalid``: not in I_valid (does not compile, no ``check``, or its check errored on every original);
- ``crashes_answered``: valid, and its check errored on every original that has a final answer (at least one): it
  passes only where a prefix's ``if answer is None: return (False, ...)`` rejects cleanly (the "prefix-crasher");
- ``rejects_all``: valid, Z = 0 on every original and every applied variant (and not the kind above);
- ``accepts_all``: valid, Z = 1 on every original and every applied variant;
- ``discriminating``: valid, anything else (it tells some trajectories from others, rightly or not).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

KINDS = ("invalid", "crashes_answered", "rejects_all", "accepts_all", "discriminating")
LABELS = {"invalid": "invalid", "crashes_answered": "errors on answered originals", "rejects_all": "rejects all",
          "accepts_all": "accepts all", "discriminating": "discriminating"}


def verifier_kind(valid_row: Optional[int], z_orig: np.ndarray, z_adv: np.ndarray, adv_mask: np.ndarray,
                  error_orig: Optional[np.ndarray], answered: Sequence[bool]) -> str:
    """The kind of one generated verifier; ``valid_row`` is its row in Z (None: not valid), ``answered`` (K,) says
    which originals have a final answer, ``error_orig`` (M_q, K) which original checks errored (None: none)."""
    if valid_row is None:
        return "invalid"
    answered = np.asarray(answered, dtype=bool)
    if error_orig is not None and answered.any() and np.asarray(error_orig, dtype=bool)[valid_row][answered].all():
        return "crashes_answered"
    verdicts = np.concatenate([np.asarray(z_orig)[valid_row].ravel(),
                               np.asarray(z_adv)[valid_row][np.asarray(adv_mask, dtype=bool)].ravel()])
    if not verdicts.any():
        return "rejects_all"
    if verdicts.all():
        return "accepts_all"
    return "discriminating"


def task_kinds(num_generated: int, valid: Sequence[int], z_orig: np.ndarray, z_adv: np.ndarray, adv_mask: np.ndarray,
               error_orig: Optional[np.ndarray], answered: Sequence[bool]) -> list[str]:
    """The kind of each of a task's ``num_generated`` verifiers (``valid``: their indices in Z's rows, in order)."""
    row_of = {int(v): r for r, v in enumerate(valid)}
    return [verifier_kind(row_of.get(i), z_orig, z_adv, adv_mask, error_orig, answered) for i in range(num_generated)]

