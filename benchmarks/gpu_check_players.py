"""The GPU check's player runs and exact-resume check.

A player run: ``--steps`` steps of sampling with our ``hf`` engine, the Execution player's completions run as
programs through our sandbox, and one optimizer step on made-up advantages.

The exact-resume check: after step k the trainer saves a checkpoint, takes step k+1 and its weights are recorded; a
fresh trainer on a differently seeded model loads the checkpoint and repeats step k+1 on the same batch. PASS when the
weights are bitwise equal (and did move in that step) and the loss and grad norm are equal. On GPU it runs under
``torch.use_deterministic_algorithms(True)`` with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``; on a difference a second replay
tells missing state from non-deterministic kernels.
"""
from __future__ import annotations

import hashlib
import re
import resource
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check_common import (PLAYERS, Clock, compare, count_parameters, deterministic, disk_short,
                                         qwen3_config, release, render_prompts, scratch, weights_on_host)

CODE_BLOCK = re.compile(r"```python\n(.*?)(?:```|$)", re.S)


class SandboxRuns:
    """Our sandbox, started on first use, running the Execution player's completions as programs (their python
    block, else the whole text); its figures, or why it could not start, go to ``report["sandbox"]``."""

    def __init__(self, report: dict) -> None:
        self.report = report
        self.sandbox = None

    def run(self, groups) -> dict:
        if self.report["sandbox"].get("status") == "failed to start" or (self.sandbox is None and not self._start()):
            return {"seconds": 0.0, "programs": 0}
        programs = [block.group(1) if (block := CODE_BLOCK.search(c.text)) else c.text for g in groups for c in g]
        t0 = time.perf_counter()
        results = self.sandbox.run_many(programs)
        seconds = time.perf_counter() - t0
        info = self.report["sandbox"]
        info["programs"] += len(results)
        info["ok"] += sum(r.ok for r in results)
        info["failed"] += sum(not r.ok for r in results)
        info["timed_out"] += sum(r.timed_out for r in results)
        info["seconds"] = round(info["seconds"] + seconds, 4)
        return {"seconds": seconds, "programs": len(results)}

    def _start(self) -> bool:
        from unifiedplayers.sandbox import Sandbox, SandboxConfig

        t0 = time.perf_counter()
        try:
            self.sandbox = Sandbox(SandboxConfig(timeout_s=5.0, memory_mb=512))
            self.sandbox.start()
        except Exception as exc:  # noqa: BLE001 - Landlock, namespaces or anything else missing there
            self.sandbox = None
            self.report["sandbox"] = {"status": "failed to start", "reason": f"{type(exc).__name__}: {exc}"}
            print(f"sandbox: not run ({type(exc).__name__}: {exc})", flush=True)
            return False
        self.report["sandbox"] = {"status": "ran", "start_s": round(time.perf_counter() - t0, 3),
                                  "isolation": self.sandbox.isolation, "programs": 0, "ok": 0, "failed": 0,
                                  "timed_out": 0, "seconds": 0.0}
        return True

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


def drain_after_backward(trainer, cuda: bool):
    """The trainer's clocks are host clocks, and CUDA runs asynchronously: a micro-batch's backward would finish
    inside the next one's forward timing. A hook on the input embedding's weight, whose gradient is the last one a
    backward pass accumulates, waits for the device there, so perf/time_backward holds the backward's work."""
    drain = torch.cuda.synchronize if cuda else (lambda: None)
    return trainer.compute_model.get_input_embeddings().weight.register_post_accumulate_grad_hook(lambda _: drain())


def run_player(check, backend: str, role: str) -> dict:
    """One player's run on ``backend``: its steps' tokens/s, time split and metrics, and its peak memory
    (``max_memory_allocated`` on GPU, the process's ``ru_maxrss`` on CPU)."""
    a = check.args
    record: dict[str, Any] = {"backend": backend, "player": role, "status": "ok", "steps": []}
    if check.cuda:
        torch.cuda.reset_peak_memory_stats(check.device)
    t0 = time.perf_counter()
    trainer = check.make_trainer(backend, role, check.player_config, seed=a.seed + PLAYERS.index(role))
    trainer.start_outer_iteration()
    trainer.start_block()
    hook = drain_after_backward(trainer, check.cuda)
    engine = check.engine_for(trainer)
    check.warm_up(engine)
    record["setup_s"] = round(time.perf_counter() - t0, 3)
    prompts = render_prompts(check.tokenizer, role, a.prompts)
    record["prompt_tokens_mean"] = sum(len(check.tokenizer(p, add_special_tokens=False)["input_ids"])
                                       for p in prompts) / len(prompts)
    for step in range(a.steps):
        record["steps"].append(player_step(check, trainer, engine, backend, role, prompts, step))
    record["peak_memory_bytes"] = (torch.cuda.max_memory_allocated(check.device) if check.cuda
                                   else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB
    hook.remove()
    release(trainer, engine)
    del trainer, engine
    release()
    if check.cuda:  # what a backend leaves behind would crowd the next player
        record["memory_after_release_bytes"] = torch.cuda.memory_allocated(check.device)
    return record


def player_step(check, trainer, engine, backend: str, role: str, prompts: list[str], step: int) -> dict:
    """Sample, run the sandbox (the Execution player), take one optimizer step; the step's figures, printed."""
    groups, gen_s = check.sample(engine, trainer, prompts, seed=check.args.seed * 1000 + step)
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    box = check.sandbox.run(groups) if role == "execution" else {"seconds": 0.0, "programs": 0}
    batch = check.train_samples(groups)
    clock = Clock(check.device)
    with clock():
        m = trainer.update(batch)
    logprob_s = m["perf/time_ref"] + m["perf/time_forward"]
    update_s = m["perf/time_backward"] + m["perf/time_optimizer"] + m.get("perf/time_weight_sync", 0.0)
    print(f"  {backend}/{role} step {step + 1}: {tokens} tokens in {gen_s:.2f} s "
          f"({tokens / max(gen_s, 1e-9):.0f} tok/s), log-prob passes {logprob_s:.2f} s, "
          f"update {update_s:.2f} s (update wall {clock.seconds:.2f} s), loss {m['actor/loss']:+.4g}", flush=True)
    return {"step": step + 1, "generated_tokens": tokens, "generation_s": gen_s,
            "tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
            "sandbox_s": box["seconds"], "sandbox_programs": box["programs"],
            "logprob_s": logprob_s, "update_s": update_s, "update_wall_s": clock.seconds,
            "trained_tokens": sum(len(s.token_ids) for s in batch),
            **{k: m[k] for k in ("perf/time_ref", "perf/time_forward", "perf/time_backward", "perf/time_optimizer",
                                 "perf/time_weight_sync", "actor/loss", "actor/grad_norm", "actor/kl",
                                 "perf/update_tflop") if k in m}}


def checksum(state: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def run_resume(check, backend: str, role: str) -> dict:
    """The exact-resume check of ``backend`` on ``role`` (the module docstring)."""
    layers = check.resume_layers()
    config = qwen3_config(check.args.shape, num_layers=layers, tokenizer=check.tokenizer)
    k = max(1, check.args.resume_after)
    result: dict[str, Any] = {"backend": backend, "player": role, "layers": layers, "after_step": k,
                              "parameters": count_parameters(config)}
    short = disk_short(check.args, result["parameters"] * 16, 1.5)  # fp32 weights, AdamW, reference
    if short:
        return {**result, "status": "not run", "reason": short}
    with scratch(check.args, "gpu-check-resume-") as directory, deterministic(check.cuda) as caught:
        result.update(resume_and_compare(check, backend, role, config, k, directory / "ckpt"))
    return {**result, "determinism_warnings": caught, "deterministic_algorithms": check.cuda}


def resume_and_compare(check, backend: str, role: str, config, k: int, path: Path) -> dict:
    """k updates, a checkpoint, update k + 1 recorded; then a replay of it from the checkpoint, compared."""
    a = check.args
    trainer = check.make_trainer(backend, role, config, seed=a.seed + 100)
    trainer.start_outer_iteration()
    engine = check.engine_for(trainer)
    prompts = render_prompts(check.tokenizer, role, a.prompts)
    for step in range(k + 1):
        groups, _ = check.sample(engine, trainer, prompts, seed=a.seed * 1000 + 500 + step)
        batch = check.train_samples(groups)
        if step < k:
            trainer.update(batch)
    t0 = time.perf_counter()
    trainer.save_checkpoint(path)
    save_s = time.perf_counter() - t0
    before = weights_on_host(trainer)
    first = trainer.update(batch)
    after = weights_on_host(trainer)
    release(trainer, engine)
    del trainer, engine
    release()

    replay, again, load_s, loaded_equal = replay_from(check, backend, role, config, path, batch, before, seed=200)
    equal, max_diff = compare(after, replay)
    _, step_delta = compare(before, after)
    same_metrics = all(first[key] == again[key] for key in ("actor/loss", "actor/grad_norm"))
    passed = equal and same_metrics and loaded_equal and step_delta > 0
    result = {"status": "PASS" if passed else "FAIL", "bitwise_equal": equal, "max_abs_diff": max_diff,
              "loaded_weights_equal": loaded_equal, "step_changed_weights_by": step_delta,
              "loss": [first["actor/loss"], again["actor/loss"]],
              "grad_norm": [first["actor/grad_norm"], again["actor/grad_norm"]],
              "checksum": [checksum(after), checksum(replay)],
              "checkpoint_bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
              "save_s": round(save_s, 3), "load_s": round(load_s, 3)}
    if not passed and loaded_equal:
        # A second replay from the same checkpoint: equal to the first one, the checkpoint lacks something.
        replay2, _, _, _ = replay_from(check, backend, role, config, path, batch, before, seed=300)
        repeatable, diff2 = compare(replay, replay2)
        result.update(replays_bitwise_equal=repeatable, replays_max_abs_diff=diff2, diagnosis=(
            "the replays agree with each other, not with the uninterrupted step: state is missing from the checkpoint"
            if repeatable else "the replays differ from each other too: non-deterministic kernels"))
    return result


def replay_from(check, backend: str, role: str, config, path: Path, batch: list, before: dict, seed: int):
    """A fresh trainer on a differently seeded model loads ``path`` and takes the step on ``batch``."""
    fresh = check.make_trainer(backend, role, config, seed=check.args.seed + seed)
    t0 = time.perf_counter()
    fresh.load_checkpoint(path)
    load_s = time.perf_counter() - t0
    loaded_equal, _ = compare(weights_on_host(fresh), before)
    metrics = fresh.update(batch)
    weights = weights_on_host(fresh)
    release(fresh)
    del fresh
    release()
    return weights, metrics, load_s, loaded_equal
