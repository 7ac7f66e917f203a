"""Suite-wide set-up.

- The environment ``make test`` exports (Makefile), set here too when absent, so that a bare ``pytest`` runs the
  suite as CI does: without HF_HUB_OFFLINE the paper-backbone tests of tests/test_models.py wait ~45 s each on
  the hub (huggingface_hub reads the variable once, when it is first imported, before those tests set it).
- Under pytest-xdist (``make test`` runs TEST_WORKERS=2 processes) each worker takes one torch thread: two
  workers with two OpenMP threads each on two cores spin for each other (one thread beats two on a
  busy machine, as conf/experiment/smoke.yaml measured). Tests that need another count set it themselves, as before.
- Each distinct configuration of conf/ is composed once per session. ``unifiedplayers.config.compose`` takes
  0.3-1 s (Hydra reads and merges every file), and the tests ask for the same few configurations hundreds of
  times (``experiment=tiny`` alone a dozen). Every caller gets its own deep copy of the composed config (callers
  may change theirs), a composition that fails is not kept (it fails again, with the same error, each time),
  and another config directory or a ``hydra.*`` override (a search path into a temporary copy) is composed
  every time. Subprocesses (the CLI tests) compose for themselves, as always.
- The heaviest test files come first (tests/file_seconds.json, measured; tests/file_seconds.py remakes it): ``make
  test`` hands whole files to its workers in collection order (``--dist loadfile --no-loadscope-reorder``), and a
  heavy file handed out last kept one worker busy minutes after the other had run out of work.
- The first lines name the machine (CPU, bf16 flags, cores, torch and its threads, Python, GPUs;
  ``unifiedplayers.machine``), so that a red CI log can be traced to its machine; ``-q`` (``make test``)
  hides pytest's header, so the line is written there too.
- Under ``UNIFIEDPLAYERS_NO_SKIPS=1`` (``make test-vllm`` sets it) a skip is a failure, at collection too: the vLLM
  tests skip where vllm is not importable, which must never pass for a green run of the environment built for them.
"""
from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path

import pytest

for _key, _value in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)

import unifiedplayers.config as _config  # noqa: E402

_compose = _config.compose
_composed: dict = {}


def _compose_once(overrides=(), config_dir=None, config_name="config"):
    overrides = list(overrides)
    if config_dir is not None or any(o.lstrip("+~").startswith("hydra") for o in overrides):
        return _compose(overrides, config_dir, config_name)
    key = (tuple(overrides), config_name)
    if key not in _composed:
        _composed[key] = _compose(overrides, config_dir, config_name)
    else:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()  # as a composition leaves it
    return copy.deepcopy(_composed[key])


_compose_once.__doc__ = _compose.__doc__
_config.compose = _compose_once


def _machine_lines(config) -> list[str]:
    from unifiedplayers.machine import machine_info, machine_line

    line = f"machine: {machine_line(machine_info())}"
    workers = getattr(config.option, "numprocesses", None)
    return [line + (f"; each of the {workers} xdist workers takes 1 torch thread" if workers else "")]


def pytest_report_header(config):
    return _machine_lines(config)


def pytest_sessionstart(session):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not reporter.showheader and not os.environ.get("PYTEST_XDIST_WORKER"):
        for line in _machine_lines(session.config):
            reporter.write_line(line)


NO_SKIPS = "UNIFIEDPLAYERS_NO_SKIPS"


def _skip_is_a_failure(report) -> None:
    if report.skipped and os.environ.get(NO_SKIPS) == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{report.nodeid} skipped under {NO_SKIPS}=1 (make test-vllm), where a skip fails: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _skip_is_a_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_is_a_failure(outcome.get_result())


def pytest_collection_modifyitems(config, items):
    """Heaviest files first (longest processing time first), each file's tests in their own order; every xdist
    worker collects the same order, as it must."""
    from tests.file_seconds import DEFAULT_SECONDS, load

    seconds = load()
    rank = {}
    for n, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        rank.setdefault(path, (-seconds.get(path, DEFAULT_SECONDS), n))
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.fixture()
def example_copy(tmp_path, monkeypatch):
    """``example_copy(name, module)``: ``examples/<name>`` copied out of the repository (as a user's own project) and
    put on ``sys.path``; its ``module`` is forgotten afterwards, so the next test imports it afresh."""
    modules = []

    def copy_out(name: str, module: str) -> Path:
        dst = tmp_path / "my_project"
        shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / name, dst)
        monkeypatch.syspath_prepend(str(dst))
        modules.append(module)
        return dst

    yield copy_out
    for module in modules:
        sys.modules.pop(module, None)
