"""The paper path in the GPU check (``benchmarks/gpu_check.py --backends ...,paper_zero3``): the trainer settings of
``experiment=paper_qwen3_4b`` on the check's shape, one player, a few GRPO steps, and what those settings promise.

**Settings.** Derived from the preset as the CPU rehearsal derives them (``rehearsal_overrides`` of
tests/distributed/paper_rehearsal.py: every key where the preset differs from ``experiment=tiny`` at the preset's
value): DeepSpeed ZeRO-3, the optimizer offloaded to the host (DeepSpeed's CPU Adam, a C++ op JIT-built on first
use), ref_mode precompute, gradient checkpointing, π_old recomputed at the phase's start, β_p = 0.04 (k3),
micro-batches of 2. Where the rehearsal lists a key as not run at the preset's value, the check follows it, and the
JSON gives each difference with its reason: trainer.lr 1e-3 (at 1e-6 a resume that lost the Adam state went
unseen), trainer.entropy_bank_size (no bank here); trainer.dtype is the check's (bf16 on a bf16 GPU, what the
preset's auto picks there; float32 on CPU). The shape: the check's, cut to 2 layers on the 4B shape (every kernel
and the full 151,936-row vocabulary; ``--resume-layers``), as the resume check is.

**The steps.** One sampling phase of k + 1 = 3 updates: the role's rendered prompts (115-131 tokens) x ``--samples``
completions of ``--max-new-tokens`` random byte ids, seeded on the host, advantages +1 / -1 within each group; π_old
recomputed over the whole phase at its start, so updates 2 and 3 are off-policy (ratio and clipping at work).
Three trainers, one after the other:

- T, uninterrupted (seed s): updates 1..k, a checkpoint through the ZeRO-3 engine, update k + 1;
- A, the idle player (seed s): updates 1..k, ``offload_state()`` (what an idle player parks: optimizer state, fp32
  master weights, π_ref, in files without a name under ``trainer.offload_dir``), update k + 1;
- R, resumed: a fresh trainer on differently seeded weights loads T's checkpoint and takes update k + 1.

**Items**, each printed as ``paper_zero3 <item>: PASS | FAIL | NOT RUN (reason)`` and written under "paper_zero3":

- ``offload_state``: A parked its state (nothing left on the optimizer, bytes written), and its update k + 1 equals
  T's bitwise: the gathered weights, the fp32 master partitions, the Adam moments, the loss and the grad norm.
  Bitwise, not to a tolerance: on one rank ZeRO-3 reduces nothing across ranks, so both trainers run the same
  kernels over the same micro-batches in the same order (under ``torch.use_deterministic_algorithms`` on GPU), and
  CPU Adam is elementwise. A difference is reported as the largest absolute one.
- ``reference``: the KL term (``actor/kl``) is 0 at update 1 (π_θ = π_ref) and > 0 at updates 2..k+1; π_ref is held
  as weights on the host (ref_mode precompute: no reference module, every tensor on the CPU), and parked while idle.
- ``save_cadence``: ``schedule.save_due`` with the preset's save_every (50) and S (4) over each block of an
  iteration (200 / 300 / 200 updates) saves at the first phase end at or past each multiple of save_every and at
  the block's end (52, 100, 152, 200, ...: 14 an iteration, as the preset says); and T's checkpoint was written
  through the ZeRO-3 engine (its optimizer and model state files, model.pt, reference.pt) and loaded by R.
- ``exact_resume``: R's loaded state equals T's at the checkpoint, and R's update k + 1 equals T's bitwise (weights,
  fp32 master, Adam moments, loss, grad norm), T's update having moved the weights.
- ``peak_memory``: ``torch.cuda.max_memory_allocated`` over T's updates (from after its build) against the capacity
  plan (``unifiedplayers.capacity``) of the same thing: one GPU, one trained player and no other model resident,
  this shape, these settings, micro-batches of 2 rows of prompt + completion tokens; the update's instants only
  (the unit runs neither generation nor the entropy bank), without the plan's fixed CUDA-context item (which
  max_memory_allocated does not see). PASS when plan x 0.5 <= measured <= plan x 1.1: above, the plan under-counts
  and a run it lets start could run out of memory; below half, it over-counts and refuses runs that fit; between,
  the plan's stated approximations (bucket sizes as upper bounds, activations at token budgets). On CPU: the plan's
  figure and NOT RUN (not measured on CPU).
- Listed as NOT CHECKED: device pinning per rank, NCCL collectives, ZeRO-3 sharding across ranks (they need 2 GPUs);
  vLLM (its CUDA wheel is too large to carry).

The CPU Adam op needs a C++ compiler, ninja and Python's headers where it is built; without one, the engine items
are NOT RUN with the reason. Host RAM: the live trainer's ZeRO-Offload state (16-18 bytes a parameter) and up to
three host copies of a state for the comparisons (14 bytes a parameter each: 8 GB at the 2-layer cut of the 4B
shape), about 35 GB in all there; disk: T's checkpoint and A's parked state (34 bytes a parameter together).
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks import cuda_peak
from benchmarks.gpu_check_model import build_model, count_parameters, parameters_label, qwen3_config, render_prompts
from benchmarks.gpu_check_state import GIB, compare, deterministic, release, weights_on_host

ROOT = Path(__file__).resolve().parents[1]
PAPER_UNIT = "paper_zero3"  # its --backends entry in benchmarks/gpu_check.py
PRESET = "paper_qwen3_4b"
STEPS_BEFORE = 2  # k: updates before the checkpoint and before the idle spell; the phase holds k + 1
MEMORY_BAND = (0.5, 1.1)
ITEMS = ("offload_state", "reference", "save_cadence", "exact_resume", "peak_memory")
NOT_CHECKED = {
    "device pinning per rank": "needs 2 GPUs",
    "NCCL collectives": "needs 2 GPUs",
    "ZeRO-3 sharding across ranks": "needs 2 GPUs",
    "vLLM": "its CUDA wheel is too large to carry",
}
# Bytes a parameter on disk at once: T's checkpoint (fp32 master and Adam 12, model.pt and reference.pt 2 + 2 in
# bf16) and A's parked state (fp32 master, Adam and gradients 16, π_ref 2); float32 compute doubles the 2s.
DISK_BYTES_PER_PARAMETER = 34


# ---------------------------------------------------------------------------------------------- the build tools
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
    """Why DeepSpeed's CPU Adam op cannot be JIT-built here, or None: torch compiles it with ``$CXX`` (default c++)
    through ninja, against Python's headers."""
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


# ---------------------------------------------------------------------------------------------- settings
def rehearsal():
    """tests/distributed/paper_rehearsal.py: the preset's keys, and those the CPU rehearsal does not run as set."""
    path = ROOT / "tests" / "distributed" / "paper_rehearsal.py"
    spec = importlib.util.spec_from_file_location("paper_rehearsal", path)
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
    cfg = paper_config(dtype)
    trainer = OmegaConf.merge(role_trainer_config(cfg.trainer, role), {"offload_dir": str(offload_dir)})
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
    """``count`` updates' batches: the role's rendered prompts x ``--samples`` completions of ``--max-new-tokens``
    random byte ids (seeded on the host: the same on any device), advantages +1 / -1 within each group."""
    import torch

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


# ---------------------------------------------------------------------------------------------- state
def optimizer_on_host(trainer) -> dict:
    """The ZeRO-3 optimizer's fp32 master partitions and Adam state (moments, step), copied to the host."""
    import torch

    zero, out = trainer.engine.optimizer, {}
    for i, flat in enumerate(zero.fp32_partitioned_groups_flat):
        out[f"fp32_master.{i}"] = flat.detach().to("cpu", copy=True)
        for key, value in zero.optimizer.state.get(flat, {}).items():
            if torch.is_tensor(value):
                out[f"adam.{key}.{i}"] = value.detach().to("cpu", copy=True)
            elif isinstance(value, (int, float)):
                out[f"adam.{key}.{i}"] = torch.tensor(value)
    return out


def state_on_host(trainer) -> dict:
    """What an exact step depends on: the gathered weights, the fp32 master partitions and the Adam state."""
    return {**{f"weights.{k}": v for k, v in weights_on_host(trainer).items()}, **optimizer_on_host(trainer)}


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


# ---------------------------------------------------------------------------------------------- pure logic
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


def planned_peak(check, layers: int, role: str, prompt: int, extra: tuple[str, ...] = ()) -> dict:
    """The capacity plan's per-GPU peak of what T does (see the module docstring): a batch of --prompts x --samples
    rows of ``prompt`` + --max-new-tokens tokens in the preset's micro-batches; its instant, its total, and the figure
    compared with max_memory_allocated (the total without the fixed CUDA-context item)."""
    import torch
    from dataclasses import replace

    from unifiedplayers import capacity

    cfg = paper_config(check.dtype_name, ("model.device=cuda", "rollout.backend=hf", *extra))
    memory = torch.cuda.get_device_properties(check.device).total_memory if check.cuda else 0.0
    machine = capacity.Hardware(gpus=1, gpu_memory=float(memory), bf16=check.dtype_name == "bfloat16",
                               name="the check's GPU")
    config = qwen3_config(check.args.shape, num_layers=layers, tokenizer=check.tokenizer)
    arch = capacity.arch_from_config({**config.to_dict(), "model_type": "qwen3"}, "benchmarks/gpu_check.py shape")
    setup = replace(capacity.setup_of(cfg, machine), arch=arch, n=arch.parameters, trained=(role,),
                    trained_models=1, models=1)
    load = capacity.RoleLoad(role, check.args.prompts * check.args.samples, prompt, check.args.max_new_tokens, 0)
    loads = {**capacity.role_loads(cfg), role: load}  # the others only shape the generation instant, left out
    update = [i for i in capacity.device_instants(setup, loads)
              if i.name.split(" ")[0] in ("gather", "no-grad", "forward", "backward", "step")]
    peak = max(update, key=lambda i: i.total)
    fixed = sum(i.bytes for i in peak.items if i.name.startswith("CUDA context"))
    return {"instant": peak.name, "plan_bytes": peak.total, "compared_bytes": peak.total - fixed,
            "items": {i.name: i.bytes for i in peak.items}, "plan_parameters": arch.parameters}


# ---------------------------------------------------------------------------------------------- the unit
class PaperUnit:
    """The three trainers of the module docstring, and the items they decide."""

    def __init__(self, check) -> None:
        self.check = check
        self.cuda = check.cuda
        self.role = "execution" if "execution" in check.args.players else check.args.players[0]
        self.layers = check.resume_layers()
        self.config = qwen3_config(check.args.shape, num_layers=self.layers, tokenizer=check.tokenizer)
        self.parameters = count_parameters(self.config)
        self.seed = check.args.seed + 400
        self.parts: dict[str, dict] = {}
        self.errors: dict[str, str] = {}
        self.missing: Optional[str] = None  # why the engine parts cannot run here

    def run(self) -> dict:
        """Every item, as a dict ``{"status": PASS | FAIL | NOT RUN, ...}`` under ``report["items"]``."""
        a = self.check.args
        report: dict[str, Any] = {"status": "ran", "player": self.role, "layers": self.layers,
                                  "parameters": self.parameters, "not_checked": dict(NOT_CHECKED)}
        self._guard("cadence", cadence_item)
        tokenizer = self.check.tokenizer
        prompt = max(len(tokenizer(p, add_special_tokens=False)["input_ids"])  # a micro-batch pads to its longest
                     for p in render_prompts(tokenizer, self.role, a.prompts))
        self._guard("plan", lambda: planned_peak(self.check, self.layers, self.role, prompt))
        root = Path(a.ckpt_dir) if a.ckpt_dir else Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        self.missing = build_tools_missing() or self._disk_short(root)
        if self.missing is None:
            self._guard("cpu_adam", lambda: {"seconds": round(load_cpu_adam(), 2)})
            if "cpu_adam" in self.errors:
                self.missing = f"DeepSpeed's CPU Adam op did not build: {self.errors.pop('cpu_adam')}"
        report["cpu_adam"] = self.parts.get("cpu_adam", {"status": "not built", "reason": self.missing})
        if self.missing is None:
            directory = Path(tempfile.mkdtemp(prefix="gpu-check-paper-", dir=root))
            try:
                self._guard("settings", lambda: dict(zip(("trainer", "differences"), trainer_settings(
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
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        report["items"] = {"offload_state": self._offload_item(), "reference": self._reference_item(),
                           "save_cadence": self._cadence_item(), "exact_resume": self._resume_item(),
                           "peak_memory": self._memory_item()}
        report["errors"] = self.errors
        return report

    def _guard(self, part: str, fn: Callable[[], dict]) -> None:
        """Run one part; an exception is recorded against it (the items that need it FAIL) and the next goes on."""
        try:
            self.parts[part] = fn()
        except Exception as exc:  # noqa: BLE001 - report it, go on with the next part
            traceback.print_exc()
            self.errors[part] = f"{type(exc).__name__}: {exc}"[:1000]
        release()

    def _disk_short(self, root: Path) -> Optional[str]:
        need = self.parameters * DISK_BYTES_PER_PARAMETER
        free = shutil.disk_usage(root).free
        if free < 1.2 * need:
            return (f"needs about {need / GIB:.1f} GiB under {root}, {free / GIB:.1f} GiB free "
                    "(--ckpt-dir, --resume-layers)")
        return None

    def _blocked(self, *parts: str, engine: bool = True) -> Optional[dict]:
        """NOT RUN when the engine cannot run here, FAIL when a part the item needs raised; else None."""
        if engine and self.missing:
            return {"status": "NOT RUN", "reason": self.missing}
        failed = [f"{p}: {self.errors[p]}" for p in parts if p in self.errors]
        if not failed and engine:
            failed = [f"{p}: not run" for p in parts if p not in self.parts]
        return {"status": "FAIL", "reason": "; ".join(failed)} if failed else None

    # ------------------------------------------------------------------ the trainers
    def _trainers(self, settings, path: Path) -> None:
        self._guard("T", lambda: self._uninterrupted(settings, path))
        if "T" in self.parts:
            self._guard("A", lambda: self._idle(settings))
            self._guard("R", lambda: self._resumed(settings, path))
            for copy in ("before", "after", "batches"):  # the host copies of T's state (8 GB at the 4B cut)
                self.parts["T"].pop(copy)

    def _build(self, settings, seed: int):
        from unifiedplayers.trainer import build_trainer

        model = build_model(self.config, self.check.device, seed)
        return build_trainer(settings, model, role=self.role, pad_token_id=self.check.tokenizer.pad_token_id)

    def _phase(self, trainer) -> tuple[list, list]:
        """A new iteration and phase: π_ref := the weights, the phase's batches with π_old recomputed over all of
        them, and the first k updates' metrics."""
        trainer.start_outer_iteration()
        trainer.start_block()
        batches = phase_batches(self.check, self.role, STEPS_BEFORE + 1, self.seed)
        trainer.recompute_old_logprobs([s for batch in batches for s in batch])
        metrics = [trainer.update(batches[0], on_policy=True)]
        metrics += [trainer.update(b) for b in batches[1:STEPS_BEFORE]]
        return batches, metrics

    def _peak(self, reset: bool = False) -> Optional[int]:
        import torch

        if not self.cuda:
            return None
        torch.cuda.synchronize()
        if reset:
            torch.cuda.reset_peak_memory_stats(self.check.device)
        return torch.cuda.max_memory_allocated(self.check.device)

    @staticmethod
    def _replay(recorder) -> dict:
        try:
            return recorder.stop()
        except Exception as exc:  # noqa: BLE001 - a diagnosis that failed is reported, never the item's verdict
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _uninterrupted(self, settings, path: Path) -> dict:
        """T: updates 1..k, the checkpoint, update k + 1; the peak memory of its updates (not of the save)."""
        trainer = self._build(settings, self.seed)
        self._peak(reset=True)
        # the allocator's history over the phase's updates: what was live at their peak, by site (cuda_peak)
        recorder, replay = None, None
        if self.cuda:
            try:
                recorder = cuda_peak.Recorder(self.check.device).start()
            except Exception as exc:  # noqa: BLE001 - reported; the item's verdict does not depend on it
                replay = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            batches, metrics = self._phase(trainer)
        finally:
            replay = self._replay(recorder) if recorder is not None else replay
        peak = self._peak()
        before = state_on_host(trainer)
        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        save_s = time.perf_counter() - t0
        self._peak(reset=True)
        metrics.append(trainer.update(batches[STEPS_BEFORE]))
        peak = max(peak, self._peak()) if self.cuda else None
        ref = trainer.held_reference
        held = {"ref_module": ref.module is not None, "ref_tensors": len(ref.weights),
                "ref_devices": sorted({t.device.type for t in ref.weights.values()}),
                "policy_device": trainer.device.type}
        after = state_on_host(trainer)
        release(trainer)
        moved = same_state(*({k: v for k, v in state.items() if k.startswith("weights.")} for state in (before, after)))
        files = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file())
        return {"batches": batches, "metrics": metrics, "before": before, "after": after, "peak": peak,
                "peak_breakdown": replay,
                "held": held, "files": files, "moved": moved["max_abs_diff"], "save_s": round(save_s, 3),
                "checkpoint_bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())}

    def _idle(self, settings) -> dict:
        """A: updates 1..k, offload_state(), update k + 1."""
        trainer = self._build(settings, self.seed)
        batches, metrics = self._phase(trainer)
        t0 = time.perf_counter()
        trainer.offload_state()
        park_s = time.perf_counter() - t0
        parked = {"optimizer_state_present": trainer.has_optimizer_state,
                  "optimizer_bytes": trainer.parked_optimizer_bytes,
                  "reference_bytes": trainer.held_reference.parked_bytes, "park_s": round(park_s, 3)}
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
        t = self.parts["T"]  # compared now, so that only one extra copy of the state is held at a time
        loaded = same_state(state_on_host(trainer), t["before"])
        global_step = trainer.global_step
        metrics = trainer.update(t["batches"][STEPS_BEFORE])
        step = same_step((state_on_host(trainer), metrics), (t["after"], t["metrics"][-1]))
        release(trainer)
        return {"loaded": loaded, "step": step, "load_s": round(load_s, 3), "global_step": global_step}

    # ------------------------------------------------------------------ the items
    def _offload_item(self) -> dict:
        blocked = self._blocked("T", "A")
        if blocked:
            return blocked
        result, parked = self.parts["A"]["step"], self.parts["A"]["parked"]
        went_idle = not parked["optimizer_state_present"] and parked["optimizer_bytes"] > 0
        passed = went_idle and parked["optimizer_state_back"] and result["bitwise_equal"] and result["metrics_equal"]
        return {"status": "PASS" if passed else "FAIL", **parked, **result}

    def _reference_item(self) -> dict:
        blocked = self._blocked("T")
        if blocked:
            return blocked
        t = self.parts["T"]
        kl = [m["actor/kl"] for m in t["metrics"]]
        held = t["held"]
        on_host = not held["ref_module"] and held["ref_tensors"] > 0 and held["ref_devices"] == ["cpu"]
        parked = self.parts.get("A", {}).get("parked", {}).get("reference_bytes", 0)
        passed = kl[0] == 0.0 and all(k > 0 for k in kl[1:]) and on_host and "reference.pt" in t["files"]
        return {"status": "PASS" if passed else "FAIL", "kl": kl, **held, "reference_parked_bytes": parked}

    def _cadence_item(self) -> dict:
        blocked = self._blocked("cadence", engine=False)
        if blocked:
            return blocked
        logic = {k: v for k, v in self.parts["cadence"].items()}
        if not logic["logic_ok"]:
            return {"status": "FAIL", "reason": "save_due's saves differ from the expected ones", **logic}
        blocked = self._blocked("T", "R")
        if blocked:
            alone = f"save_due alone: as expected, {logic['saves_per_iteration']} saves an iteration"
            return {**logic, **blocked, "reason": f"{blocked['reason']}; {alone}"}
        files = self.parts["T"]["files"]
        engine = {"optim_states": any(f.endswith("optim_states.pt") for f in files),
                  "model_states": any(f.endswith("model_states.pt") for f in files),
                  "model.pt": "model.pt" in files, "reference.pt": "reference.pt" in files}
        passed = all(engine.values()) and self.parts["R"]["global_step"] == STEPS_BEFORE
        return {"status": "PASS" if passed else "FAIL", **logic, "engine_files": engine,
                "checkpoint_bytes": self.parts["T"]["checkpoint_bytes"], "save_s": self.parts["T"]["save_s"],
                "load_s": self.parts["R"]["load_s"], "loaded_global_step": self.parts["R"]["global_step"]}

    def _resume_item(self) -> dict:
        blocked = self._blocked("T", "R")
        if blocked:
            return blocked
        r, moved = self.parts["R"], self.parts["T"]["moved"]
        result, loaded = r["step"], r["loaded"]
        passed = loaded["bitwise_equal"] and result["bitwise_equal"] and result["metrics_equal"] and moved > 0
        return {"status": "PASS" if passed else "FAIL", "loaded_state_equal": loaded["bitwise_equal"],
                "loaded_max_abs_diff": loaded["max_abs_diff"], "step_changed_weights_by": moved, **result}

    def _memory_item(self) -> dict:
        blocked = self._blocked("plan", engine=False)
        if blocked:
            return blocked
        plan = self.parts["plan"]
        if not self.cuda:
            return {"status": "NOT RUN", "reason": f"not measured on CPU; the plan for one GPU: "
                    f"{plan['compared_bytes'] / GIB:.3f} GiB ({plan['plan_bytes'] / GIB:.3f} GiB with the CUDA "
                    f"context) at its '{plan['instant']}' instant", **plan}
        blocked = self._blocked("T")
        if blocked:
            return {**blocked, **plan}
        measured, compared = self.parts["T"]["peak"], plan["compared_bytes"]
        low, high = MEMORY_BAND
        passed = low * compared <= measured <= high * compared
        return {"status": "PASS" if passed else "FAIL", "measured_bytes": measured, "band": [low, high],
                "ratio": measured / compared if compared else float("inf"), **plan,
                "breakdown": self.parts["T"].get("peak_breakdown")}


def run_unit(check) -> dict:
    return PaperUnit(check).run()


# ---------------------------------------------------------------------------------------------- the lines
def print_items(unit: dict) -> None:
    """One line per item, ``paper_zero3 <item>: PASS | FAIL | NOT RUN (...)``, then the NOT CHECKED ones."""
    items = unit.get("items")
    if items is None:  # the unit did not start, or stopped on an error
        status = "FAIL" if unit.get("status") == "error" else "NOT RUN"
        items = {name: {"status": status, "reason": unit.get("reason", "")} for name in ITEMS}
    else:
        print(f"paper_zero3: the {unit['player']} player, {unit['layers']} layers, {parameters_label(unit['parameters'])} "
              f"parameters; CPU Adam op: {_cpu_adam(unit.get('cpu_adam', {}))}; settings {unit.get('settings')}")
    for name in ITEMS:
        item = items[name]
        detail = DETAILS[name](item) if item["status"] in ("PASS", "FAIL") and "reason" not in item else ""
        reason = item.get("reason") or detail
        print(f"paper_zero3 {name}: {item['status']}" + (f" ({reason})" if reason else ""), flush=True)
        replay = item.get("breakdown") if name == "peak_memory" else None
        if replay:
            shown = [f"allocator replay failed: {replay['error']}"] if "error" in replay else cuda_peak.lines(replay)
            print("\n".join(f"  peak_memory {line}" for line in shown), flush=True)
    for name, why in NOT_CHECKED.items():
        print(f"paper_zero3 {name}: NOT CHECKED ({why})")


def _cpu_adam(info: dict) -> str:
    return (f"JIT-built or loaded in {info['seconds']} s" if "seconds" in info
            else f"not built ({info.get('reason')})")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _step(item: dict) -> str:
    same = ("weights, fp32 master and Adam state bitwise equal" if item["bitwise_equal"] else
            f"NOT equal in {', '.join(item['differs_in'])} (max |diff| {item['max_abs_diff']:.3g})")
    return (f"{same}; loss {item['loss'][0]:+.6g} / {item['loss'][1]:+.6g}, "
            f"grad norm {item['grad_norm'][0]:.6g} / {item['grad_norm'][1]:.6g}")


def _offload_detail(item: dict) -> str:
    idle = "went idle" if not item["optimizer_state_present"] else "still held its optimizer state"
    return (f"update {STEPS_BEFORE + 1} after offload_state() vs the twin that stayed active: {_step(item)}; {idle}, "
            f"{_mib(item['optimizer_bytes'])} optimizer state and {_mib(item['reference_bytes'])} pi_ref parked in "
            f"{item['park_s']} s, back and updated in {item['back_and_update_s']} s")


def _reference_detail(item: dict) -> str:
    where = (f"pi_ref: {item['ref_tensors']} tensors on {'/'.join(item['ref_devices']) or 'nothing'}"
             f"{', and a reference module' if item['ref_module'] else ', no reference module'}")
    return (f"KL per update {', '.join(f'{k:.3g}' for k in item['kl'])} (0 while pi = pi_ref, then > 0); {where} "
            f"(policy on {item['policy_device']}); {_mib(item['reference_parked_bytes'])} parked while idle")


def _cadence_detail(item: dict) -> str:
    saves = "; ".join(f"{role} {updates}" for role, updates in item["saves"].items())
    logic = (f"save_due(save_every={item['save_every']}, S={item['per_phase']}) saves after {saves}: "
             f"{item['saves_per_iteration']} an iteration, {'as expected' if item['logic_ok'] else 'NOT as expected'}")
    if "engine_files" not in item:
        return logic
    missing = [k for k, v in item["engine_files"].items() if not v]
    return (f"{logic}; ZeRO-3 checkpoint {_mib(item['checkpoint_bytes'])} written in {item['save_s']} s"
            + (f" WITHOUT {', '.join(missing)}" if missing else "")
            + f", loaded in {item['load_s']} s at update {item['loaded_global_step']}")


def _resume_detail(item: dict) -> str:
    loaded = ("loaded state equal" if item["loaded_state_equal"]
              else f"loaded state NOT equal (max |diff| {item['loaded_max_abs_diff']:.3g})")
    return (f"{loaded}; update {STEPS_BEFORE + 1} vs the uninterrupted one: {_step(item)}; the update moved the "
            f"weights by up to {item['step_changed_weights_by']:.3g}")


def _memory_detail(item: dict) -> str:
    low, high = item["band"]
    return (f"max_memory_allocated {item['measured_bytes'] / GIB:.2f} GiB vs the plan's "
            f"{item['compared_bytes'] / GIB:.2f} GiB ({item['plan_bytes'] / GIB:.2f} GiB with the CUDA context) "
            f"at its '{item['instant']}' instant: x {item['ratio']:.2f}, PASS within x {low} .. x {high}")


DETAILS = {"offload_state": _offload_detail, "reference": _reference_detail, "save_cadence": _cadence_detail,
           "exact_resume": _resume_detail, "peak_memory": _memory_detail}
