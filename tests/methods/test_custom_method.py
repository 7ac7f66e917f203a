"""The worked extension examples/custom_method/ (a method outside the package: one Python file, one YAML),
run from a copy outside the repository, as a researcher would."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.cpu



@pytest.fixture()
def copy(example_copy):
    return example_copy("custom_method", "tool_curious")


def compose_with(copy, overrides):
    from unifiedplayers.config import compose

    return compose([f"hydra.searchpath=[file://{copy}/conf]", *overrides])


def test_the_example_method_changes_the_planning_reward_only(copy):
    from unifiedplayers.methods import build_method

    method = build_method(compose_with(copy, ["experiment=tiny", "method=tool_curious"]))
    assert type(method).__name__ == "ToolCurious" and method.settings.tool_bonus == 0.1
    # Eq. 2 gives 0.5 and 0.25; tool calls [3, 1, 0, 2] (capped at C = 2: 2, 1, 0, 2, mean 1.25) and [0, 0]:
    # bonus 0.1 · 1.25 = 0.125 and 0 -> 0.625 and 0.25. Execution rewards (Eq. 4) pass unchanged.
    fbs = [SimpleNamespace(terms=SimpleNamespace(planning=0.5, execution=[1.0, 0.0, 0.0, 1.0]),
                           tool_calls=[3, 1, 0, 2], settings=method.settings),
           SimpleNamespace(terms=SimpleNamespace(planning=0.25, execution=[0.0, 1.0]), tool_calls=[0, 0],
                           settings=method.settings)]
    assert method.source("planning").over(fbs) == pytest.approx([0.625, 0.25])
    assert [list(r) for r in method.source("execution").over(fbs)] == [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0]]
    # b = 0.2 in the settings: 0.5 + 0.2 · 1.25 = 0.75
    doubled = build_method(compose_with(copy, ["experiment=tiny", "method=tool_curious",
                                               "method.extra.tool_bonus=0.2"]))
    fbs[0].settings = doubled.settings
    assert doubled.source("planning")(fbs[0]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown key"):
        build_method(compose_with(copy, ["experiment=tiny", "method=tool_curious", "+method.extra.bonus=1"]))


def test_an_unknown_method_fails_at_start_up_naming_the_known_ones():
    from unifiedplayers.config import compose
    from unifiedplayers.methods import build_method

    with pytest.raises(ValueError, match=r"not a registered method; known: .*r_zero"):
        build_method(compose(["experiment=tiny", "method.name=r_zer0"]))


@pytest.mark.slow
def test_the_example_trains_from_a_copy_outside_the_repository(copy, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "unifiedplayers.train", "experiment=smoke", "model=tiny_random", "method=tool_curious",
           f"hydra.searchpath=[file://{copy}/conf]", f"run_dir={run_dir}", "logger=none",
           "schedule.print_summary=false"]
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "_target_: tool_curious.ToolCurious" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "summary.json").is_file() and (run_dir / "records.jsonl").read_text().strip()
