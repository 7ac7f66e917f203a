"""How the golden test compares a run with its golden files: what must match exactly, and the tolerance of the
trainer's figures (the figures it covers are in test_golden.py's docstring)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
IGNORED_PREFIXES = ("timing/", "perf/")


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not k.startswith(IGNORED_PREFIXES)}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


# Metric names (after the role's prefix) computed from gradients or log-probs: compared to TRAINER_RTOL.
TRAINER_FIGURE = re.compile(r"^(?:\w+/)?(?:grad_norm(?:/\w+)?|kl|loss|pg_loss|nll|logprob_mismatch|ratio_\w+|"
                            r"clip_frac|pg_clip_frac|dpo_margin|dpo_accuracy|entropy\w*(?:/\w+)?)$")
TRAINER_RTOL = 1e-5


def float_tolerance(path: str) -> float:
    """The relative tolerance of the float at ``path``: TRAINER_RTOL for a trainer figure of a metrics line, else 0."""
    key = path.rsplit(".", 1)[-1]
    return TRAINER_RTOL if "/metrics[" in path and TRAINER_FIGURE.match(key) else 0.0


def assert_same(got, want, path="$", new_keys_allowed=False):
    """Text, integers, booleans, None and floats exactly, but a trainer figure to TRAINER_RTOL (NaN equals NaN).
    ``new_keys_allowed``: a top-level dict may have keys the golden lacks (a new metric needs no regeneration; a
    lost one fails)."""
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool), \
            f"{path}: {got!r} != {want!r}"
        if math.isnan(want):
            assert math.isnan(got), f"{path}: {got!r} != NaN"
        else:
            rtol = float_tolerance(path)
            assert got == pytest.approx(want, rel=rtol, abs=0.0) if rtol else got == want, \
                f"{path}: {got!r} != {want!r} (rtol {rtol:g})"
        return
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: {type(got).__name__} != dict"
        missing, new = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        assert not missing and (new_keys_allowed or not new), f"{path}: keys differ: only got {new}, only golden {missing}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
        return
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]", new_keys_allowed)
        return
    assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def read_lines(path: Path) -> list:
    return [_strip(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
