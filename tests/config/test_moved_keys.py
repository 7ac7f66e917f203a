"""Keys that moved into a method's own settings (``config.MOVED_KEYS``): ``method.tool_bonus`` (Agent0) and
``method.teacher_endpoint`` / ``method.teacher_model`` (Socratic-Zero) now live in ``method.extra``. The old keys
stay an alias: on the command line they are read as the new ones with one warning naming the new key, and a run
directory written with them resumes under the new ones (and the other way round)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from unifiedplayers.config import MOVED_KEYS, compose, moved_key_overrides
from unifiedplayers.loop.run_state import STATE_FILE, check_resumable, result_config, saved_state
from unifiedplayers.methods import build_method

pytestmark = pytest.mark.cpu

TEACHER = "http://127.0.0.1:9/v1"  # nobody listens: building the method sends nothing
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}


def moved(overrides):
    """(overrides as read, the warnings given)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = moved_key_overrides(overrides)
    return out, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_an_old_key_is_written_as_its_new_one_with_one_warning_naming_it():
    assert set(MOVED_KEYS) == {"method.tool_bonus", "method.teacher_endpoint", "method.teacher_model"}
    out, said = moved(["method=agent0", "method.tool_bonus=0.1", "+method.teacher_model=judge", "seed=1"])
    assert out == ["method=agent0", "method.extra.tool_bonus=0.1", "+method.extra.teacher_model=judge", "seed=1"]
    assert len(said) == 2 and "method.extra.tool_bonus" in said[0] and "method.extra.teacher_model" in said[1]
    assert moved(["method.extra.tool_bonus=0.1", "method=agent0"]) == (["method.extra.tool_bonus=0.1", "method=agent0"],
                                                                     [])  # the new keys: no warning


def test_an_old_key_on_the_command_line_sets_the_methods_setting():
    with pytest.warns(FutureWarning, match="method.extra.tool_bonus"):
        cfg = compose(["method=agent0", "method.tool_bonus=0.125"])
    assert cfg.method.extra.tool_bonus == 0.125 and "tool_bonus" not in cfg.method
    assert build_method(cfg).settings.tool_bonus == 0.125
    with pytest.warns(FutureWarning, match="method.extra.teacher_"):
        cfg = compose(["method=socratic_zero", f"method.teacher_endpoint={TEACHER}", "method.teacher_model=judge"])
    assert (cfg.method.extra.teacher_endpoint, cfg.method.extra.teacher_model) == (TEACHER, "judge")
    settings = build_method(cfg).settings
    assert (settings.teacher_endpoint, settings.teacher_model) == (TEACHER, "judge")


def test_an_old_key_on_the_train_command_line():
    proc = subprocess.run([sys.executable, "-m", "unifiedplayers.train", "experiment=tiny", "method=agent0",
                           "method.tool_bonus=0.125", "--cfg", "job"], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tool_bonus: 0.125" in proc.stdout and "FutureWarning" in proc.stderr
    assert proc.stderr.count("is an old name of method.extra.tool_bonus") == 1


def old_schema(flat: dict, **old) -> dict:
    """A run's stored config as the schema before the move wrote it: the old keys for every method."""
    keys = {"method.tool_bonus": 0.0, "method.teacher_endpoint": None, "method.teacher_model": None, **old}
    return {**{k: v for k, v in flat.items() if k not in {MOVED_KEYS[o][0] for o in MOVED_KEYS}}, **keys}


@pytest.mark.parametrize("method,overrides,old", [
    ("agent0", [], {"method.tool_bonus": 0.05}),
    ("socratic_zero", [f"method.extra.teacher_endpoint={TEACHER}", "method.extra.teacher_model=judge"],
     {"method.teacher_endpoint": TEACHER, "method.teacher_model": "judge"}),
    ("unifiedplayers", [], {}),
])
def test_a_run_stored_with_the_old_keys_resumes_with_the_new_ones(method, overrides, old, tmp_path):
    cfg = compose(["experiment=tiny", f"method={method}", "resume=true", *overrides])
    stored = old_schema(result_config(cfg), **old)
    torch.save({"completed": 1, "total_updates": 4, "world_size": 1, "config": stored}, tmp_path / STATE_FILE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert saved_state(tmp_path, cfg, 1)["completed"] == 1
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert len(said) == len(old) and all(MOVED_KEYS[k][0] in m for k, m in zip(old, said))  # old defaults: silent


def test_a_moved_setting_that_differs_still_refuses_the_resume(tmp_path):
    cfg = compose(["experiment=tiny", "method=agent0"])
    stored = old_schema(result_config(cfg), **{"method.tool_bonus": 0.1})
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"method.extra.tool_bonus: 0.1 -> 0.05"):
        check_resumable({"config": stored}, cfg, tmp_path, 1)


def test_a_run_stored_with_the_new_keys_resumes_with_the_old_ones_on_the_command_line(tmp_path):
    stored = result_config(compose(["experiment=tiny", "method=socratic_zero",
                                    f"method.extra.teacher_endpoint={TEACHER}", "method.extra.teacher_model=judge"]))
    with pytest.warns(FutureWarning, match="method.extra.teacher_"):
        cfg = compose(["experiment=tiny", "method=socratic_zero", f"method.teacher_endpoint={TEACHER}",
                       "method.teacher_model=judge"])
    check_resumable({"config": stored}, cfg, tmp_path, 1)
    agent0 = compose(["experiment=tiny", "method=agent0", "method.extra.tool_bonus=0.1"])
    with pytest.warns(FutureWarning, match="method.extra.tool_bonus"):
        check_resumable({"config": result_config(agent0)}, compose(["experiment=tiny", "method=agent0",
                                                                     "method.tool_bonus=0.1"]), tmp_path, 1)
