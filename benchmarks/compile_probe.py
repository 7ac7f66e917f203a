"""Does torch.compile pay for the trainer's forward and backward on this CPU? One run, eager against compiled.

    python -m benchmarks.compile_probe [--dtype bfloat16] [--rows 4] [--tokens 305] [--threads 1] [--profile]

SmolLM2-135M (the embedded model) in ``--dtype``, SDPA attention (transformers' default), a forward and backward of
``--rows`` x ``--tokens`` random tokens with a loss over the whole vocabulary, as the trainer's update has them.
Printed: the eager seconds per pass (best of ``--repeat`` after one warm-up), ``torch.compile``'s first call
(compile included) and its seconds per pass, their ratio, and the load average. ``--profile``: the eager pass's
ops by self CPU time (where the time goes: matrix multiplies, attention, elementwise). The compile cache goes to a
temporary directory, so a second run compiles again (what a fresh process pays).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def fwd_bwd(model, ids: torch.Tensor) -> None:
    logits = model(input_ids=ids).logits
    logits.float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)


def per_pass(model, ids: torch.Tensor, repeat: int) -> float:
    fwd_bwd(model, ids)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fwd_bwd(model, ids)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=305)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    torch.set_num_threads(args.threads)
    from unifiedplayers.config import compose
    from unifiedplayers.models import cast_parameters, load_model

    model, _ = load_model(compose(["experiment=smoke", "model.dtype=float32"]).model)
    model = cast_parameters(model, getattr(torch, args.dtype))
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    print(f"SmolLM2-135M, {args.dtype}, attention {model.config._attn_implementation}, {args.rows} x {args.tokens} "
          f"tokens, {args.threads} thread(s); load {os.getloadavg()[0]:.2f}")
    eager = per_pass(model, ids, args.repeat)
    print(f"eager: {eager:.2f} s per forward+backward", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fwd_bwd(model, ids)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    compiled = torch.compile(model)
    t = time.perf_counter()
    fwd_bwd(compiled, ids)
    first = time.perf_counter() - t
    after = per_pass(compiled, ids, args.repeat)
    print(f"compiled: first call {first:.1f} s (compile included), then {after:.2f} s per forward+backward; "
          f"eager / compiled = {eager / after:.2f}x; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
