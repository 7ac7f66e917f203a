"""The CPU half of the GPU check (benchmarks/gpu_check.py) and its Qwen3-4B shape.

The check itself is meant for a lent GPU machine (experiments/gpu_check.sh); here it runs on the 2-layer toy
shape on CPU, end to end in a subprocess as it runs there, and the 4B architecture is checked on the meta
device (no memory allocated).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_qwen3_4b_shape_on_the_meta_device():
    gc = _module()
    config = gc.qwen3_config("qwen3_4b")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (2560, 9728, 36)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (32, 8, 128)
    assert config.vocab_size == 151936 and config.tie_word_embeddings
    assert config.max_position_embeddings == 32768 and config.rms_norm_eps == 1e-6
    n = gc.count_parameters(config)
    # 151936 x 2560 tied embeddings + 36 x 100,930,816 per layer + the final norm: Qwen3-4B's "4.0B".
    assert n == 4_022_468_096
    assert 3.9e9 < n < 4.1e9
    # The resume check's 2-layer cut keeps the width and the vocabulary.
    assert gc.count_parameters(gc.qwen3_config("qwen3_4b", num_layers=2)) == 388_956_160 + 2 * 100_930_816 + 2560


@pytest.mark.slow
@pytest.mark.cpu
def test_cpu_half_runs_and_resumes_exactly(tmp_path):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--shape", "tiny", "--steps", "2", "--backends", "torch",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    for key in ("device", "shape", "runs", "generation_tokens_per_s", "time_split_s", "peak_memory_bytes",
                "resume", "resume_check", "sandbox", "deepspeed", "vllm", "wall_s"):
        assert key in report, key
    assert set(report["time_split_s"]) == {"generation", "sandbox", "logprob_passes", "update"}
    assert report["generation_tokens_per_s"] > 0
    assert report["peak_memory_bytes"] > 0 and report["peak_memory_kind"] == "ru_maxrss"
    runs = report["runs"]
    assert [(r["backend"], r["player"], r["status"]) for r in runs] == [
        ("torch", p, "ok") for p in ("planning", "execution", "evaluation")]
    for r in runs:
        assert len(r["steps"]) == 2
        for step in r["steps"]:
            assert step["generated_tokens"] == 4 * 4 * 24  # 4 prompts x 4 samples x 24 tokens, eos ignored
            assert step["logprob_s"] > 0 and step["update_s"] > 0
    assert report["resume_check"] == "PASS"
    resume = report["resume"]["torch"]
    assert resume["status"] == "PASS" and resume["bitwise_equal"] and resume["max_abs_diff"] == 0.0
    assert resume["step_changed_weights_by"] > 0 and resume["checksum"][0] == resume["checksum"][1]
    # The sandbox either ran the Execution player's 2 x 16 programs or says why it could not start.
    assert report["sandbox"]["status"] in ("ran", "failed to start")
    if report["sandbox"]["status"] == "ran":
        assert report["sandbox"]["programs"] == 32
    assert report["vllm"]["status"] == "not run"
    assert "vLLM: not run" in proc.stdout and "resume check: PASS" in proc.stdout
    print(f"CPU half: {seconds:.1f} s, script wall {report['wall_s']} s")  # target: under 60 s on 2 shared cores
