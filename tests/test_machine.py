"""Where a run ran (``unifiedplayers.machine``): the record of this machine, and a tiny run that writes it
into its ``config.yaml`` and summary with its sandbox's isolation, a layer switched off being a warning."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from unifiedplayers.config import compose
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.machine import cpuinfo_field, earlier_starts, machine_info, machine_line
from unifiedplayers.sandbox import IsolationWarning

pytestmark = pytest.mark.cpu

CPUINFO = Path("/proc/cpuinfo")


def _first_cpu_flags() -> set[str]:
    """The first CPU's flags, read here without ``unifiedplayers.precision``."""
    line = next(x for x in CPUINFO.read_text().splitlines() if x.startswith("flags"))
    return set(line.split(":", 1)[1].split())


def test_machine_info_has_every_field_of_this_machine():
    info = machine_info()
    assert set(info) == {"cpu", "cpu_vendor", "bf16_flags", "cores", "cores_usable", "torch", "torch_threads",
                         "python", "gpus"}
    assert info["cores"] == os.cpu_count() and 1 <= info["cores_usable"] <= info["cores"]
    assert info["torch"] == torch.__version__ and info["torch_threads"] == torch.get_num_threads()
    assert info["python"] == platform.python_version()
    assert info["gpus"] == ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                            if torch.cuda.is_available() else [])
    assert info["cpu"] and info["cpu_vendor"]
    line = machine_line(info)
    for part in (info["cpu"], f"torch {info['torch']}", f"{info['torch_threads']} thread(s)", f"{info['cores']} cores"):
        assert part in line


@pytest.mark.skipif(not CPUINFO.exists(), reason="no /proc/cpuinfo (not Linux)")
def test_cpu_model_and_bf16_flags_match_proc_cpuinfo():
    info = machine_info()
    model = next((x.split(":", 1)[1].strip() for x in CPUINFO.read_text().splitlines() if x.startswith("model name")),
                 None)
    if model is not None:
        assert info["cpu"] == model
    assert info["bf16_flags"] == sorted(_first_cpu_flags() & {"amx_bf16", "avx512_bf16"})
    flags = ", ".join(info["bf16_flags"]) or "none (bf16 emulated)"
    assert f"bf16 flags: {flags}" in machine_line(info)


def test_cpuinfo_field_and_earlier_starts_of_odd_files(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\n")
    assert cpuinfo_field("model name", str(tmp_path / "cpuinfo")) == "Intel(R) Xeon(R)"
    assert cpuinfo_field("vendor_id", str(tmp_path / "cpuinfo")) == "GenuineIntel"
    assert cpuinfo_field("model name", str(tmp_path / "missing")) is None
    assert earlier_starts(tmp_path / "missing.yaml") == []
    (tmp_path / "old.yaml").write_text("seed: 0\n")  # a run of an earlier version: no machine entries
    assert earlier_starts(tmp_path / "old.yaml") == []
    (tmp_path / "broken.yaml").write_text("machine: [\n")
    assert earlier_starts(tmp_path / "broken.yaml") == []


def test_a_run_records_its_machine_and_a_switched_off_layer_with_a_warning(tmp_path):
    """A tiny run with Landlock switched off: config.yaml's ``machine`` holds this machine and the layer missing
    with its reason, a warning names it at start-up, and the summary prints both."""
    warned = r"layer 'landlock' is missing \(switched off by sandbox.landlock=false\)"
    with pytest.warns(IsolationWarning, match=warned):
        OuterLoop(compose(["experiment=tiny", "sandbox.landlock=false"]), tmp_path).run()
    (start,) = OmegaConf.to_container(OmegaConf.load(tmp_path / "config.yaml").machine)
    assert start["from_update"] == 0
    assert {k: start[k] for k in ("cpu", "bf16_flags", "torch", "python")} == \
        {k: machine_info()[k] for k in ("cpu", "bf16_flags", "torch", "python")}
    isolation = start["sandbox_isolation"]
    assert isolation["missing"]["landlock"] == "switched off by sandbox.landlock=false"
    assert "landlock" not in isolation["present"]
    if os.geteuid() == 0:  # this machine gives the other layers
        assert isolation["present"] == ["netns", "uid", "tmpfs"] and list(isolation["missing"]) == ["landlock"]
    text = (tmp_path / "summary.md").read_text()
    assert f"machine: {machine_line(start)}" in text
    assert "sandbox isolation: " in text and "MISSING landlock: switched off by sandbox.landlock=false" in text


def _fake_nvidia_smi(folder: Path, driver: str = "535.104.05") -> Path:
    """An ``nvidia-smi`` that lists one A100 on ``driver``, as the real one answers the query of
    :func:`unifiedplayers.machine.nvidia_smi_gpus`."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "NVIDIA A100-SXM4-80GB, {driver}"\n')
    tool.chmod(0o755)
    return tool


def test_a_gpu_torch_cannot_use_is_named_with_the_driver_and_what_to_install(tmp_path):
    from unifiedplayers.machine import gpu_unusable, nvidia_smi_gpus

    gpus = nvidia_smi_gpus(str(_fake_nvidia_smi(tmp_path)))
    assert gpus == [("NVIDIA A100-SXM4-80GB", "535.104.05")]
    assert nvidia_smi_gpus(str(tmp_path / "absent")) == []
    old = gpu_unusable(gpus, False, "2.13.0+cu130", "13.0")
    assert "driver 535.104.05" in old and "CUDA 13.0" in old and "580" in old and "forward-compatibility" in old
    cpu = gpu_unusable(gpus, False, "2.13.0+cpu", None)
    assert "CPU build" in cpu and "torch==2.13.0" in cpu and "535.104.05" in cpu
    hidden = gpu_unusable([("NVIDIA H100", "580.65.06")], False, "2.13.0+cu130", "13.0")
    assert "new enough" in hidden and "CUDA_VISIBLE_DEVICES" in hidden and "580.65.06" in hidden
    assert gpu_unusable(gpus, True, "2.13.0+cu130", "13.0") is None  # torch uses them
    assert gpu_unusable([], False, "2.13.0+cpu", None) is None  # no GPU: nothing to say
    assert "12.4" in gpu_unusable([("NVIDIA V100", "470.82.01")], False, "2.5.0+cu124", "12.4")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no GPU")
def test_a_gpu_preset_stops_before_any_model_loads_when_torch_cannot_use_the_gpu(tmp_path):
    """``experiment=paper_qwen3_4b`` on a node whose nvidia-smi lists a GPU that this torch (the CPU build here) cannot
    use: the command stops at once with the driver, the build and what to install, and writes nothing."""
    import subprocess
    import sys

    from unifiedplayers.distributed import without_rendezvous

    _fake_nvidia_smi(tmp_path / "bin")
    env = without_rendezvous({**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    out = subprocess.run([sys.executable, "-m", "unifiedplayers.train", "experiment=paper_qwen3_4b",
                          f"run_dir={tmp_path / 'run'}", "model.path=/models/nowhere"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "model.device=cuda: nvidia-smi lists 1 GPU(s) (NVIDIA A100-SXM4-80GB, driver 535.104.05)" in out.stderr
    assert "CPU build" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "run").exists()
