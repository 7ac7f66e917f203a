"""The fixed bank of held-out role contexts for entropy retention (Appendix D.2: token entropy on 256 held-out
contexts per role, final/initial ratio).

Shipped as package data (``unifiedplayers/data/entropy_bank.json``), written once by
``python -m eval.make_entropy_bank`` from our own templates with seeded numbers, so nothing training samples is in
it: per role 256 topic phrases (planning) or math word problems (execution, evaluation).
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from unifiedplayers.roles import ROLES

BANK_FILE = "entropy_bank.json"


@functools.lru_cache(maxsize=1)
def load_bank() -> dict[str, Any]:
    """The shipped bank (``version``, ``seed``, ``generator`` and one list per role)."""
    text = resources.files("unifiedplayers").joinpath("data", BANK_FILE).read_text(encoding="utf-8")
    bank = json.loads(text)
    missing = [r for r in ROLES if not isinstance(bank.get(r), list)]
    if missing:
        raise ValueError(f"{BANK_FILE}: no list for role(s) {missing}; "
                         "regenerate it with python -m eval.make_entropy_bank")
    return bank


def entropy_bank_texts(role: str, size: int) -> list[str]:
    """The first ``size`` held-out texts of ``role``: topic phrases (planning) or questions (execution,
    evaluation), to be rendered with that role's prompt; a size beyond the bank is an error, never a silent cap."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {ROLES}")
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"entropy bank size must be an int, got {size!r}")
    if size < 0:
        raise ValueError(f"entropy bank size must be >= 0, got {size}")
    items = load_bank()[role]
    if size > len(items):
        raise ValueError(f"trainer.entropy_bank_size={size} but the {role} entropy bank holds {len(items)} held-out "
                         f"contexts; lower it or extend eval/make_entropy_bank.py")
    return [item["question"] if isinstance(item, dict) else str(item) for item in items[:size]]
