"""The GPU check's player runs: per player and trainer backend, ``--steps`` steps of sampling with our ``hf`` engine,
the Execution player's completions run through our sandbox, and one optimizer step on made-up advantages."""
from __future__ import annotations

import re
import time
from typing import Any

from benchmarks.gpu_check_model import PLAYERS, render_prompts
from benchmarks.gpu_check_state import Clock, drain_after_backward, peak_rss_bytes, release

CODE_BLOCK = re.compile(r"```python\n(.*?)(?:```|$)", re.S)


class SandboxRuns:
    """Our sandbox, started on first use, running the Execution player's completions as programs (their python
    block, else the whole text); its figures, or why it could not start, go to ``report["sandbox"]``."""

    def __init__(self, report: dict) -> None:
        self.report = report
        self.sandbox = None

    def run(self, groups) -> dict:
        if self.report["sandbox"].get("status") == "failed to start":
            return {"seconds": 0.0, "programs": 0}
        if self.sandbox is None and not self._start():
            return {"seconds": 0.0, "programs": 0}
        programs = []
        for group in groups:
            for c in group:
                block = CODE_BLOCK.search(c.text)
                programs.append(block.group(1) if block else c.text)
        t0 = time.perf_counter()
        results = self.sandbox.run_many(programs)
        seconds = time.perf_counter() - t0
        info = self.report["sandbox"]
        info["programs"] += len(results)
        info["ok"] += sum(r.ok for r in results)
        info["failed"] += sum(not r.ok for r in results)
        info["timed_out"] += sum(r.timed_out for r in results)
        info["seconds"] = round(info["seconds"] + seconds, 4)
        return {"seconds": seconds, "programs": len(results), "ok": sum(r.ok for r in results)}

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


def run_player(check, backend: str, role: str) -> dict:
    """One player's run on ``backend``: its steps' tokens/s, time split and metrics, and its peak memory."""
    import torch

    a = check.args
    record: dict[str, Any] = {"backend": backend, "player": role, "status": "ok", "steps": []}
    if check.cuda:
        torch.cuda.reset_peak_memory_stats(check.device)
    t0 = time.perf_counter()
    trainer = check.make_trainer(backend, role, check.config, seed=a.seed + PLAYERS.index(role))
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
                                   else peak_rss_bytes())
    hook.remove()
    release(trainer, engine)
    del trainer, engine
    release()
    if check.cuda:  # what a backend leaves behind would crowd the next player
        record["memory_after_release_bytes"] = torch.cuda.memory_allocated(check.device)
    return record


def player_step(check, trainer, engine, backend: str, role: str, prompts: list[str], step: int) -> dict:
    """Sample, run the sandbox (the Execution player), take one optimizer step; the step's figures, printed."""
    a = check.args
    groups, gen_s = check.sample(engine, trainer, prompts, seed=a.seed * 1000 + step)
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
          f"update {update_s:.2f} s (update wall {clock.seconds:.2f} s), loss {m['actor/loss']:+.4g}",
          flush=True)
    return {
        "step": step + 1, "generated_tokens": tokens, "generation_s": gen_s,
        "tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "sandbox_s": box["seconds"], "sandbox_programs": box["programs"],
        "logprob_s": logprob_s, "update_s": update_s, "update_wall_s": clock.seconds,
        "trained_tokens": sum(len(s.token_ids) for s in batch),
        **{k: m[k] for k in ("perf/time_ref", "perf/time_forward", "perf/time_backward",
                             "perf/time_optimizer", "perf/time_weight_sync", "actor/loss",
                             "actor/grad_norm", "actor/kl", "perf/update_tflop") if k in m},
    }
