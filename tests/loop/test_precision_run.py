"""Precision ``auto`` in a run: resolved once at the start, stored with its reason, kept on resume; bf16 runs sample
from the bf16 copy; the on-policy mismatch reaches metrics.jsonl; ``trainer.recompute_old_logprobs`` both ways, and
over every minibatch of a phase.

The CPU flags are patched (``unifiedplayers.precision.cpu_flags``), so the tests hold on any machine.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf

from unifiedplayers import precision
from unifiedplayers.config import compose, role_trainer_config
from unifiedplayers.loop.outer import OuterLoop, StopRun
from unifiedplayers.loop.phase import Phase, load_phase_state
from unifiedplayers.models import load_model
from unifiedplayers.loop.run_state import check_resumable
from unifiedplayers.trainer import TrainSample, build_trainer

pytestmark = pytest.mark.cpu

AMX = frozenset({"avx2", "amx_bf16", "amx_tile"})
AVX2 = frozenset({"avx2", "fma"})


def _flags(monkeypatch, flags):
    monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": flags)


@pytest.mark.parametrize("flags, dtype, words", [
    (AMX, "bfloat16", "amx_bf16"),
    (frozenset({"avx512_bf16"}), "bfloat16", "avx512_bf16"),
    (AVX2, "float32", "emulated"),
])
def test_auto_picks_bf16_only_where_the_cpu_multiplies_it(monkeypatch, flags, dtype, words):
    _flags(monkeypatch, flags)
    chosen, why = precision.auto_dtype("cpu")
    assert chosen == dtype and words in why


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor : 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor : 1\n")
    assert precision.cpu_flags(str(tmp_path / "cpuinfo")) == {"fpu", "avx2", "amx_bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_presets_say_auto_and_tiny_random_stays_float32():
    assert compose(["experiment=smoke"]).model.dtype == "auto"
    assert compose(["experiment=smoke"]).trainer.dtype == "auto"
    assert compose(["experiment=tiny"]).model.dtype == "float32"
    assert compose(["experiment=tiny"]).trainer.dtype == "float32"
    for preset in ("paper_qwen3_4b", "paper_mimo_7b"):
        cfg = compose([f"experiment={preset}"])
        assert (cfg.model.dtype, cfg.trainer.dtype) == ("auto", "auto"), preset


def test_resolution_writes_the_reason_and_a_resume_keeps_the_stored_dtype(monkeypatch):
    _flags(monkeypatch, AMX)
    cfg = compose(["experiment=tiny", "model.dtype=auto", "trainer.dtype=auto"])
    reason = precision.resolve_run_precision(cfg)
    assert (cfg.model.dtype, cfg.trainer.dtype) == ("bfloat16", "bfloat16")
    assert "model.dtype=auto -> bfloat16: CPU has amx_bf16" in reason and cfg.precision_reason == reason
    stored = {"model.dtype": "float32", "trainer.dtype": "float32", "precision_reason": "CPU has neither"}
    again = compose(["experiment=tiny", "model.dtype=auto", "trainer.dtype=auto"])
    precision.resolve_run_precision(again, stored)  # another machine: the run keeps its float32
    assert (again.model.dtype, again.trainer.dtype) == ("float32", "float32")
    assert "resumed run" in again.precision_reason


def test_unknown_dtype_and_float16_on_the_torch_backend_fail_at_start_up(tmp_path):
    with pytest.raises(ValueError, match="model.dtype='bf16' is not one of"):
        OuterLoop(compose(["experiment=tiny", "model.dtype=bf16"]), tmp_path)
    with pytest.raises(ValueError, match="float16 training needs loss scaling"):
        OuterLoop(compose(["experiment=tiny", "trainer.dtype=float16"]), tmp_path)
    assert not any(tmp_path.iterdir())


def _stop_after(n):
    def hook(event, loop, slot):
        if event == "update_end" and loop.state.completed >= n:
            raise StopRun
    return hook


def test_auto_run_stores_its_dtype_and_resumes_with_it_on_a_bf16_machine(monkeypatch, tmp_path):
    """Also: config.yaml's ``machine`` holds one entry per start (the resume on "another machine" adds its own),
    and resuming on another machine is no config change."""
    _flags(monkeypatch, AVX2)
    overrides = ["experiment=tiny", "model.dtype=auto", "trainer.dtype=auto", "resume=true"]
    OuterLoop(compose(overrides), tmp_path, hooks=[_stop_after(1)]).run()
    stored = OmegaConf.load(tmp_path / "config.yaml")
    assert (stored.model.dtype, stored.trainer.dtype) == ("float32", "float32")
    assert "CPU has neither amx_bf16 nor avx512_bf16" in stored.precision_reason
    _flags(monkeypatch, AMX)  # "another machine": auto would now say bf16, the run keeps float32
    loop = OuterLoop(compose(overrides), tmp_path)
    loop.run()
    assert loop.finished and (loop.cfg.model.dtype, loop.cfg.trainer.dtype) == ("float32", "float32")
    assert all(p.dtype == torch.float32 for p in loop.players["planning"].model.parameters())
    resumed = OmegaConf.load(tmp_path / "config.yaml")  # the resume keeps the start's reason beside its own words
    assert "resumed run" in resumed.precision_reason and "CPU has neither amx_bf16" in resumed.precision_reason
    # Each start's machine (unifiedplayers.machine): the first start's beside the resume's, the last one current.
    starts = OmegaConf.to_container(resumed.machine)
    assert [(m["from_update"], m["bf16_flags"]) for m in starts] == [(0, []), (1, ["amx_bf16"])]
    assert starts[-1]["torch_threads"] == torch.get_num_threads()
    if os.geteuid() == 0 and sys.platform == "linux":  # every isolation layer, recorded at each start
        assert all(m["sandbox_isolation"] == {"mechanism": "root", "present": ["netns", "uid", "landlock", "tmpfs"],
                                                "missing": {}}
                   for m in starts)


def _rotary_buffers_of_every_live_model() -> dict[int, list[torch.dtype]]:
    """id -> dtypes of the rotary buffers (``inv_freq``, ``original_inv_freq``) of every model alive now."""
    found = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.nn.Module) and hasattr(obj, "inv_freq"):
            found[id(obj)] = [b.dtype for n, b in obj.named_buffers() if n.endswith("inv_freq")]
    return found


def test_a_bf16_run_samples_from_the_bf16_copy_and_reports_the_mismatch(tmp_path):
    """Also: every model the run builds (the loaded backbone, the trained players' float32 masters and bf16
    copies, the reference, the frozen Planning player's bf16 weights) keeps float32 rotary buffers, as
    ``from_pretrained(dtype=bf16)`` does: a model cast with ``.to(bf16)`` computes its rotary angles in bf16."""
    loop = OuterLoop(compose(["experiment=tiny", "model.dtype=bfloat16", "trainer.dtype=bfloat16",
                              "schedule.train_planning=false"]), tmp_path)
    loop.run()
    rotary = _rotary_buffers_of_every_live_model()
    assert len(rotary) >= 6, rotary  # 3 players; Execution and Evaluation: master, bf16 copy, reference
    assert all(dtypes and all(d == torch.float32 for d in dtypes) for dtypes in rotary.values()), rotary
    assert loop.players["planning"].trainer is None
    for role, player in loop.players.items():
        assert all(p.dtype == torch.bfloat16 for p in player.model.parameters()), role
        if player.trainer is not None:
            assert player.model is player.trainer.compute_model  # rollouts and training share one bf16 copy
            # its float32 masters (freed after its last block of the run: their dtype stays)
            assert all(p.dtype == torch.float32 for p in player.trainer._model.parameters())
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = [m for m in lines if m["phase_step"] == 0 and not m[f"{m['block']}/skipped"]]
    assert {m["block"] for m in first} <= {"execution", "evaluation"}
    assert first and all(0.0 <= m[f"{m['block']}/logprob_mismatch"] < 1.0 for m in first)
    summary = json.loads((tmp_path / "summary.json").read_text())["precision"]  # reported in the summary
    assert (summary["model.dtype"], summary["trainer.dtype"]) == ("bfloat16", "bfloat16")
    assert set(summary["logprob_mismatch"]) == {m["block"] for m in first}
    assert "log-prob mismatch" in (tmp_path / "summary.md").read_text()


def _first_update(tmp_path, recompute):
    run_dir = tmp_path / f"recompute_{recompute}"
    cfg = compose(["experiment=tiny", "schedule.steps_per_generation=1", "trainer.num_iterations=2",
                   "schedule.planning_updates=2", "schedule.execution_updates=0", "schedule.evaluation_updates=0",
                   f"trainer.recompute_old_logprobs={str(recompute).lower()}", "trainer.clip_eps=0.001"])
    OuterLoop(cfg, run_dir, hooks=[_stop_after(2)]).run()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines[0], Phase.from_state(load_phase_state(run_dir / "phase.pt"))


def test_recompute_old_logprobs_both_settings(tmp_path):
    """Same seed, same samples: with recompute the first step's π_old is the trainer's own forward (ratio 1:
    nothing outside a clip of 0.001) and phase.pt keeps the behaviour log-probs beside it; the reported
    mismatch compares with the behaviour log-probs under both settings, so it is the same figure."""
    plain, plain_phase = _first_update(tmp_path, False)
    redone, phase = _first_update(tmp_path, True)
    role = plain["block"]
    assert redone[f"{role}/logprob_mismatch"] == pytest.approx(plain[f"{role}/logprob_mismatch"], rel=1e-4, abs=1e-6)
    assert redone[f"{role}/clip_frac"] == 0.0
    samples = [s for u in phase.minibatches for s in u.batch]
    assert samples and all(s.behaviour_logprobs is not None for s in samples)
    assert all(s.behaviour_logprobs is None for u in plain_phase.minibatches for s in u.batch)


def test_resumable_check_accepts_auto_against_a_stored_dtype(tmp_path):
    cfg = compose(["experiment=tiny", "model.dtype=auto"])
    from unifiedplayers.loop.run_state import result_config

    then = dict(result_config(compose(["experiment=tiny"])))
    check_resumable({"config": then}, cfg, tmp_path, 1)  # auto continues a float32 run
    with pytest.raises(ValueError, match="model.dtype"):
        check_resumable({"config": then}, compose(["experiment=tiny", "model.dtype=bfloat16"]), tmp_path, 1)


def test_a_run_written_with_the_tiny_sizes_under_a_pretrained_model_resumes(tmp_path):
    """Runs written before the tiny_random sizes defaulted to null held 128, 2, ... under every model: unused there,
    they are no change (a real size change of the tiny model still is)."""
    from unifiedplayers.loop.run_state import result_config

    smol = compose(["experiment=smoke"])
    old = {**result_config(smol), "model.hidden_size": 128, "model.num_hidden_layers": 2}
    check_resumable({"config": old}, smol, tmp_path, 1)
    tiny = compose(["experiment=tiny"])
    with pytest.raises(ValueError, match="model.hidden_size"):
        check_resumable({"config": {**result_config(tiny), "model.hidden_size": 64}}, tiny, tmp_path, 1)


def test_recompute_covers_every_unit_of_a_phase_and_logs_the_mismatch_at_every_step(tmp_path):
    """S = 2 minibatches in one phase (the loop tests above have one): before the phase's first step, every minibatch's
    π_old is the trainer's own forward at the phase's start weights (here the initial ones), neither the behaviour
    log-probs nor a forward after the first step; and both steps log the mismatch |log π_old − log π_behaviour|."""
    cfg = compose(["experiment=tiny", "schedule.steps_per_generation=2", "schedule.planning_updates=2",
                   "schedule.execution_updates=0", "schedule.evaluation_updates=0",
                   "trainer.recompute_old_logprobs=true", "model.dtype=bfloat16"])  # bf16 rollouts, fp32 trainer
    minibatches = []

    def keep_units(event, loop, slot):
        if event == "update_end" and slot.step_in_phase == 0:
            minibatches.extend(copy.deepcopy([u.batch for u in loop.phase.minibatches]))

    OuterLoop(cfg, tmp_path, hooks=[keep_units]).run()
    assert len(minibatches) == 2 and all(minibatches)
    initial = load_model(OmegaConf.merge(cfg.model, {"dtype": "float32"}))[0]  # the run's float32 master weights
    fresh = build_trainer(role_trainer_config(cfg.trainer, "planning"), initial)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["phase_minibatch"] for m in lines] == [0, 1]
    for minibatch, line in zip(minibatches, lines):
        assert all(s.behaviour_logprobs is not None for s in minibatch)  # recomputed: the recorded ones kept aside
        again = [TrainSample(s.token_ids, s.loss_mask, s.behaviour_logprobs, s.advantage, s.group) for s in minibatch]
        fresh.recompute_old_logprobs(again)  # the initial weights' forward over the minibatch
        tokens = total = 0.0
        for s, a in zip(minibatch, again):
            mask = torch.as_tensor(s.loss_mask, dtype=torch.bool)
            old, behaviour = torch.as_tensor(s.old_logprobs)[mask], torch.as_tensor(s.behaviour_logprobs)[mask]
            torch.testing.assert_close(old, torch.as_tensor(a.old_logprobs)[mask])
            assert not torch.allclose(old, behaviour)
            total, tokens = total + float((old - behaviour).abs().sum()), tokens + float(mask.sum())
        assert line["planning/logprob_mismatch"] == pytest.approx(total / tokens, rel=1e-5)
