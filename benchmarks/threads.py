"""One torch thread against two, with OpenMP's threads spinning or sleeping, on a quiet machine and beside a busy core.

    python -m benchmarks.threads [--dtype bfloat16] [--new-tokens 64] [--busy both|no|yes]

Each cell runs in its own subprocess (OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads it): SmolLM2-135M in
``--dtype``, one GRPO ``update()`` of 8 × (49 + 256) random tokens (the smoke preset's micro-batch of 4, after one
warm-up update), and sampling 8 completions of ``--new-tokens`` tokens from the hf engine (after a warm-up call).
Settings: 1 thread; 2 threads with OpenMP's default wait (threads spin); 2 threads with ``OMP_WAIT_POLICY=PASSIVE``
(threads sleep; what ``python -m unifiedplayers.train`` sets). ``--busy yes`` keeps one core busy with a spinning
process beside each cell. Printed: seconds per cell and the 1-minute load average. This is the measurement behind
the smoke preset's ``trainer.update_threads: 2`` (benchmarks/README.md, "Threads").
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [("1 thread", 1, None), ("2, spin", 2, None), ("2, passive", 2, "PASSIVE")]


def cell(threads: int, dtype: str, new_tokens: int) -> dict:
    """In this process: one update and one sampling call with ``threads`` torch threads (seconds)."""
    import torch

    from benchmarks import update_inputs as U

    from unifiedplayers.config import RolloutConfig, TrainerConfig
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.trainer import TrainSample, build_trainer

    torch.set_num_threads(threads)
    model, tokenizer = U.load_fp32_model()
    trainer = build_trainer(TrainerConfig(lr=1e-6, micro_batch_size=4, entropy_every=0, num_threads=threads, dtype=dtype,
                                          logprob_chunk_rows=0),
                            model, role="bench", pad_token_id=0)
    trainer.start_outer_iteration()
    g = torch.Generator().manual_seed(0)

    def batch() -> list:
        return [TrainSample(torch.randint(0, 49152, (305,), generator=g).tolist(), [0] * 49 + [1] * 256, [-10.0] * 305,
                            float(i % 2 * 2 - 1), 0) for i in range(8)]

    trainer.update(batch())
    t = time.perf_counter()
    trainer.update(batch())
    update = time.perf_counter() - t
    rollout = build_rollout(RolloutConfig(max_new_tokens=new_tokens, temperature=1.0),
                            trainer.sampling_model(getattr(torch, dtype)), tokenizer)
    prompt = U.prompt_ids(tokenizer)
    rollout.generate([prompt], n=8, max_new_tokens=8, ignore_eos=True, seed=1)
    t = time.perf_counter()
    rollout.generate([prompt], n=8, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    return {"update": update, "sampling": time.perf_counter() - t}


def _spin() -> None:
    while True:
        pass


def run_cell(threads: int, policy: str | None, busy: bool, args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": policy} if policy else {})
    spinner = multiprocessing.Process(target=_spin, daemon=True) if busy else None
    if spinner:
        spinner.start()
    try:
        out = subprocess.run([sys.executable, "-m", "benchmarks.threads", "--cell", str(threads), "--dtype",
                              args.dtype, "--new-tokens", str(args.new_tokens)],
                             env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    finally:
        if spinner:
            spinner.terminate()
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--busy", default="both", choices=["both", "no", "yes"])
    ap.add_argument("--cell", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        print(json.dumps(cell(args.cell, args.dtype, args.new_tokens)))
        return
    print(f"SmolLM2-135M, {args.dtype}; update of 8 x 305 tokens, sampling 8 x {args.new_tokens} tokens; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the start")
    for busy in {"both": (False, True), "no": (False,), "yes": (True,)}[args.busy]:
        for name, threads, policy in SETTINGS:
            r = run_cell(threads, policy, busy, args)
            print(f"{'one core busy' if busy else 'quiet':13s} {name:11s} update {r['update']:6.2f} s   "
                  f"sampling {r['sampling']:6.2f} s   load {r['load']:.2f}", flush=True)


if __name__ == "__main__":
    main()
