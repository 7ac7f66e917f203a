"""The paper path in the GPU check (``--backends ...,paper_zero3``): the trainer settings of
``experiment=paper_qwen3_4b`` on the check's shape (cut to 2 layers on the 4B, as the resume check), one player.

The settings are the preset's as the CPU rehearsal derives them (``rehearsal_overrides`` of
tests/distributed/paper_rehearsal.py): DeepSpeed ZeRO-3, the optimizer offloaded to DeepSpeed's CPU Adam (a C++ op
JIT-built on first use: it needs a C++ compiler, ninja and Python's headers, else the engine items are NOT RUN),
ref_mode precompute, gradient checkpointing, π_old recomputed, β_p = 0.04. The JSON gives each key that differs from
the preset with its reason (lr 1e-3: at 1e-6 a resume that lost the Adam state went unseen; the compute dtype).

One phase of k + 1 = 3 updates on random byte completions (seeded on the host), advantages +1 / -1 within each
group, π_old recomputed at its start (updates 2 and 3 off-policy). Three trainers in turn: T, uninterrupted (updates
1..k, a checkpoint, update k + 1); A, the idle player (updates 1..k, ``offload_state()``, update k + 1); R, a fresh
trainer on other weights that loads T's checkpoint and takes update k + 1. The items:

- ``offload_state``: A parked its state, and its update k + 1 equals T's bitwise (weights, fp32 master, Adam moments,
  loss, grad norm: on one rank ZeRO-3 reduces nothing, so both run the same kernels in the same order);
- ``reference``: KL 0 at update 1 (π = π_ref) and > 0 after; π_ref held as host tensors and parked while idle;
- ``save_cadence``: ``schedule.save_due`` over the preset's blocks saves where expected (14 an iteration), and T's
  checkpoint was written through the engine and loaded by R;
- ``exact_resume``: R's loaded state equals T's, and its update k + 1 equals T's bitwise, T's having moved the weights;
- ``peak_memory``: ``max_memory_allocated`` over T's updates against the capacity plan of the same
  (:func:`~benchmarks.gpu_check_common.memory_verdict`), with the allocator's replay of what was live at the peak.

Host RAM: the trainer's ZeRO-Offload state and up to three host copies of a state (about 35 GB at the 4B cut).
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks import cuda_peak
from benchmarks.gpu_check_common import (Unit, build_model, compare, count_parameters, deterministic, disk_short,
                                         memory_detail, memory_verdict, mib, parameters_label, planned_peak,
                                         prompt_length, qwen3_config, release, render_prompts, scratch,
                                         weights_on_host)

ROOT = Path(__file__).resolve().parents[1]
PRESET = "paper_qwen3_4b"
STEPS_BEFORE = 2  # k: updates before the checkpoint and before the idle spell; the phase holds k + 1
UPDATE_PASSES = ("gather", "no-grad", "forward", "backward", "step")  # the plan's instants of an update
# Bytes a parameter on disk at once: T's checkpoint (fp32 master and Adam 12, model.pt and reference.pt 2 + 2 in
# bf16) and A's parked state (fp32 master, Adam and gradients 16, π_ref 2); float32 compute doubles the 2s.
DISK_BYTES_PER_PARAMETER = 34


def find_ninja() -> bool:
    """ninja on PATH, else the binary of a carried ninja wheel put on PATH: ``pip install --target`` puts it in
    ``<site>/bin``, an unpacked wheel in ``<site>/ninja-*.data/scripts`` (without its executable bit)."""
    if shutil.which("ninja"):
        return True
    for entry in sys.path:
        root = Path(entry or ".")
        for binary in [root / "bin" / "ninja", *root.glob("ninja-*.data/scripts/ninja")]:
            if binary.is_file():
                if not os.access(binary, os.X_OK):
                    binary.chmod(binary.stat().st_mode | 0o111)
                os.environ["PATH"] = f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}"
                return True
    return False


def build_tools_missing() -> Optional[str]:
    """Why DeepSpeed's CPU Adam op cannot be JIT-built here (torch compiles it with ``$CXX`` through ninja, against
    Python's headers), or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx}) on PATH: DeepSpeed's CPU Adam op is compiled where it runs"
    if not find_ninja():
        return "no ninja on PATH or in a carried wheel: torch builds C++ ops with it"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no Python headers ({header}; a python3-dev package): the op compiles against them"
    return None


def load_cpu_adam() -> float:
    """JIT-build (or load from ``TORCH_EXTENSIONS_DIR``) DeepSpeed's CPU Adam op; the seconds it took."""
    from unifiedplayers.trainer.deepspeed_backend import ensure_single_process_env, load_cpu_adam_op

    ensure_single_process_env()
    t0 = time.perf_counter()
    load_cpu_adam_op()
    return time.perf_counter() - t0


def rehearsal():
    """tests/distributed/paper_rehearsal.py: the preset's keys, and those the CPU rehearsal does not run as set."""
    spec = importlib.util.spec_from_file_location("paper_rehearsal", ROOT / "tests/distributed/paper_rehearsal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paper_config(dtype: str, extra: tuple[str, ...] = ()):
    """The composed config of the rehearsal's overrides for :data:`PRESET`, with the check's compute dtype."""
    from unifiedplayers.config import compose

    return compose([*rehearsal().rehearsal_overrides(PRESET), f"trainer.dtype={dtype}", f"model.dtype={dtype}",
                    *extra])


def trainer_settings(dtype: str, role: str, offload_dir: Path) -> tuple[Any, dict]:
    """(the player's trainer config, ``{key: [preset's value, the check's, why]}`` where they differ)."""
    from omegaconf import OmegaConf

    from unifiedplayers.config import compose, role_trainer_config

    module = rehearsal()
    trainer = OmegaConf.merge(role_trainer_config(paper_config(dtype).trainer, role), {"offload_dir": str(offload_dir)})
    ours = module.flat(OmegaConf.create({"trainer": OmegaConf.to_container(trainer)}))
    preset = module.flat(compose([f"experiment={PRESET}"]))
    why = {"trainer.dtype": "the check's compute dtype (--dtype; auto: bf16 on a bf16 GPU, as the preset's auto)",
           "trainer.offload_dir": "the check's temporary folder"}
    differences = {k: [preset.get(k), v, why.get(k) or module.NOT_REHEARSED.get(k, (None, "?"))[1]]
                   for k, v in ours.items() if preset.get(k) != v}
    if float(trainer.kl_coef) <= 0:
        raise ValueError(f"{PRESET}'s kl_coef is {trainer.kl_coef}: the reference item needs β_p > 0")
    return trainer, differences


def phase_batches(check, role: str, count: int, seed: int) -> list[list]:
    """``count`` updates' batches: the role's prompts x ``--samples`` completions of ``--max-new-tokens`` random byte
    ids (seeded on the host: the same on any device), advantages +1 / -1 within each group."""
    from unifiedplayers.trainer import TrainSample

    a, g = check.args, torch.Generator().manual_seed(seed)
    prompts = [check.tokenizer(p, add_special_tokens=False)["input_ids"]
               for p in render_prompts(check.tokenizer, role, a.prompts)]
    batches = []
    for _ in range(count):
        batch = []
        for group, prompt in enumerate(prompts):
            for j in range(a.samples):
                response = torch.randint(3, 259, (a.max_new_tokens,), generator=g).tolist()  # byte ids
                n = len(prompt) + len(response)
                batch.append(TrainSample(list(prompt) + response, [0] * len(prompt) + [1] * len(response),
                                         [0.0] * n, 1.0 if j % 2 == 0 else -1.0, group))
        batches.append(batch)
    return batches


def state_on_host(trainer) -> dict:
    """What an exact step depends on: the gathered weights, the fp32 master partitions and the Adam state."""
    zero, out = trainer.engine.optimizer, {f"weights.{k}": v for k, v in weights_on_host(trainer).items()}
    for i, flat in enumerate(zero.fp32_partitioned_groups_flat):
        out[f"fp32_master.{i}"] = flat.detach().to("cpu", copy=True)
        for key, value in zero.optimizer.state.get(flat, {}).items():
            if torch.is_tensor(value):
                out[f"adam.{key}.{i}"] = value.detach().to("cpu", copy=True)
            elif isinstance(value, (int, float)):
                out[f"adam.{key}.{i}"] = torch.tensor(value)
    return out


def same_state(ours: dict, theirs: dict) -> dict:
    """Two host states (:func:`state_on_host`): bitwise equal or not, the largest difference and where."""
    differs, diff = set(), 0.0
    for key in ours.keys() & theirs.keys():
        equal, d = compare({key: ours[key]}, {key: theirs[key]})
        if not equal:
            differs.add(key.split(".")[0])
            diff = max(diff, d)
    return {"bitwise_equal": ours.keys() == theirs.keys() and not differs, "max_abs_diff": diff,
            "differs_in": sorted(differs)}


def same_step(ours: tuple[dict, dict], theirs: tuple[dict, dict]) -> dict:
    """Two (state, metrics) after the same update: bitwise equal state, equal loss and grad norm."""
    loss = [theirs[1]["actor/loss"], ours[1]["actor/loss"]]
    norm = [theirs[1]["actor/grad_norm"], ours[1]["actor/grad_norm"]]
    return {**same_state(ours[0], theirs[0]), "loss": loss, "grad_norm": norm,
            "metrics_equal": loss[0] == loss[1] and norm[0] == norm[1]}


def expected_saves(block: int, save_every: int, per_phase: int) -> list[int]:
    """The updates (1-based) of a block that end with a save, derived apart from ``save_due``: the first phase end
    at or past each multiple of ``save_every``, and the block's last update."""
    ends = {math.ceil(m * save_every / per_phase) * per_phase for m in range(1, block // save_every + 1)}
    return sorted({u for u in ends if u <= block} | {block})


def cadence_item() -> dict:
    """``save_due`` over each block of the preset's first iteration against :func:`expected_saves`."""
    from unifiedplayers.config import compose
    from unifiedplayers.schedule import blocks as plan_blocks, phase_steps, save_due

    cfg = compose([f"experiment={PRESET}"])
    every, per_phase = int(cfg.schedule.save_every), phase_steps(cfg)
    sizes = dict(plan_blocks(cfg))
    blocks = {role: [d for d in range(per_phase, size + 1, per_phase) if save_due(d, size, per_phase, every)]
              for role, size in sizes.items()}
    expected = {role: expected_saves(size, every, per_phase) for role, size in sizes.items()}
    return {"save_every": every, "per_phase": per_phase, "saves": blocks, "expected": expected,
            "saves_per_iteration": sum(len(v) for v in blocks.values()), "logic_ok": every > 0 and blocks == expected}


def paper_plan(check, layers: int, role: str, prompt: int, extra: tuple[str, ...] = ()) -> dict:
    """The capacity plan's peak of T's updates: one GPU, one trained player and no other model resident."""
    cfg = paper_config(check.dtype_name, ("model.device=cuda", "rollout.backend=hf", *extra))
    config = qwen3_config(check.args.shape, num_layers=layers, tokenizer=check.tokenizer)
    return planned_peak(check, cfg, config, {role: prompt}, UPDATE_PASSES, trained_models=1, models=1)


def _step(item: dict) -> str:
    same = ("weights, fp32 master and Adam state bitwise equal" if item["bitwise_equal"] else
            f"NOT equal in {', '.join(item['differs_in'])} (max |diff| {item['max_abs_diff']:.3g})")
    return (f"{same}; loss {item['loss'][0]:+.6g} / {item['loss'][1]:+.6g}, "
            f"grad norm {item['grad_norm'][0]:.6g} / {item['grad_norm'][1]:.6g}")


def _offload_detail(item: dict) -> str:
    idle = "went idle" if not item["optimizer_state_present"] else "still held its optimizer state"
    return (f"update {STEPS_BEFORE + 1} after offload_state() vs the twin that stayed active: {_step(item)}; {idle}, "
            f"{mib(item['optimizer_bytes'])} optimizer state and {mib(item['reference_bytes'])} pi_ref parked in "
            f"{item['park_s']} s, back and updated in {item['back_and_update_s']} s")


def _reference_detail(item: dict) -> str:
    where = (f"pi_ref: {item['ref_tensors']} tensors on {'/'.join(item['ref_devices']) or 'nothing'}"
             f"{', and a reference module' if item['ref_module'] else ', no reference module'}")
    return (f"KL per update {', '.join(f'{k:.3g}' for k in item['kl'])} (0 while pi = pi_ref, then > 0); {where} "
            f"(policy on {item['policy_device']}); {mib(item['reference_parked_bytes'])} parked while idle")


def _cadence_detail(item: dict) -> str:
    saves = "; ".join(f"{role} {updates}" for role, updates in item["saves"].items())
    logic = (f"save_due(save_every={item['save_every']}, S={item['per_phase']}) saves after {saves}: "
             f"{item['saves_per_iteration']} an iteration, {'as expected' if item['logic_ok'] else 'NOT as expected'}")
    if "engine_files" not in item:
        return logic
    missing = [k for k, v in item["engine_files"].items() if not v]
    return (f"{logic}; ZeRO-3 checkpoint {mib(item['checkpoint_bytes'])} written in {item['save_s']} s"
            + (f" WITHOUT {', '.join(missing)}" if missing else "")
            + f", loaded in {item['load_s']} s at update {item['loaded_global_step']}")


def _resume_detail(item: dict) -> str:
    loaded = ("loaded state equal" if item["loaded_state_equal"]
              else f"loaded state NOT equal (max |diff| {item['loaded_max_abs_diff']:.3g})")
    return (f"{loaded}; update {STEPS_BEFORE + 1} vs the uninterrupted one: {_step(item)}; the update moved the "
            f"weights by up to {item['step_changed_weights_by']:.3g}")


class PaperUnit(Unit):
    """The three trainers of the module docstring, and the items they decide."""

    NAME, WHAT = "paper_zero3", "the paper preset's trainer settings"
    ITEMS = ("offload_state", "reference", "save_cadence", "exact_resume", "peak_memory")
    NOT_CHECKED = {"device pinning per rank": "needs 2 GPUs", "NCCL collectives": "needs 2 GPUs",
                   "ZeRO-3 sharding across ranks": "needs 2 GPUs", "vLLM": "its CUDA wheel is too large to carry"}
    DETAILS = {"offload_state": _offload_detail, "reference": _reference_detail, "save_cadence": _cadence_detail,
               "exact_resume": _resume_detail, "peak_memory": memory_detail}

    def __init__(self, check) -> None:
        super().__init__(check)
        self.role = "execution" if "execution" in self.args.players else self.args.players[0]
        self.layers = check.resume_layers()
        self.config = qwen3_config(self.args.shape, num_layers=self.layers, tokenizer=check.tokenizer)
        self.parameters = count_parameters(self.config)
        self.seed = self.args.seed + 400

    @staticmethod
    def headline(unit: dict) -> str:
        adam = unit.get("cpu_adam", {})
        adam = (f"JIT-built or loaded in {adam['seconds']} s" if "seconds" in adam
                else f"not built ({adam.get('reason')})")
        return (f"the {unit['player']} player, {unit['layers']} layers, {parameters_label(unit['parameters'])} "
                f"parameters; CPU Adam op: {adam}; settings {unit.get('settings')}")

    def run(self) -> dict:
        report: dict[str, Any] = {"status": "ran", "player": self.role, "layers": self.layers,
                                  "parameters": self.parameters, "not_checked": dict(self.NOT_CHECKED)}
        self.guard("cadence", cadence_item)
        prompt = prompt_length(self.check.tokenizer, self.role, self.args.prompts)
        self.guard("plan", lambda: paper_plan(self.check, self.layers, self.role, prompt))
        missing = build_tools_missing() or disk_short(self.args, self.parameters * DISK_BYTES_PER_PARAMETER, 1.2)
        if missing is None:
            self.guard("cpu_adam", lambda: {"seconds": round(load_cpu_adam(), 2)})
            if "cpu_adam" in self.errors:
                missing = f"DeepSpeed's CPU Adam op did not build: {self.errors.pop('cpu_adam')}"
        report["cpu_adam"] = self.parts.get("cpu_adam", {"status": "not built", "reason": missing})
        if missing is None:
            with scratch(self.args, "gpu-check-paper-") as directory:
                self.guard("settings", lambda: dict(zip(("trainer", "differences"), trainer_settings(
                    self.check.dtype_name, self.role, directory / "offload"))))
                if "settings" in self.parts:
                    settings = self.parts["settings"]["trainer"]
                    report["settings"] = {k: settings[k] for k in (
                        "backend", "offload_optimizer", "ref_mode", "gradient_checkpointing", "recompute_old_logprobs",
                        "kl_coef", "micro_batch_size", "max_tokens_per_micro_batch", "lr", "dtype")}
                    report["settings_differing_from_preset"] = self.parts["settings"]["differences"]
                    with deterministic(self.cuda) as caught:
                        self._trainers(settings, directory / "ckpt")
                    report["determinism_warnings"] = caught
        else:
            self.skipped.update(dict.fromkeys(("T", "A", "R"), missing))
        report["items"] = {"offload_state": self.blocked("T", "A") or self._offload_item(),
                           "reference": self.blocked("T") or self._reference_item(),
                           "save_cadence": self.blocked("cadence") or self._cadence_item(),
                           "exact_resume": self.blocked("T", "R") or self._resume_item(),
                           "peak_memory": self.blocked("plan") or self._memory_item()}
        report["errors"] = self.errors
        return report

    def _trainers(self, settings, path: Path) -> None:
        self.guard("T", lambda: self._uninterrupted(settings, path))
        if "T" in self.parts:
            self.guard("A", lambda: self._idle(settings))
            self.guard("R", lambda: self._resumed(settings, path))
            for copy in ("before", "after", "batches"):  # the host copies of T's state (8 GB at the 4B cut)
                self.parts["T"].pop(copy)

    def _build(self, settings, seed: int):
        from unifiedplayers.trainer import build_trainer

        model = build_model(self.config, self.check.device, seed)
        return build_trainer(settings, model, role=self.role, pad_token_id=self.check.tokenizer.pad_token_id)

    def _phase(self, trainer) -> tuple[list, list]:
        """A new iteration and phase: π_ref := the weights, π_old recomputed over the phase's batches, and the first
        k updates' metrics."""
        trainer.start_outer_iteration()
        trainer.start_block()
        batches = phase_batches(self.check, self.role, STEPS_BEFORE + 1, self.seed)
        trainer.recompute_old_logprobs([s for batch in batches for s in batch])
        metrics = [trainer.update(batches[0], on_policy=True)]
        metrics += [trainer.update(b) for b in batches[1:STEPS_BEFORE]]
        return batches, metrics

    def _uninterrupted(self, settings, path: Path) -> dict:
        """T: updates 1..k, the checkpoint, update k + 1; the peak memory of its updates (not of the save), and on
        GPU the allocator's history over the first k replayed to its peak (a diagnosis: never the verdict)."""
        trainer = self._build(settings, self.seed)
        self.peak(reset=True)
        recorder, replay = None, None
        if self.cuda:
            try:
                recorder = cuda_peak.Recorder(self.check.device).start()
            except Exception as exc:  # noqa: BLE001
                replay = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            batches, metrics = self._phase(trainer)
        finally:
            if recorder is not None:
                try:
                    replay = recorder.stop()
                except Exception as exc:  # noqa: BLE001
                    replay = {"error": f"{type(exc).__name__}: {exc}"}
        peak = self.peak()
        before = state_on_host(trainer)
        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        save_s = time.perf_counter() - t0
        self.peak(reset=True)
        metrics.append(trainer.update(batches[STEPS_BEFORE]))
        peak = max(peak, self.peak()) if self.cuda else None
        ref = trainer.held_reference
        held = {"ref_module": ref.module is not None, "ref_tensors": len(ref.weights),
                "ref_devices": sorted({t.device.type for t in ref.weights.values()}),
                "policy_device": trainer.device.type}
        after = state_on_host(trainer)
        release(trainer)
        moved = compare(*({k: v for k, v in state.items() if k.startswith("weights.")} for state in (before, after)))
        files = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file())
        return {"batches": batches, "metrics": metrics, "before": before, "after": after, "peak": peak,
                "peak_breakdown": replay, "held": held, "files": files, "moved": moved[1], "save_s": round(save_s, 3),
                "checkpoint_bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())}

    def _idle(self, settings) -> dict:
        """A: updates 1..k, offload_state(), update k + 1."""
        trainer = self._build(settings, self.seed)
        batches, metrics = self._phase(trainer)
        t0 = time.perf_counter()
        trainer.offload_state()
        parked = {"optimizer_state_present": trainer.has_optimizer_state,
                  "optimizer_bytes": trainer.parked_optimizer_bytes,
                  "reference_bytes": trainer.held_reference.parked_bytes, "park_s": round(time.perf_counter() - t0, 3)}
        t0 = time.perf_counter()
        metrics.append(trainer.update(batches[STEPS_BEFORE]))  # brings the state back first
        parked["back_and_update_s"] = round(time.perf_counter() - t0, 3)
        parked["optimizer_state_back"] = trainer.has_optimizer_state
        t = self.parts["T"]  # compared now, so that only one extra copy of the state is held at a time
        step = same_step((state_on_host(trainer), metrics[-1]), (t["after"], t["metrics"][-1]))
        release(trainer)
        return {"step": step, "parked": parked}

    def _resumed(self, settings, path: Path) -> dict:
        """R: a fresh trainer on other weights loads T's checkpoint, then takes T's update k + 1 (same records)."""
        trainer = self._build(settings, self.seed + 1000)
        t0 = time.perf_counter()
        trainer.load_checkpoint(path)
        load_s = time.perf_counter() - t0
        t = self.parts["T"]
        loaded = same_state(state_on_host(trainer), t["before"])
        global_step = trainer.global_step
        metrics = trainer.update(t["batches"][STEPS_BEFORE])
        step = same_step((state_on_host(trainer), metrics), (t["after"], t["metrics"][-1]))
        release(trainer)
        return {"loaded": loaded, "step": step, "load_s": round(load_s, 3), "global_step": global_step}

    def _offload_item(self) -> dict:
        result, parked = self.parts["A"]["step"], self.parts["A"]["parked"]
        went_idle = not parked["optimizer_state_present"] and parked["optimizer_bytes"] > 0
        passed = went_idle and parked["optimizer_state_back"] and result["bitwise_equal"] and result["metrics_equal"]
        return {"status": "PASS" if passed else "FAIL", **parked, **result}

    def _reference_item(self) -> dict:
        t = self.parts["T"]
        kl, held = [m["actor/kl"] for m in t["metrics"]], t["held"]
        on_host = not held["ref_module"] and held["ref_tensors"] > 0 and held["ref_devices"] == ["cpu"]
        parked = self.parts.get("A", {}).get("parked", {}).get("reference_bytes", 0)
        passed = kl[0] == 0.0 and all(k > 0 for k in kl[1:]) and on_host and "reference.pt" in t["files"]
        return {"status": "PASS" if passed else "FAIL", "kl": kl, **held, "reference_parked_bytes": parked}

    def _cadence_item(self) -> dict:
        logic = dict(self.parts["cadence"])
        if not logic["logic_ok"]:
            return {"status": "FAIL", "reason": "save_due's saves differ from the expected ones", **logic}
        blocked = self.blocked("T", "R")
        if blocked:
            alone = f"save_due alone: as expected, {logic['saves_per_iteration']} saves an iteration"
            return {**logic, **blocked, "reason": f"{blocked['reason']}; {alone}"}
        t, r = self.parts["T"], self.parts["R"]
        engine = {"optim_states": any(f.endswith("optim_states.pt") for f in t["files"]),
                  "model_states": any(f.endswith("model_states.pt") for f in t["files"]),
                  "model.pt": "model.pt" in t["files"], "reference.pt": "reference.pt" in t["files"]}
        passed = all(engine.values()) and r["global_step"] == STEPS_BEFORE
        return {"status": "PASS" if passed else "FAIL", **logic, "engine_files": engine,
                "checkpoint_bytes": t["checkpoint_bytes"], "save_s": t["save_s"], "load_s": r["load_s"],
                "loaded_global_step": r["global_step"]}

    def _resume_item(self) -> dict:
        r, moved = self.parts["R"], self.parts["T"]["moved"]
        result, loaded = r["step"], r["loaded"]
        passed = loaded["bitwise_equal"] and result["bitwise_equal"] and result["metrics_equal"] and moved > 0
        return {"status": "PASS" if passed else "FAIL", "loaded_state_equal": loaded["bitwise_equal"],
                "loaded_max_abs_diff": loaded["max_abs_diff"], "step_changed_weights_by": moved, **result}

    def _memory_item(self) -> dict:
        plan = self.parts["plan"]
        blocked = self.blocked("T") if self.cuda else None
        if blocked:
            return {**blocked, **plan}
        t = self.parts.get("T", {})
        return memory_verdict(plan, t.get("peak"), self.cuda, breakdown=t.get("peak_breakdown"))
