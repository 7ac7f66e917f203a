"""The cost of a paper table before it is run (ablations/plan.py): every member of the sweep is planned with its own
config, and the table's total is the sum of its members' GPU-hours."""
from __future__ import annotations

import pytest

from ablations.plan import main, table_plans
from unifiedplayers.capacity import Hardware

pytestmark = pytest.mark.cpu


def test_table5_plans_each_member_with_its_own_config(capsys):
    plans = dict(table_plans("table5", "paper", Hardware()))
    assert len(plans) == 6
    full, single = plans["seed=0"], plans["schedule.outer_iterations=1,seed=0"]
    # One outer iteration of three: a third of the updates, so a third of the FLOPs.
    assert single.total_flops == pytest.approx(full.total_flops / 3)
    assert sum(single.updates.values()) * 3 == sum(full.updates.values())
    assert main(["table5"]) == 0
    out = capsys.readouterr().out
    total = sum(p.gpu_hours for p in plans.values())
    assert f"total: {total:.0f} GPU-hours" in out


def test_table3_frozen_players_cost_less_than_trained_ones():
    plans = dict(table_plans("table3", "paper", Hardware()))
    assert len(plans) == 15  # 4 configurations x 3 seeds + the stale control on 3 seeds
    both = plans["schedule.train_evaluation=True,schedule.train_planning=True,seed=0"]
    neither = plans["schedule.train_evaluation=False,schedule.train_planning=False,seed=0"]
    assert set(both.updates) == {"planning", "execution", "evaluation"} and set(neither.updates) == {"execution"}
    assert neither.gpu_hours < both.gpu_hours


def test_an_unknown_table_is_refused():
    with pytest.raises(SystemExit):
        main(["table99"])
