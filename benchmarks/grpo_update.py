"""One GRPO step of SmolLM2-135M on CPU: UnifiedPlayers against TRL's GRPOTrainer, in one run.

Settings (issue 4): one prompt of 49 tokens, 8 completions forced to 256 new tokens (8 × 305 tokens), β = 0 and β = 0.04, fp32,
AdamW lr 1e-6. Our trainer runs as ``conf/trainer/torch.yaml`` configures it (micro-batches of 4 with
gradient accumulation, LM-head rows 1024 at a time); TRL as its ``GRPOConfig`` defaults it (one batch
of 8 with gradient checkpointing). Each configuration runs in its own subprocess so that
its peak RSS is its own; the table reports the last of ``--steps`` measured steps. Our trainer first
makes one cheap warm-up update on 16-token completions: it pays first-call costs and moves the policy
off π_ref, because at an iteration's first update π_θ = π_ref and our trainer skips the reference pass;
the measured β > 0 step therefore includes it, as TRL's does.

A step is split into
- generation: sampling the 8 completions (TRL: ``model.generate``; ours: the ``hf`` rollout),
- ref: the reference-policy pass (β > 0 only; TRL: its scoring pass after generation, i.e. the reference
  log-probs, rewards and advantages),
- forward: policy log-probs and the loss,
- backward, and
- optimizer: clipping, AdamW step, zero_grad.
"update" = ref + forward + backward + optimizer. Beside wall seconds, the CPU seconds of the generation,
the update and the step (all threads): on a shared machine the wall figures carry the neighbours' load.

Floor: our trainer reports each update's model FLOPs (``perf/update_tflop``, see
``unifiedplayers.trainer.flops``), and a first subprocess times every GEMM shape of the update alone on
these cores, each at its best operand layout. Their ratio is the least time any fp32 implementation of
the update needs on this machine, which tells whether a wall-clock target can be met here at all.
The same subprocess times the issue's yardstick, a plain forward+backward of the model over 8 × 305
tokens (9.5 s on the machine of the issue's figures), and every update is also shown at that machine's speed.

Run:  .venv/bin/pip install -e '.[bench]'   (TRL is never a runtime dependency)
      .venv/bin/python benchmarks/grpo_update.py [--steps 1] [--threads 2] [--only ours,trl,zero2]
          [--micro-batch 8 --chunk-rows 0]   (default: conf/trainer/torch.yaml's values)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# 49 prompt tokens with SmolLM2's chat template, so that a row is 49 + 256 = 305 tokens as in the issue's
# figures (without a system message the template adds a 41-token default one).
SYSTEM = "Reason step by step."
QUESTION = "A train leaves at 3 pm and travels 240 km at 80 km/h. At what time does it arrive there?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
NUM_COMPLETIONS = 8
NEW_TOKENS = 256
WARMUP_TOKENS = 16
LR = 1e-6
PLAIN_TOKENS = 305  # the issue's "plain forward+backward over the same 8 × 305 tokens"
ISSUE_PLAIN_SECONDS = 9.5  # ... took this long on the machine of the issue's figures


def letter_reward(text: str) -> float:
    """Toy reward with some spread across the group: share of lowercase letters in the completion."""
    return sum(c.islower() for c in text) / max(len(text), 1)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _trainer_preset() -> dict:
    """micro_batch_size and logprob_chunk_rows of our torch trainer preset."""
    from omegaconf import OmegaConf

    yaml = OmegaConf.load(ROOT / "conf" / "trainer" / "torch.yaml")
    return {"micro_batch": int(yaml.micro_batch_size), "chunk_rows": int(yaml.logprob_chunk_rows)}


def _model_cfg():
    from omegaconf import OmegaConf

    from unifiedplayers.config import ModelConfig

    yaml = OmegaConf.load(ROOT / "conf" / "model" / "smollm2_135m_instruct.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


# ---------------------------------------------------------------------------------------------- ours
def worker_ours(beta: float, steps: int, backend: str, micro_batch: int, chunk_rows: int) -> dict:
    import torch

    from unifiedplayers import grpo
    from unifiedplayers.config import RolloutConfig, TrainerConfig
    from unifiedplayers.models import load_model
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.trainer import build_trainer, sample_from_completion

    torch.manual_seed(0)
    model, tokenizer = load_model(_model_cfg())
    prompt = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rollout = build_rollout(RolloutConfig(max_new_tokens=NEW_TOKENS, temperature=1.0), model, tokenizer)
    cfg = TrainerConfig(
        backend=backend,
        lr=LR,
        micro_batch_size=micro_batch,
        logprob_chunk_rows=chunk_rows,
        kl_coef=beta,
        entropy_every=0,
        num_threads=torch.get_num_threads(),
    )
    trainer = build_trainer(cfg, model, role="bench", pad_token_id=tokenizer.pad_token_id or 0)
    trainer.start_outer_iteration()
    # Warm-up update on short completions: first-call costs (Adam state allocation, kernel caches) are paid
    # here, and the policy moves away from π_ref, so a measured β > 0 step includes its reference pass.
    warm = rollout.generate([prompt_ids], n=NUM_COMPLETIONS, max_new_tokens=WARMUP_TOKENS, ignore_eos=True, seed=99)[0]
    warm_adv = grpo.group_advantages(torch.tensor([letter_reward(c.text) for c in warm]), torch.zeros(len(warm)))
    trainer.update([sample_from_completion(c, float(a), 0) for c, a in zip(warm, warm_adv)])
    records = []
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        outs = rollout.generate([prompt_ids], n=NUM_COMPLETIONS, ignore_eos=True, seed=step)[0]
        t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
        assert all(len(c.token_ids) == NEW_TOKENS for c in outs)
        rewards = torch.tensor([letter_reward(c.text) for c in outs])
        adv = grpo.group_advantages(rewards, torch.zeros(len(outs), dtype=torch.long))
        batch = [sample_from_completion(c, float(a), 0) for c, a in zip(outs, adv)]
        t1, c1 = time.perf_counter(), time.process_time()
        m = trainer.update(batch)
        t_update, c_update = time.perf_counter() - t1, time.process_time() - c1
        rollout.update_weights(trainer.model)
        print(f"step {step}: generation {t_gen:.1f} s, update {t_update:.1f} s", file=sys.stderr, flush=True)
        records.append(
            {
                "generation": t_gen,
                "ref": m["perf/time_ref"],
                "forward": m["perf/time_forward"],
                "backward": m["perf/time_backward"],
                "optimizer": m["perf/time_optimizer"],
                "update": t_update,
                "step": time.perf_counter() - t0,
                "cpu_generation": c_gen,
                "cpu_update": c_update,
                "cpu_step": time.process_time() - c0,
                "tokens": sum(len(s.token_ids) for s in batch) / len(batch),
                "update_tflop": m["perf/update_tflop"],
            }
        )
    return {"steps": records, "peak_rss_mib": peak_rss_mib()}


# ---------------------------------------------------------------------------------------------- floor
def _mm_rate(m: int, k: int, n: int, reps: int) -> float:
    """Best GFLOP/s of an fp32 (m, k) @ (k, n) product over the three operand layouts torch passes to BLAS."""
    import torch

    best = 0.0
    for a_t, b_t in ((False, False), (False, True), (True, False)):
        a = torch.randn(k, m).t() if a_t else torch.randn(m, k)
        b = torch.randn(n, k).t() if b_t else torch.randn(k, n)
        out = torch.empty(m, n)
        torch.mm(a, b, out=out)  # warm-up
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9)
    return best


def worker_floor(micro_batch: int) -> dict:
    """How fast this machine can do the update's matmuls: each GEMM shape of one micro-batch's forward and
    backward (linear layers and LM head, on the micro-batch's completion rows) timed alone at its best
    operand layout. The update cannot run faster than its model FLOPs at these rates. Also the issue's
    yardstick, a plain forward+backward, which relates this machine's speed to the issue's figures."""
    from collections import Counter

    import torch
    from torch import nn

    from unifiedplayers.models import load_model
    from unifiedplayers.trainer.logprobs import split_causal_lm

    model, _ = load_model(_model_cfg())
    body, head = split_causal_lm(model)
    rows = micro_batch * NEW_TOKENS
    layers = Counter((m.in_features, m.out_features) for m in [*body.modules(), head] if isinstance(m, nn.Linear))
    flop, seconds, best = 0.0, 0.0, 0.0
    for (fan_in, fan_out), count in layers.items():
        reps = 2 if fan_out > 10_000 else 8
        # forward x W^T, input gradient g W, weight gradient g^T x
        for m, k, n in ((rows, fan_in, fan_out), (rows, fan_out, fan_in), (fan_out, rows, fan_in)):
            rate = _mm_rate(m, k, n, reps)
            best = max(best, rate)
            flop += 2 * m * k * n * count
            seconds += 2 * m * k * n * count / (rate * 1e9)
    # The issue's yardstick: a plain forward+backward of the model (transformers' own loss, all logits) over
    # 8 rows of 49 + 256 tokens, in one batch. It took 9.5 s on the machine of the issue's figures.
    ids = torch.randint(0, model.config.vocab_size, (NUM_COMPLETIONS, PLAIN_TOKENS), generator=torch.Generator().manual_seed(0))
    model.train()
    model(input_ids=ids[:, :16], labels=ids[:, :16]).loss.backward()  # warm-up
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    plain = time.perf_counter() - t
    return {"matmul_gflop_per_s": flop / seconds / 1e9, "best_gflop_per_s": best, "rows": rows, "plain_seconds": plain}


# ---------------------------------------------------------------------------------------------- TRL
def worker_trl(beta: float, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from unifiedplayers.models import load_model, model_cache_dir

    cfg = _model_cfg()
    load_model(cfg)  # makes sure the safetensors cache exists (first load dequantizes the GGUF file)
    model_dir = str(model_cache_dir(cfg))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    timings: list[dict] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            timings[-1]["generation_and_scoring"] = time.perf_counter() - t
            return out

        def _generate(self, prompts):
            t, c = time.perf_counter(), time.process_time()
            out = super()._generate(prompts)
            timings[-1]["generation"] = time.perf_counter() - t
            timings[-1]["cpu_generation"] = time.process_time() - c
            return out

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            t = time.perf_counter()
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            timings[-1]["forward"] = time.perf_counter() - t
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            t = time.perf_counter()
            out = super().training_step(model, inputs, num_items_in_batch)
            timings[-1]["training_step"] = time.perf_counter() - t
            return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timings.append({"t0": time.perf_counter(), "c0": time.process_time()})

        def on_step_end(self, args, state, control, **kw):
            timings[-1]["step"] = time.perf_counter() - timings[-1].pop("t0")
            timings[-1]["cpu_step"] = time.process_time() - timings[-1].pop("c0")

    def reward(completions, **kw):
        return [letter_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=NUM_COMPLETIONS,
            num_generations=NUM_COMPLETIONS,
            max_completion_length=NEW_TOKENS,
            generation_kwargs={"min_new_tokens": NEW_TOKENS},  # forced length, as ours (ignore_eos)
            temperature=1.0,
            beta=beta,
            learning_rate=LR,
            adam_beta1=0.9,
            adam_beta2=0.95,
            weight_decay=0.01,
            max_grad_norm=1.0,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            dataloader_num_workers=0,
            seed=0,
        )
        data = Dataset.from_list([{"prompt": MESSAGES}] * steps)
        trainer = Timed(
            model=model_dir,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[StepClock()],
        )
        torch.manual_seed(0)
        trainer.train()
    records = []
    for t in timings:
        gen = t.get("generation", 0.0)
        scoring = t.get("generation_and_scoring", gen)
        fwd = t.get("forward", 0.0)
        # transformers' training_step = _prepare_inputs (generation and scoring) + compute_loss + backward
        backward = t["training_step"] - scoring - fwd
        records.append(
            {
                "generation": gen,
                "ref": scoring - gen,  # reference (β > 0) and old-policy passes, reward, advantages
                "forward": fwd,
                "backward": backward,
                "optimizer": t["step"] - t["training_step"],
                "update": t["step"] - gen,
                "step": t["step"],
                "cpu_generation": t.get("cpu_generation", 0.0),
                "cpu_update": t["cpu_step"] - t.get("cpu_generation", 0.0),
                "cpu_step": t["cpu_step"],
            }
        )
    return {"steps": records, "peak_rss_mib": peak_rss_mib()}


# ---------------------------------------------------------------------------------------------- main
RUNS = {
    "ours": [("ours torch", "ours", 0.0, "torch"), ("ours torch", "ours", 0.04, "torch")],
    "trl": [("TRL GRPOTrainer", "trl", 0.0, None), ("TRL GRPOTrainer", "trl", 0.04, None)],
    "zero2": [("ours DeepSpeed ZeRO-2", "ours", 0.04, "deepspeed_zero2")],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: the cores this process may use)")
    parser.add_argument("--only", default="ours,trl,zero2")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--micro-batch", type=int, help="our micro-batch size (default: conf/trainer/torch.yaml)")
    parser.add_argument("--chunk-rows", type=int, help="our trainer.logprob_chunk_rows (default: conf/trainer/torch.yaml)")
    a = parser.parse_args()
    preset = _trainer_preset()
    a.micro_batch = preset["micro_batch"] if a.micro_batch is None else a.micro_batch
    a.chunk_rows = preset["chunk_rows"] if a.chunk_rows is None else a.chunk_rows

    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        if a.worker == "trl":
            result = worker_trl(a.beta, a.steps)
        elif a.worker == "floor":
            result = worker_floor(a.micro_batch)
        else:
            result = worker_ours(a.beta, a.steps, a.backend, a.micro_batch, a.chunk_rows)
        print("RESULT " + json.dumps(result), flush=True)
        return

    def run_worker(worker: str, beta: float = 0.0, backend: str = "torch") -> dict | None:
        cmd = [sys.executable, __file__, "--worker", worker, "--beta", str(beta), "--steps", str(a.steps),
               "--threads", str(a.threads), "--backend", backend,
               "--micro-batch", str(a.micro_batch), "--chunk-rows", str(a.chunk_rows)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"{worker} β={beta}: FAILED\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", file=sys.stderr)
            return None
        return json.loads(lines[-1][len("RESULT "):])

    load_start = os.getloadavg()[0]
    floor = run_worker("floor") if "ours" in a.only.split(",") else None
    rows = []
    for key in a.only.split(","):
        for label, worker, beta, backend in RUNS[key]:
            t = time.perf_counter()
            result = run_worker(worker, beta, backend or "torch")
            if result is None:
                continue
            result.update(label=label, beta=beta, wall=time.perf_counter() - t)
            rows.append(result)
            last = result["steps"][-1]
            print(f"done: {label} β={beta}: step {last['step']:.1f} s, update {last['update']:.1f} s, "
                  f"peak RSS {result['peak_rss_mib']:.0f} MiB", flush=True)

    print(f"\nGRPO step, SmolLM2-135M fp32, CPU, {a.threads} threads; 1 prompt × {NUM_COMPLETIONS} completions × "
          f"{NEW_TOKENS} new tokens; ours: micro-batch {a.micro_batch}, logprob_chunk_rows {a.chunk_rows}; last of {a.steps} measured steps; seconds; 1-min load average "
          f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end (other processes share the CPUs)")
    head = f"{'implementation':24s} {'β':>5s} {'gen':>6s} {'ref':>6s} {'fwd':>6s} {'bwd':>6s} {'optim':>6s} " \
           f"{'update':>7s} {'step':>6s} {'peak RSS MiB':>12s} | {'CPU s: gen':>10s} {'update':>7s} {'step':>6s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["steps"][-1]
        print(f"{r['label']:24s} {r['beta']:5.2f} {s['generation']:6.1f} {s['ref']:6.1f} {s['forward']:6.1f} "
              f"{s['backward']:6.1f} {s['optimizer']:6.1f} {s['update']:7.1f} {s['step']:6.1f} "
              f"{r['peak_rss_mib']:12.0f} | {s['cpu_generation']:10.1f} {s['cpu_update']:7.1f} {s['cpu_step']:6.1f}")
    by = {(r["label"], r["beta"]): r for r in rows}
    for beta in (0.0, 0.04):
        ours, trl = by.get(("ours torch", beta)), by.get(("TRL GRPOTrainer", beta))
        if ours and trl:
            o, t = ours["steps"][-1], trl["steps"][-1]
            print(f"β={beta}: ours/TRL step {o['step'] / t['step']:.2f}× (target ≤ 0.8; CPU seconds "
                  f"{o['cpu_step'] / t['cpu_step']:.2f}×), update {o['update']:.1f} s "
                  f"(target ≤ 10), generation {o['generation']:.1f} vs {t['generation']:.1f} s, "
                  f"peak RSS {ours['peak_rss_mib']:.0f} vs {trl['peak_rss_mib']:.0f} MiB (target ≤ TRL)")
    if floor:
        print(f"Matmul rate of this machine on the update's GEMM shapes ({floor['rows']} rows, each shape at its best "
              f"operand layout): {floor['matmul_gflop_per_s']:.0f} GFLOP/s over all of them, "
              f"{floor['best_gflop_per_s']:.0f} GFLOP/s on the fastest")
        scale = ISSUE_PLAIN_SECONDS / floor["plain_seconds"]
        print(f"Plain forward+backward of the model over {NUM_COMPLETIONS} × {PLAIN_TOKENS} tokens (transformers' loss, "
              f"one batch): {floor['plain_seconds']:.1f} s here, {ISSUE_PLAIN_SECONDS} s on the machine of the issue's "
              f"figures: this machine is {1 / scale:.2f}× slower")
        for r in rows:
            s = r["steps"][-1]
            print(f"{r['label']} β={r['beta']}: update {s['update']:.1f} s = {s['update'] / floor['plain_seconds']:.2f}× "
                  f"the plain pass, {s['update'] * scale:.1f} s at the issue's machine's speed")
            if "update_tflop" in s:  # ours
                print(f"{r['label']} β={r['beta']}: update {s['update']:.1f} s for {s['update_tflop']:.2f} TFLOP of model "
                      f"FLOPs = {s['update_tflop'] * 1e3 / s['update']:.0f} GFLOP/s; at the matmul rate above they need "
                      f"{s['update_tflop'] * 1e3 / floor['matmul_gflop_per_s']:.1f} s, at the fastest shape's "
                      f"{s['update_tflop'] * 1e3 / floor['best_gflop_per_s']:.1f} s (floors on these cores)")
    torch_run, zero2 = by.get(("ours torch", 0.04)), by.get(("ours DeepSpeed ZeRO-2", 0.04))
    if torch_run and zero2:
        o, z = torch_run["steps"][-1], zero2["steps"][-1]
        print(f"β=0.04: torch vs DeepSpeed ZeRO-2 update {o['update']:.1f} vs {z['update']:.1f} s "
              f"(forward {o['forward']:.1f} vs {z['forward']:.1f}, backward {o['backward']:.1f} vs {z['backward']:.1f}, "
              f"optimizer {o['optimizer']:.1f} vs {z['optimizer']:.1f}), "
              f"peak RSS {torch_run['peak_rss_mib']:.0f} vs {zero2['peak_rss_mib']:.0f} MiB")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": rows, "floor": floor}, indent=2))


if __name__ == "__main__":
    main()
