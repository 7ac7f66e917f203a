"""The one-GPU preset's unit of the GPU check (``benchmarks/gpu_check_lora.py``, ``--backends one_gpu_lora``) rehearsed
on CPU: on the toy shape every item that can run on a CPU passes (peak memory: the plan's figure, not measured); with
bugs planted (each player on a deep copy of the backbone, an optimizer step that moves the backbone) the items that
guard against them fail; the GPU-only verdicts (memory against the plan, memory_allocated after the build) decide
as they should on made-up measurements; and the unit's Qwen3-1.7B shape is the one the capacity plan reads.

The unit runs in this process (``gpu_check.main``): a subprocess would pay for torch and transformers again. The file
takes 13-25 s on one thread of a 2-core machine shared with another test run (the clean run 10-21 s of it).
"""
from __future__ import annotations

import copy
import json
import os
import re
import time

import pytest
import torch

from benchmarks import gpu_check, gpu_check_common, gpu_check_lora

pytestmark = pytest.mark.cpu

UNIT = gpu_check_lora.LoraUnit.NAME
ITEMS = gpu_check_lora.LoraUnit.ITEMS
NOT_CHECKED = gpu_check_lora.LoraUnit.NOT_CHECKED


def _run(tmp_path, monkeypatch, capsys, *extra: str) -> tuple[int, dict[str, str], dict, float]:
    """The unit on CPU, tiny shape: (exit code, ``{item: the text after "one_gpu_lora <item>: "}``, the JSON report,
    seconds)."""
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):  # main sets them if unset
        monkeypatch.setenv(name, os.environ.get(name, value))
    t0 = time.perf_counter()
    code = gpu_check.main(["--device", "cpu", "--shape", "tiny", "--backends", UNIT, "--threads", "0",
                           "--out", str(tmp_path), *extra])
    seconds = time.perf_counter() - t0
    stdout = capsys.readouterr().out
    names = "|".join(re.escape(n) for n in (*ITEMS, *NOT_CHECKED))
    lines = {m.group(1): m.group(2) for m in re.finditer(rf"^{UNIT} ({names}): (.*)$", stdout, re.M)}
    return code, lines, json.loads((tmp_path / "gpu_check.json").read_text()), seconds


def test_the_unit_on_cpu_passes_every_item_that_runs_there(tmp_path, monkeypatch, capsys):
    code, lines, report, seconds = _run(tmp_path, monkeypatch, capsys)
    assert code == 0, lines
    for item in ITEMS[:-1]:
        assert lines[item].startswith("PASS ("), (item, lines.get(item))
    assert re.match(r"NOT RUN \(not measured on CPU; the plan for one GPU: \d+\.\d+ GiB .* at its "
                    r"'(no-grad|forward|backward|step) \(\w+\)' instant\)$", lines["peak_memory"]), lines["peak_memory"]
    for name in NOT_CHECKED:
        assert lines[name].startswith("NOT CHECKED (")
    assert report["lora_check"] == "PASS" and report["paper_check"] == "not run"
    unit = report[UNIT]
    assert unit["shape"] == "tiny" and unit["trained"] == list(gpu_check_common.PLAYERS)
    assert unit["settings"]["backend"] == "torch" and unit["settings"]["lora"]["rank"] == 16
    assert unit["settings"]["ref_mode"] == "precompute" and unit["settings"]["gradient_checkpointing"]
    items = unit["items"]
    shared = items["shared_backbone"]
    assert shared["shared"] and shared["held_bytes"] == shared["backbone_bytes"] + shared["adapter_bytes"]
    assert shared["adapter_bytes"] == 3 * 4 * shared["players"]["planning"]["adapter_parameters"]
    steps = items["grpo_steps"]["players"]
    assert all(p["kl"][0] == 0.0 and p["adapter_moved_by"] > 0 for p in steps.values())
    resume = items["exact_resume"]
    assert resume["adapter_only"] and resume["bitwise_equal"] and resume["loss"][0] == resume["loss"][1]
    plan = items["peak_memory"]
    assert plan["plan_parameters"] == unit["parameters"]  # the plan's backbone is the one the unit built
    assert plan["plan_adapter_parameters"] == shared["players"]["execution"]["adapter_parameters"]
    print(f"one_gpu_lora on CPU: {seconds:.1f} s")


def test_planted_bugs_fail_the_items_that_guard_against_them(tmp_path, monkeypatch, capsys):
    """Each player built on a deep copy of the backbone (not ``lora.share_base``), and an optimizer step that also
    moves a frozen tensor: shared_backbone and grpo_steps FAIL, the exit status is 1; the log-probs before any
    update are still the backbone's (a copy computes what it computes)."""
    from unifiedplayers import lora
    from unifiedplayers.trainer.torch_backend import TorchTrainer

    step = TorchTrainer._step

    def step_moving_the_backbone(self):
        norm = step(self)
        with torch.no_grad():
            next(p for p in self._model.parameters() if not p.requires_grad).add_(1e-3)
        return norm

    monkeypatch.setattr(lora, "share_base", copy.deepcopy)
    monkeypatch.setattr(TorchTrainer, "_step", step_moving_the_backbone)
    code, lines, report, _ = _run(tmp_path, monkeypatch, capsys, "--players", "execution")
    assert code == 1, lines
    assert lines["shared_backbone"].startswith("FAIL (NOT the backbone's tensors: planning 0 of "), lines
    assert lines["grpo_steps"].startswith("FAIL (") and "the backbone changed" in lines["grpo_steps"], lines
    assert lines["initial_logprobs"].startswith("PASS ("), lines
    assert report["lora_check"] == "FAIL"


def test_the_gpu_verdicts_on_made_up_measurements(capsys):
    """What only a GPU measures, decided and printed from made-up figures: the peak against the plan's band, and
    memory_allocated after the build against one backbone and three adapters."""
    plan = {"instant": "backward (execution)", "plan_bytes": 12 * 2**30, "compared_bytes": 10 * 2**30,
            "items": {}, "plan_parameters": 1, "plan_adapter_parameters": 1, "gpu_memory_bytes": 80 * 2**30}

    def parts(peak: float) -> dict:
        steps = [{"passes_peak_bytes": peak, "generation_peak_bytes": 3 * 2**30}]
        return {"plan": plan, "block execution": {"steps": steps}}

    verdicts = {peak: gpu_check_lora.memory_item(parts(peak * 2**30), ["execution"], cuda=True)["status"]
                for peak in (4.9, 5.1, 10.0, 10.9, 11.1)}
    assert verdicts == {4.9: "FAIL", 5.1: "PASS", 10.0: "PASS", 10.9: "PASS", 11.1: "FAIL"}
    built = {"shared": True, "held_bytes": 100, "expected_bytes": 100, "backbone_bytes": 97, "adapter_bytes": 3,
             "backbone_storages": 5, "players": {"planning": {"adapter_parameters": 1}}}
    shared = {n: gpu_check_lora.shared_item({"build": built, "trainers": {"allocated_bytes": n}}, cuda=True)["status"]
              for n in (94, 96, 104, 106, 300)}
    assert shared == {94: "FAIL", 96: "PASS", 104: "PASS", 106: "FAIL", 300: "FAIL"}
    unit = {"status": "ran", "shape": "qwen3_1_7b", "parameters": 1_720_574_976, "dtype": "bfloat16",
            "peft": "0.21.2", "items": {
                "shared_backbone": gpu_check_lora.shared_item({"build": built, "trainers": {"allocated_bytes": 300}},
                                                              cuda=True),
                "initial_logprobs": {"status": "NOT RUN", "reason": "made up"},
                "grpo_steps": {"status": "NOT RUN", "reason": "made up"},
                "exact_resume": {"status": "NOT RUN", "reason": "made up"},
                "peak_memory": gpu_check_lora.memory_item(parts(11.5 * 2**30), ["execution"], cuda=True)}}
    gpu_check_lora.LoraUnit.print_items(unit)
    out = capsys.readouterr().out
    assert "shared_backbone: FAIL (every frozen tensor of each player is the backbone's" in out
    assert "memory_allocated after the build" in out and "x 3.000 of that, PASS within 5%" in out
    assert re.search(r"peak_memory: FAIL \(max_memory_allocated over the trainer's passes 11\.50 GiB vs the plan's "
                     r"10\.00 GiB \(12\.00 GiB with the CUDA context\) at its 'backward \(execution\)' instant: "
                     r"x 1\.15, PASS within x 0\.5 \.\. x 1\.1; the plan's trainer-pass instants only: the check "
                     r"samples with the hf engine \(its peak 3\.00 GiB, not compared\)", out), out


def test_the_units_shape_is_the_one_gpu_presets_backbone():
    """``qwen3_1_7b`` (from conf/model/arch/qwen3_1_7b_base.json) on the meta device: the parameters the capacity
    plan counts for experiment=one_gpu's model; other shapes run the unit on it, the toy on itself."""
    from unifiedplayers.capacity import model_arch
    from unifiedplayers.config import compose

    config = gpu_check_common.qwen3_config("qwen3_1_7b")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (2048, 6144, 28)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (16, 8, 128)
    assert config.vocab_size == 151936 and config.tie_word_embeddings
    n = gpu_check_common.count_parameters(config)
    assert n == model_arch(compose(["experiment=one_gpu"]).model).parameters == 1_720_574_976
    assert [gpu_check_lora.unit_shape(s) for s in ("qwen3_4b", "qwen3_1_7b", "tiny")] == ["qwen3_1_7b"] * 2 + ["tiny"]
