"""One GRPO step of SmolLM2-135M on CPU: UnifiedPlayers against TRL's GRPOTrainer, in one run.

Settings (those the update's targets in benchmarks/README.md were set for): one prompt of 49 tokens, 8 completions forced to 256 new tokens (8 × 305 tokens),
β = 0 and β = 0.04, fp32 (and bf16 with ``--dtypes``, below), AdamW lr 1e-6. Our trainer runs as
``conf/trainer/torch.yaml`` configures it (micro-batches of 4 with gradient accumulation, LM-head rows 1024
at a time); TRL as its ``GRPOConfig`` defaults it (one batch of 8 with gradient checkpointing). Each
configuration runs in its own subprocess so that its peak RSS is its own; the table reports the last of
``--steps`` measured steps. Our trainer first
makes one cheap warm-up update on 16-token completions (fewer with ``--new-tokens`` below 16): it pays
first-call costs and moves the policy off π_ref, because at an iteration's first update π_θ = π_ref and our
trainer skips the reference pass; the measured β > 0 step therefore includes it, as TRL's does.

A step is split into
- generation: sampling the 8 completions (TRL: ``model.generate``; ours: the ``hf`` rollout),
- ref: the reference-policy pass (β > 0 only; TRL: its scoring pass after generation, i.e. the reference
  log-probs, rewards and advantages),
- forward: policy log-probs and the loss,
- backward, and
- optimizer: clipping, AdamW step, zero_grad, and
- sync (ours): refreshing the bf16 copy of the weights after the step (nothing to do in fp32).
"update" = ref + forward + backward + optimizer (+ sync). Beside wall seconds, the CPU seconds of the generation,
the update and the step (all threads): on a shared machine the wall figures carry the neighbours' load.

Floor: our trainer reports each update's model FLOPs (``perf/update_tflop``, see
``unifiedplayers.trainer.flops``), and a first subprocess times every GEMM shape of the update alone on
these cores, each at its best operand layout (in each dtype run). Their ratio is the least time any
implementation of the update needs in that dtype on this machine, which tells whether a wall-clock target can be met here at all.
The same subprocess times the yardstick the targets were set against, a plain forward+backward of the model over
8 × 305 tokens (9.5 s on the reference machine, where the targets were set), and every update is also shown at that
machine's speed.

Precision (``--dtypes``, default ``float32,auto``): each of our configurations runs once per dtype, in its own
subprocess: the rollout samples from ``trainer.sampling_model(dtype)`` and the update runs with
``TrainerConfig(dtype=...)`` (bf16: float32 master weights and AdamW state, forward and backward through the
bf16 copy, which the rollout shares). ``auto`` resolves as a run would (``unifiedplayers.precision.auto_dtype``:
bf16 where the CPU has amx_bf16 or avx512_bf16); the printout names the path and the reason, and an ``auto``
that resolves to a dtype already in the list is not run twice. TRL runs with ``bf16=True`` (autocast over
float32 weights) for bf16 and ``bf16=False`` for fp32; ZeRO-2 runs in fp32 only. The table then gives each
dtype's phases and the ratios of one run: ours fp32 / ours bf16 (the target, on a CPU with native bf16:
≥ 2.5× per step) and TRL bf16 / ours bf16 (target > 1), with the load average beside them.

Floors per dtype (``benchmarks/precision_floors.py``): the update's GEMM shapes timed in fp32 and bf16, and
the machine's memory bandwidth, measured in the floor subprocess; each of our updates is set against its
dtype's GEMM floor (target ≥ 50% in bf16), phase by phase, and each generation against ``new tokens ×
weight bytes in its dtype / bandwidth`` (target ≤ 2× in the chosen dtype). On a CPU without native bf16 the
bf16 rows are emulated and slower than fp32: they are printed as they are.

Run:  .venv/bin/pip install -e '.[bench]'   (TRL is never a runtime dependency)
      .venv/bin/python -m benchmarks.grpo_update [--steps 1] [--threads 2] [--only ours,trl,zero2]
          [--dtypes float32,bfloat16,auto] [--betas 0,0.04] [--new-tokens 256]
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

from benchmarks.update_inputs import MESSAGES, load_fp32_model, model_cfg, prompt_ids

ROOT = Path(__file__).resolve().parents[1]
NUM_COMPLETIONS = 8
NEW_TOKENS = 256
WARMUP_TOKENS = 16
LR = 1e-6
PLAIN_TOKENS = 305  # the yardstick of the targets: a plain forward+backward over the same 8 × 305 tokens
REFERENCE_PLAIN_SECONDS = 9.5  # ... took this long on the reference machine, where the targets were set


def letter_reward(text: str) -> float:
    """Toy reward with some spread across the group: share of lowercase letters in the completion."""
    return sum(c.islower() for c in text) / max(len(text), 1)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _trainer_preset() -> dict:
    """micro_batch_size and logprob_chunk_rows of our torch trainer preset."""
    from omegaconf import OmegaConf

    from unifiedplayers.config import TrainerConfig

    yaml = OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.load(ROOT / "conf/trainer/torch.yaml"))
    return {"micro_batch": int(yaml.micro_batch_size), "chunk_rows": int(yaml.logprob_chunk_rows)}


# ---------------------------------------------------------------------------------------------- ours
def worker_ours(beta: float, steps: int, backend: str, micro_batch: int, chunk_rows: int, dtype: str = "float32",
                new_tokens: int = NEW_TOKENS) -> dict:
    import torch

    from unifiedplayers.trainer import grpo
    from unifiedplayers.config import RolloutConfig, TrainerConfig
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.trainer import build_trainer, sample_from_completion

    torch.manual_seed(0)
    model, tokenizer = load_fp32_model()
    prompt = prompt_ids(tokenizer)
    cfg = TrainerConfig(
        backend=backend,
        lr=LR,
        micro_batch_size=micro_batch,
        logprob_chunk_rows=chunk_rows,
        kl_coef=beta,
        entropy_every=0,
        num_threads=torch.get_num_threads(),
        dtype=dtype,
    )
    trainer = build_trainer(cfg, model, role="bench", pad_token_id=tokenizer.pad_token_id or 0)
    sampling_dtype = getattr(torch, dtype)
    # The rollout samples from the policy in this dtype: the master weights in fp32, else the bf16 copy the
    # trainer refreshes after each optimizer step (the same module its forward and backward run through).
    rollout = build_rollout(RolloutConfig(max_new_tokens=new_tokens, temperature=1.0),
                            trainer.sampling_model(sampling_dtype), tokenizer)
    trainer.start_outer_iteration()
    # Warm-up update on short completions: first-call costs (Adam state allocation, kernel caches) are paid
    # here, and the policy moves away from π_ref, so a measured β > 0 step includes its reference pass.
    warm = rollout.generate([prompt], n=NUM_COMPLETIONS, max_new_tokens=min(WARMUP_TOKENS, new_tokens),
                            ignore_eos=True, seed=99)[0]
    warm_adv = grpo.group_advantages(torch.tensor([letter_reward(c.text) for c in warm]), torch.zeros(len(warm)))
    trainer.update([sample_from_completion(c, float(a), 0) for c, a in zip(warm, warm_adv)])
    records = []
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        outs = rollout.generate([prompt], n=NUM_COMPLETIONS, ignore_eos=True, seed=step)[0]
        t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
        assert all(len(c.token_ids) == new_tokens for c in outs)
        rewards = torch.tensor([letter_reward(c.text) for c in outs])
        adv = grpo.group_advantages(rewards, torch.zeros(len(outs), dtype=torch.long))
        batch = [sample_from_completion(c, float(a), 0) for c, a in zip(outs, adv)]
        t1, c1 = time.perf_counter(), time.process_time()
        m = trainer.update(batch)
        t_update, c_update = time.perf_counter() - t1, time.process_time() - c1
        rollout.update_weights(trainer.sampling_model(sampling_dtype))
        print(f"step {step}: generation {t_gen:.1f} s, update {t_update:.1f} s", file=sys.stderr, flush=True)
        records.append(
            {
                "generation": t_gen,
                "ref": m["perf/time_ref"],
                "forward": m["perf/time_forward"],
                "backward": m["perf/time_backward"],
                "optimizer": m["perf/time_optimizer"],
                "weight_sync": m["perf/time_weight_sync"],
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
def worker_floor(micro_batch: int, chunk_rows: int, dtypes: list[str], new_tokens: int = NEW_TOKENS) -> dict:
    """How fast this machine can do the update's matmuls and read the weights (``precision_floors``): the GEMM
    rate of every shape of one micro-batch's forward and backward (the decoder's linear layers on its prompt and
    completion rows, the LM head on a chunk of its completion rows), each at its best operand layout, per dtype; the memory bandwidth and the bytes of the weights
    per dtype (the decoding floor). The update cannot run faster than its model FLOPs at these rates. Also the
    targets' yardstick, a plain fp32 forward+backward, which relates this machine's speed to the reference
    machine's (only at the targets' 256 new tokens)."""
    import torch

    from benchmarks.precision_floors import gemm_floors, memory_bandwidth, update_rows, weight_bytes

    model, tokenizer = load_fp32_model()
    rows, head_rows = update_rows(len(prompt_ids(tokenizer)), new_tokens, micro_batch, chunk_rows)
    gemm = gemm_floors(model, rows, head_rows, dtypes)
    bandwidth = memory_bandwidth()
    plain = None
    if new_tokens == NEW_TOKENS:
        # The targets' yardstick: a plain forward+backward of the model (transformers' own loss, all logits) over
        # 8 rows of 49 + 256 tokens, in one batch. It took 9.5 s on the reference machine.
        ids = torch.randint(0, model.config.vocab_size, (NUM_COMPLETIONS, PLAIN_TOKENS),
                            generator=torch.Generator().manual_seed(0))
        model.train()
        model(input_ids=ids[:, :16], labels=ids[:, :16]).loss.backward()  # warm-up
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        plain = time.perf_counter() - t
    return {"gemm": gemm, "bandwidth": bandwidth, "weight_bytes": {d: weight_bytes(model, d) for d in dtypes},
            "rows": rows, "head_rows": head_rows, "plain_seconds": plain}


# ---------------------------------------------------------------------------------------------- TRL
def worker_trl(beta: float, steps: int, dtype: str = "float32", new_tokens: int = NEW_TOKENS) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from unifiedplayers.models import load_model, model_cache_dir

    cfg = model_cfg()
    load_model(cfg)  # makes sure the safetensors cache exists (first load dequantizes the GGUF file)
    model_dir = str(model_cache_dir(cfg))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    timings: list[dict] = []
    Timed, StepClock = timed_trl_trainer(timings)

    def reward(completions, **kw):
        return [letter_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=NUM_COMPLETIONS,
            num_generations=NUM_COMPLETIONS,
            max_completion_length=new_tokens,
            generation_kwargs={"min_new_tokens": new_tokens},  # forced length, as ours (ignore_eos)
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
            # bf16: transformers' mixed precision (autocast to bf16 over the float32 weights, which stay the
            # master copy, as ours); the model is loaded in float32 (GRPOTrainer's default dtype for a path).
            bf16=dtype == "bfloat16",
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
    return {"steps": trl_records(timings), "peak_rss_mib": peak_rss_mib()}


def timed_trl_trainer(timings: list[dict]):
    """(a GRPOTrainer subclass that times its generation, scoring, loss and training step into ``timings[-1]``, a
    callback that opens a step's entry and closes it with the step's wall and CPU seconds)."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

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

    return Timed, StepClock


def trl_records(timings: list[dict]) -> list[dict]:
    """TRL's step timings split as ours are (the module docstring)."""
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
    return records


# ---------------------------------------------------------------------------------------------- main
IMPLEMENTATIONS = {  # --only key: (label, worker, backend, dtypes it runs in)
    "ours": ("ours torch", "ours", "torch", ("float32", "bfloat16")),
    "trl": ("TRL GRPOTrainer", "trl", None, ("float32", "bfloat16")),
    "zero2": ("ours DeepSpeed ZeRO-2", "ours", "deepspeed_zero2", ("float32",)),
}
ZERO2_BETAS = (0.04,)


def _fmt(value, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.{digits}f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: the cores this process may use)")
    parser.add_argument("--only", default="ours,trl,zero2")
    parser.add_argument("--dtypes", default="float32,auto",
                        help="float32, bfloat16 and/or auto (resolved as a run resolves it); default float32,auto")
    parser.add_argument("--betas", default="0,0.04", help="KL coefficients β to run (ZeRO-2: β=0.04 only)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS,
                        help=f"completion tokens per sample (default {NEW_TOKENS}, the targets' shapes)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--micro-batch", type=int, help="our micro-batch size (default: conf/trainer/torch.yaml)")
    parser.add_argument("--chunk-rows", type=int, help="our trainer.logprob_chunk_rows (default: conf/trainer/torch.yaml)")
    a = parser.parse_args()
    preset = _trainer_preset()
    a.micro_batch = preset["micro_batch"] if a.micro_batch is None else a.micro_batch
    a.chunk_rows = preset["chunk_rows"] if a.chunk_rows is None else a.chunk_rows

    return a


def run_worker(a: argparse.Namespace, worker: str, beta: float = 0.0, backend: str = "torch",
               dtype: str = "float32") -> dict | None:
    """One configuration in its own subprocess (its peak RSS its own): its RESULT line, or None when it failed."""
    cmd = [sys.executable, "-m", "benchmarks.grpo_update", "--worker", worker, "--beta", str(beta),
           "--steps", str(a.steps), "--threads", str(a.threads), "--backend", backend, "--dtype", dtype,
           "--new-tokens", str(a.new_tokens), "--micro-batch", str(a.micro_batch), "--chunk-rows", str(a.chunk_rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"{worker} {dtype} β={beta}: FAILED\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT "):])


def run_worker_here(a: argparse.Namespace) -> None:
    """This process is a configuration's subprocess (``--worker``): run it, print its RESULT line."""
    import torch

    torch.set_num_threads(a.threads)
    if a.worker == "trl":
        result = worker_trl(a.beta, a.steps, a.dtype, a.new_tokens)
    elif a.worker == "floor":
        result = worker_floor(a.micro_batch, a.chunk_rows, a.dtype.split(","), a.new_tokens)
    else:
        result = worker_ours(a.beta, a.steps, a.backend, a.micro_batch, a.chunk_rows, a.dtype, a.new_tokens)
    print("RESULT " + json.dumps(result), flush=True)


def run_all(a: argparse.Namespace, dtypes: list[str], betas: list[float], only: list[str]) -> tuple[dict | None, list]:
    """(the floors, measured first when ours runs; one result per configuration, in the order run)."""
    floor = None
    if "ours" in only:
        t = time.perf_counter()
        floor = run_worker(a, "floor", dtype=",".join(dtypes))
        if floor:
            print(f"done: floors ({', '.join(dtypes)}) in {time.perf_counter() - t:.0f} s", flush=True)
    rows = []
    for key in only:
        label, worker, backend, runs_in = IMPLEMENTATIONS[key]
        for dtype in dtypes:
            if dtype not in runs_in:
                continue
            for beta in betas:
                if key == "zero2" and beta not in ZERO2_BETAS:
                    continue
                t, load_before = time.perf_counter(), os.getloadavg()[0]
                result = run_worker(a, worker, beta, backend or "torch", dtype)
                if result is None:
                    continue
                result.update(label=label, dtype=dtype, beta=beta, wall=time.perf_counter() - t,
                              load=[load_before, os.getloadavg()[0]])
                rows.append(result)
                last = result["steps"][-1]
                print(f"done: {label} {dtype} β={beta}: step {last['step']:.1f} s, update {last['update']:.1f} s, "
                      f"peak RSS {result['peak_rss_mib']:.0f} MiB", flush=True)
    return floor, rows


def print_table(a: argparse.Namespace, rows: list, requested: list, path: str, load_start: float) -> None:
    """Each configuration's last measured step, phase by phase, wall and CPU seconds."""
    print(f"\nGRPO step, SmolLM2-135M, CPU, {a.threads} threads; 1 prompt × {NUM_COMPLETIONS} completions × "
          f"{a.new_tokens} new tokens; ours: micro-batch {a.micro_batch}, logprob_chunk_rows {a.chunk_rows}; last of "
          f"{a.steps} measured steps; seconds; 1-min load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} "
          f"at end (other processes share the CPUs)")
    print(path)
    for given, name, why in requested:
        if given == "auto":
            print(f"--dtypes auto -> {name} ({why}); its figures are the {name} rows")
    head = f"{'implementation':22s} {'dtype':8s} {'β':>5s} {'gen':>6s} {'ref':>6s} {'fwd':>6s} {'bwd':>6s} {'optim':>6s} " \
           f"{'sync':>5s} {'update':>7s} {'step':>6s} {'RSS MiB':>8s} | {'CPU s: gen':>10s} {'update':>7s} {'step':>6s} | load"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["steps"][-1]
        print(f"{r['label']:22s} {r['dtype']:8s} {r['beta']:5.2f} {s['generation']:6.1f} {s['ref']:6.1f} {s['forward']:6.1f} "
              f"{s['backward']:6.1f} {s['optimizer']:6.1f} {_fmt(s.get('weight_sync'), 5, 2)} {s['update']:7.1f} "
              f"{s['step']:6.1f} {r['peak_rss_mib']:8.0f} | {s['cpu_generation']:10.1f} {s['cpu_update']:7.1f} "
              f"{s['cpu_step']:6.1f} | {r['load'][0]:.1f}->{r['load'][1]:.1f}")


def print_ratios(a: argparse.Namespace, by: dict, betas: list[float], native: bool) -> None:
    """The ratios of this run against the targets (benchmarks/README.md), the load average beside them."""
    def load_of(r: dict) -> str:
        return f"load {r['load'][0]:.1f}->{r['load'][1]:.1f}"

    print("\nRatios of this run (1-min load average at the start and end of each configuration beside them):")
    if a.new_tokens != NEW_TOKENS:
        print(f"(the fp32 targets below are for {NEW_TOKENS} new tokens; this run has {a.new_tokens})")
    for beta in betas:
        o32, o16 = by.get(("ours torch", "float32", beta)), by.get(("ours torch", "bfloat16", beta))
        t32, t16 = by.get(("TRL GRPOTrainer", "float32", beta)), by.get(("TRL GRPOTrainer", "bfloat16", beta))
        if o32 and t32:
            o, t = o32["steps"][-1], t32["steps"][-1]
            print(f"β={beta}: fp32 ours/TRL step {o['step'] / t['step']:.2f}× (target ≤ 0.8; CPU seconds "
                  f"{o['cpu_step'] / t['cpu_step']:.2f}×), update {o['update']:.1f} s "
                  f"(target ≤ 10), generation {o['generation']:.1f} vs {t['generation']:.1f} s, "
                  f"peak RSS {o32['peak_rss_mib']:.0f} vs {t32['peak_rss_mib']:.0f} MiB (target ≤ TRL); "
                  f"{load_of(o32)}, {load_of(t32)}")
        if o32 and o16:
            x, y = o32["steps"][-1], o16["steps"][-1]
            target = "target ≥ 2.5× on a CPU with native bf16" if native else \
                "no native bf16 here: bf16 is emulated, the 2.5× target is not checkable on this CPU"
            print(f"β={beta}: ours fp32/bf16 step {_ratio(x['step'], y['step'])} ({target}); generation "
                  f"{_ratio(x['generation'], y['generation'])}, update {_ratio(x['update'], y['update'])}; CPU seconds: "
                  f"step {_ratio(x['cpu_step'], y['cpu_step'])}, generation {_ratio(x['cpu_generation'], y['cpu_generation'])}, "
                  f"update {_ratio(x['cpu_update'], y['cpu_update'])}; {load_of(o32)}, {load_of(o16)}")
        if o16 and t16:
            x, y = t16["steps"][-1], o16["steps"][-1]
            print(f"β={beta}: TRL bf16/ours bf16 step {_ratio(x['step'], y['step'])} (target > 1); generation "
                  f"{_ratio(x['generation'], y['generation'])}, update {_ratio(x['update'], y['update'])}; CPU seconds: "
                  f"step {_ratio(x['cpu_step'], y['cpu_step'])}; {load_of(t16)}, {load_of(o16)}")


def print_floors(a: argparse.Namespace, rows: list, floor: dict) -> None:
    """Each of our updates against its dtype's GEMM floor, phase by phase, and each generation against the memory
    bandwidth floor; then every update at the reference machine's speed."""
    from benchmarks.precision_floors import print_gemm_floors

    print()
    print_gemm_floors(list(floor["gemm"].values()))
    bw = floor["bandwidth"]
    print(f"Memory bandwidth: {bw['read_gb_s']:.1f} GB/s read (sum over {bw['mib']} MiB), {bw['copy_gb_s']:.1f} "
          f"GB/s copy (read + write); the decoding floor takes {bw['gb_s']:.1f} GB/s")
    for r in rows:
        s = r["steps"][-1]
        if "update_tflop" not in s or r["dtype"] not in floor["gemm"]:
            continue  # TRL: no FLOP count
        rate = floor["gemm"][r["dtype"]]["gflop_per_s"]
        name = f"{r['label']} {r['dtype']} β={r['beta']}"
        need = s["update_tflop"] * 1e3 / rate
        print(f"{name}: update {s['update']:.1f} s for {s['update_tflop']:.3f} TFLOP = "
              f"{s['update_tflop'] * 1e3 / s['update']:.1f} GFLOP/s; the {r['dtype']} GEMM floor is {need:.1f} s: "
              f"{need / s['update']:.0%} of the floor's speed (target ≥ 50% in bf16)")
        # Where the time goes. The forward's FLOPs are a third of the update's, or a quarter when β > 0 (the
        # reference pass, a forward over the same tokens, runs: the warm-up update moved the policy off π_ref);
        # the backward's are twice the forward's. The optimizer and the weight sync have no GEMMs.
        fwd = s["update_tflop"] * 1e3 / (4 if r["beta"] > 0 else 3)
        parts = [("forward", s["forward"], fwd), ("backward", s["backward"], 2 * fwd)]
        if r["beta"] > 0:
            parts.insert(0, ("ref", s["ref"], fwd))
        sync = s.get("weight_sync") or 0.0
        other = s["update"] - sum(sec for _, sec, _ in parts) - s["optimizer"] - sync
        print("    where it goes: " + ", ".join(f"{p} {sec:.1f} s (floor {gf / rate:.1f} s, {gf / rate / sec:.0%})"
                                                for p, sec, gf in parts)
              + f"; optimizer {s['optimizer']:.1f} s, weight sync {sync:.2f} s, other {other:.1f} s (no GEMM floor)")
        steps = a.new_tokens
        gen_floor = steps * floor["weight_bytes"][r["dtype"]] / (bw["gb_s"] * 1e9)
        print(f"    generation {s['generation']:.1f} s vs bandwidth floor {gen_floor:.1f} s ({steps} steps × "
              f"{floor['weight_bytes'][r['dtype']] / 1e6:.0f} MB of {r['dtype']} weights / {bw['gb_s']:.1f} GB/s) = "
              f"{s['generation'] / gen_floor:.1f}× the floor (target ≤ 2× in the chosen dtype)")
    if floor["plain_seconds"]:
        scale = REFERENCE_PLAIN_SECONDS / floor["plain_seconds"]
        print(f"Plain fp32 forward+backward of the model over {NUM_COMPLETIONS} × {PLAIN_TOKENS} tokens "
              f"(transformers' loss, one batch): {floor['plain_seconds']:.1f} s here, {REFERENCE_PLAIN_SECONDS} s on the "
              f"reference machine, where the targets were set: this machine is {1 / scale:.2f}× slower")
        for r in rows:
            s = r["steps"][-1]
            print(f"{r['label']} {r['dtype']} β={r['beta']}: update {s['update']:.1f} s = "
                  f"{s['update'] / floor['plain_seconds']:.2f}× the plain pass, {s['update'] * scale:.1f} s at the "
                  f"reference machine's speed")


def print_zero2(by: dict) -> None:
    """β = 0.04: our torch backend against DeepSpeed ZeRO-2, phase by phase."""
    torch_run, zero2 = by.get(("ours torch", "float32", 0.04)), by.get(("ours DeepSpeed ZeRO-2", "float32", 0.04))
    if torch_run and zero2:
        o, z = torch_run["steps"][-1], zero2["steps"][-1]
        print(f"β=0.04: torch vs DeepSpeed ZeRO-2 update {o['update']:.1f} vs {z['update']:.1f} s "
              f"(forward {o['forward']:.1f} vs {z['forward']:.1f}, backward {o['backward']:.1f} vs {z['backward']:.1f}, "
              f"optimizer {o['optimizer']:.1f} vs {z['optimizer']:.1f}), "
              f"peak RSS {torch_run['peak_rss_mib']:.0f} vs {zero2['peak_rss_mib']:.0f} MiB")


def main() -> None:
    a = parse_args()
    if a.worker:
        run_worker_here(a)
        return
    from benchmarks.precision_floors import resolve_dtypes

    from unifiedplayers.precision import auto_dtype

    requested = resolve_dtypes(a.dtypes)
    dtypes = list(dict.fromkeys(d for _, d, _ in requested))  # resolved, each once, in the order given
    betas = [float(b) for b in a.betas.split(",")]
    only = a.only.split(",")
    native_dtype, native_why = auto_dtype("cpu")
    path = (f"This CPU: {native_why}. auto -> {native_dtype}"
            + ("" if "auto" in a.dtypes else " (auto not asked for)"))
    print(path, flush=True)

    load_start = os.getloadavg()[0]
    floor, rows = run_all(a, dtypes, betas, only)
    print_table(a, rows, requested, path, load_start)
    by = {(r["label"], r["dtype"], r["beta"]): r for r in rows}
    print_ratios(a, by, betas, native_dtype == "bfloat16")
    if floor:
        print_floors(a, rows, floor)
    print_zero2(by)
    if a.json:
        Path(a.json).write_text(json.dumps({"path": path, "dtypes": requested, "runs": rows, "floor": floor}, indent=2))


if __name__ == "__main__":
    main()
