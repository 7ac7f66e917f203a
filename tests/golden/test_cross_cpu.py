"""The golden test's tolerance against the golden runs' metrics as two other CPU kinds wrote them
(tests/golden/cross_cpu/README.md): it accepts them, and it is no looser than twice their largest difference."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.golden.golden_compare import DATA, TRAINER_RTOL, assert_same, float_tolerance, read_lines

pytestmark = pytest.mark.cpu

CROSS = Path(__file__).parent / "cross_cpu"
KINDS = sorted(p.name for p in CROSS.iterdir() if p.is_dir())
METHODS = sorted(p.name for p in DATA.iterdir() if p.is_dir())


def _pairs(kind: str):
    """The other kind's lines and the golden ones over the keys both hold: those runs were made before metrics were
    added to the golden files (``<role>/pad_share``, the verifier kinds), and the golden test itself checks that
    no key is lost; here only the figures' spread across CPUs is judged."""
    for method in METHODS:
        got, want = read_lines(CROSS / kind / method / "metrics.jsonl"), read_lines(DATA / method / "metrics.jsonl")
        shared = [{k: v for k, v in w.items() if k in g} for g, w in zip(got, want)]
        assert len(got) == len(want) and all(len(s) >= 0.8 * len(w) for s, w in zip(shared, want)), method
        yield method, got, shared


@pytest.mark.parametrize("kind", KINDS)
def test_tolerance_accepts_the_other_cpu_kinds(kind):
    for method, got, want in _pairs(kind):
        assert_same(got, want, f"{method}/metrics", new_keys_allowed=True)


def test_tolerance_is_no_looser_than_twice_the_measured_spread():
    worst, exact_differs = 0.0, []
    for kind in KINDS:
        for method, got, want in _pairs(kind):
            for i, (g, w) in enumerate(zip(got, want)):
                for key, value in w.items():
                    if not isinstance(value, float) or math.isnan(value) or key not in g:
                        continue
                    path = f"{method}/metrics[{i}].{key}"
                    rel = abs(g[key] - value) / abs(value) if value else abs(g[key])
                    if float_tolerance(path):
                        worst = max(worst, rel)
                    elif rel:
                        exact_differs.append(path)
    assert not exact_differs, f"figures compared exactly differ across CPU kinds: {exact_differs[:5]}"
    assert TRAINER_RTOL / 2 <= worst <= TRAINER_RTOL, f"largest cross-CPU difference {worst:.2e} vs rtol {TRAINER_RTOL}"
