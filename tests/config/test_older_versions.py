"""A config or run directory of an older version of this code is refused, with a message that says what to do.

A method's own settings live in ``method.extra`` (Agent0's ``tool_bonus``, Socratic-Zero's ``teacher_endpoint`` and
``teacher_model``); a key written under ``method.`` itself is refused naming its place there. A run whose stored
config holds keys this version does not have is refused with "start a new run" (a phase.pt of an older version:
``tests/loop/test_phase_state.py``)."""
from __future__ import annotations

import pytest
import torch

from unifiedplayers import rundir
from unifiedplayers.config import compose
from unifiedplayers.loop.run_state import check_resumable, result_config, saved_state

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("method,key", [("agent0", "tool_bonus"), ("socratic_zero", "teacher_model")])
def test_a_methods_setting_outside_method_extra_is_refused_naming_its_place(method, key):
    with pytest.raises(ValueError, match=rf"method\.{key}: unknown key.*method\.extra\.{key}=\.\.\."):
        compose([f"method={method}", f"method.{key}=0.1"])
    with pytest.raises(ValueError, match=r"schedule\.tool_bonus: unknown key") as err:  # only method's keys
        compose(["schedule.tool_bonus=0.1"])
    assert "method.extra" not in str(err.value)


def test_a_run_stored_with_keys_this_version_lacks_is_refused_saying_to_start_a_new_run(tmp_path):
    cfg = compose(["experiment=tiny", "method=agent0", "resume=true"])
    stored = {**result_config(cfg), "method.tool_bonus": 0.0, "method.teacher_model": "judge"}
    torch.save({"completed": 1, "total_updates": 4, "world_size": 1, "config": stored, "format": rundir.RUN_FORMAT},
               tmp_path / rundir.STATE)
    with pytest.raises(ValueError, match=r"written by an older version of this code: its config has keys this "
                                         r"version does not \(method\.teacher_model, method\.tool_bonus\).*"
                                         r"start a new run in another run_dir"):
        saved_state(tmp_path, cfg, 1)


@pytest.mark.parametrize("stored", [{}, {"format": rundir.RUN_FORMAT - 1}, {"format": rundir.RUN_FORMAT + 1}])
def test_a_run_of_another_format_is_refused_saying_to_start_a_new_run(tmp_path, stored):
    """A state.pt without this version's run format (an older run's names its metrics differently) is not resumed,
    though its config is this version's."""
    cfg = compose(["experiment=tiny", "resume=true"])
    torch.save({"completed": 1, "total_updates": 4, "world_size": 1, "config": result_config(cfg), **stored},
               tmp_path / rundir.STATE)
    format_then = stored.get("format", 1)
    with pytest.raises(ValueError, match=rf"written by another version of this code \(run format {format_then}; this "
                                         rf"version writes format {rundir.RUN_FORMAT}.*start a new run in another run_dir"):
        saved_state(tmp_path, cfg, 1)
    torch.save({"completed": 1, "total_updates": 4, "world_size": 1, "config": result_config(cfg),
                "format": rundir.RUN_FORMAT}, tmp_path / rundir.STATE)
    assert saved_state(tmp_path, cfg, 1)["completed"] == 1  # this version's format resumes


def test_a_changed_setting_is_still_a_different_config_not_an_older_version(tmp_path):
    stored = result_config(compose(["experiment=tiny", "method=agent0", "method.extra.tool_bonus=0.1"]))
    cfg = compose(["experiment=tiny", "method=agent0", "method.extra.tool_bonus=0.2"])
    with pytest.raises(ValueError, match=r"different config \(method\.extra\.tool_bonus: 0\.1 -> 0\.2\)"):
        check_resumable({"config": stored}, cfg, tmp_path, 1)
    check_resumable({"config": result_config(cfg)}, cfg, tmp_path, 1)  # the same config resumes
