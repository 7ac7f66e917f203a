"""Floors of a GRPO step of SmolLM2-135M on this machine, per dtype: the update's GEMMs and decoding's memory reads.

Two floors, each measured here, in the process that runs this script, with the torch thread count it is given:

- **GEMM floor of the update.** Every matmul shape of one micro-batch's forward and backward (the decoder's
  linear layers on the micro-batch's prompt and completion rows, the LM head on a chunk of its completion rows:
  ``x Wᵀ``, the input gradient ``g W`` and the weight gradient ``gᵀ x``) is timed alone in fp32 and in bf16,
  each at its best operand layout, the two dtypes interleaved shape by shape, in two rounds. Their FLOP-weighted
  rate is the fastest any implementation of the update can go in that dtype on these cores; the trainer's
  ``perf/update_tflop`` divided by it is the update's floor in seconds.
- **Bandwidth floor of decoding.** A decoding step reads every weight once (the tied embedding once, as the LM
  head; an untied input embedding only a few rows, so it is left out), so it cannot take less than
  ``weight bytes / memory bandwidth``. The bandwidth is measured on a tensor far larger than the caches: a sum
  (reads only) and a copy (reads and writes, both counted), the faster of the two taken. Our ``hf`` rollout
  engine's time per decoding step is measured as ``(t(N new tokens) − t(1 new token)) / (N − 1)`` for 8 rows of
  the benchmark's prompt, which leaves the prefill out.

On a CPU without native bf16 (no ``amx_bf16`` / ``avx512_bf16`` flag: AVX2-only AMD EPYC, for one) bf16
matmuls are emulated, so the bf16 GEMM floor is far below the fp32 one there, and bf16 decoding sits far from
its bandwidth floor: the figures say so, they do not hide it.

``benchmarks/grpo_update.py`` imports the functions here for its floors; run alone, this script prints both
floors and the fraction of each that our engine reaches:

    .venv/bin/python -m benchmarks.precision_floors [--dtypes float32,bfloat16,auto] [--threads 2]
        [--new-tokens 256] [--micro-batch 4] [--chunk-rows 1024] [--decode-tokens 32] [--rows 8] [--json FILE]

On a shared machine every figure carries the neighbours' load (printed at the start and the end): a floor is
only as good as the quietest moment of its measurement.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

# The operand layouts torch passes to BLAS, (a transposed, b transposed); the one usually fastest first.
LAYOUTS = ((True, False), (False, True), (False, False))
TIME_PER_LAYOUT = 0.3  # seconds of repeated calls per layout
PROBE_ABOVE = 0.5  # seconds: a product this slow at the best rate so far is probed on a slice first


def dtype_of(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def resolve_dtypes(names: str) -> list[tuple[str, str, str]]:
    """``"float32,bfloat16,auto"`` -> [(as given, dtype name, reason)], ``auto`` resolved for this CPU."""
    from unifiedplayers.precision import auto_dtype

    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name == "auto":
            chosen, why = auto_dtype("cpu")
            out.append((name, chosen, why))
        elif name in ("float32", "bfloat16"):
            out.append((name, name, "asked for"))
        else:
            raise SystemExit(f"--dtypes: {name!r} is not one of float32, bfloat16, auto")
    return out


# ---------------------------------------------------------------------------------------------- GEMM floor
def update_gemm_shapes(model: Any, rows: int, head_rows: int) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) of every matmul in the forward and backward of one micro-batch: the decoder's linear
    layers over its ``rows`` token rows (prompt and completion), the LM head over ``head_rows`` (the completion
    rows it scores, one chunk of them). For each distinct layer shape: the forward ``x Wᵀ``, the input gradient
    ``g W`` and the weight gradient ``gᵀ x``."""
    from torch import nn

    from unifiedplayers.trainer.logprobs import split_causal_lm

    body, head = split_causal_lm(model)
    layers = Counter((m.in_features, m.out_features, rows) for m in body.modules() if isinstance(m, nn.Linear))
    layers[(head.in_features, head.out_features, head_rows)] += 1
    shapes = []
    for (fan_in, fan_out, r), count in layers.items():
        for m, k, n in ((r, fan_in, fan_out), (r, fan_out, fan_in), (fan_out, r, fan_in)):
            shapes.append((m, k, n, count))
    return shapes


def update_rows(prompt_tokens: int, new_tokens: int, micro_batch: int, chunk_rows: int) -> tuple[int, int]:
    """(decoder rows, LM-head rows) of one micro-batch of the benchmark's update: ``micro_batch`` samples of
    ``prompt_tokens + new_tokens`` tokens, the LM head on their completion rows, ``chunk_rows`` at a time (0: all)."""
    head = micro_batch * new_tokens
    return micro_batch * (prompt_tokens + new_tokens), min(head, chunk_rows) if chunk_rows > 0 else head


def mm_rate(m: int, k: int, n: int, dtype: Any) -> float:
    """Best GFLOP/s of an (m, k) @ (k, n) product in ``dtype`` over the operand layouts torch passes to BLAS.

    Each layout's product is called again and again for about :data:`TIME_PER_LAYOUT` seconds and its fastest
    call counts: on a shared machine the fastest call is the one the neighbours disturbed least. A product that
    would take more than :data:`PROBE_ABOVE` seconds at the best rate so far is first tried on an eighth of the
    rows of ``a`` (same layout), and the layout is dropped if that runs at less than a third of the best rate:
    it cannot become the best, and an emulated bf16 product in a bad layout can take a minute."""
    import torch

    flop = 2 * m * k * n
    best = 0.0
    for a_t, b_t in LAYOUTS:
        a = torch.randn(k, m, dtype=dtype).t() if a_t else torch.randn(m, k, dtype=dtype)
        b = torch.randn(n, k, dtype=dtype).t() if b_t else torch.randn(k, n, dtype=dtype)
        if best > 0.0 and flop / (best * 1e9) > PROBE_ABOVE and m >= 64:
            part = a[: m // 8]
            t = time.perf_counter()
            torch.mm(part, b)
            if 2 * part.shape[0] * k * n / (time.perf_counter() - t) / 1e9 < best / 3:
                continue
        out = torch.empty(m, n, dtype=dtype)
        seconds, spent = float("inf"), 0.0
        while spent < TIME_PER_LAYOUT or seconds == float("inf"):
            t = time.perf_counter()
            torch.mm(a, b, out=out)
            call = time.perf_counter() - t
            seconds, spent = min(seconds, call), spent + call
        best = max(best, flop / seconds / 1e9)
    return best


def gemm_floors(model: Any, rows: int, head_rows: int, dtype_names: list[str], rounds: int = 2) -> dict[str, dict]:
    """The update's matmul rate per dtype on these cores: every shape of :func:`update_gemm_shapes` at its best
    layout, the dtypes interleaved shape by shape and the whole measured ``rounds`` times, the best rate of each
    shape kept (a neighbour's burst then slows one round of one shape, not a whole dtype). ``gflop_per_s``: total
    FLOPs / total seconds over all shapes (weighted as one micro-batch runs them); ``best_gflop_per_s``: the
    fastest single shape."""
    shapes = update_gemm_shapes(model, rows, head_rows)
    rates = {name: [0.0] * len(shapes) for name in dtype_names}
    for _ in range(rounds):
        for i, (m, k, n, _count) in enumerate(shapes):
            for name in dtype_names:
                rates[name][i] = max(rates[name][i], mm_rate(m, k, n, dtype_of(name)))
    out = {}
    for name in dtype_names:
        flop = sum(2 * m * k * n * count for m, k, n, count in shapes)
        seconds = sum(2 * m * k * n * count / (r * 1e9) for (m, k, n, count), r in zip(shapes, rates[name]))
        out[name] = {"dtype": name, "rows": rows, "head_rows": head_rows, "gflop_per_s": flop / seconds / 1e9,
                     "best_gflop_per_s": max(rates[name]),
                     "shapes": [{"m": m, "k": k, "n": n, "count": c, "gflop_per_s": r}
                                for (m, k, n, c), r in zip(shapes, rates[name])]}
    return out


# ---------------------------------------------------------------------------------------------- bandwidth floor
def memory_bandwidth(mib: int = 512, reps: int = 10) -> dict:
    """GB/s of this machine's memory, best of ``reps``: ``read`` from a sum over a ``mib`` MiB float32 tensor,
    ``copy`` from a copy of it into another (its reads and writes both counted); ``gb_s`` is the faster."""
    import torch

    n = mib * 2**20 // 4
    x = torch.ones(n)  # written once: its pages exist before the timing
    y = torch.zeros(n)
    read = copy_rate = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        read = max(read, n * 4 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        y.copy_(x)
        copy_rate = max(copy_rate, 2 * n * 4 / (time.perf_counter() - t) / 1e9)
    return {"read_gb_s": read, "copy_gb_s": copy_rate, "gb_s": max(read, copy_rate), "mib": mib}


def weight_bytes(model: Any, dtype_name: str) -> int:
    """Bytes of the weights one decoding step reads with the weights in ``dtype_name``: every parameter once
    (a tied embedding once), less an untied input embedding (a step reads only its rows' entries)."""
    import torch

    size = torch.empty((), dtype=dtype_of(dtype_name)).element_size()
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[id(p)] = p.numel()
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is not None and out is not None and inp.weight is not out.weight:
        seen.pop(id(inp.weight), None)
    return sum(seen.values()) * size


def decode_floor_seconds(model: Any, dtype_name: str, bandwidth_gb_s: float) -> float:
    """The least time of one decoding step: its weight bytes in ``dtype_name`` at ``bandwidth_gb_s``."""
    return weight_bytes(model, dtype_name) / (bandwidth_gb_s * 1e9)


def measure_decode_step(model: Any, tokenizer: Any, prompt_ids: list[int], dtype_name: str, rows: int,
                        new_tokens: int) -> dict:
    """Seconds per decoding step of our ``hf`` engine over ``rows`` samples of ``prompt_ids``, the weights in
    ``dtype_name`` (a copy of ``model`` cast as the trainer's ``sampling_model`` casts it):
    ``(t(new_tokens) − t(1)) / (new_tokens − 1)``, after one warm-up call. ``prefill_s``: t(1)."""
    import torch

    from unifiedplayers.config import RolloutConfig
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.trainer.precision import cast_parameters

    dtype = dtype_of(dtype_name)
    module = model if dtype == torch.float32 else cast_parameters(copy.deepcopy(model), dtype)
    module.eval()
    engine = build_rollout(RolloutConfig(max_new_tokens=new_tokens, temperature=1.0, batch_size=0), module, tokenizer)

    def timed(tokens: int) -> float:
        t = time.perf_counter()
        outs = engine.generate([prompt_ids], n=rows, max_new_tokens=tokens, ignore_eos=True, seed=0)[0]
        assert all(len(c.token_ids) == tokens for c in outs)
        return time.perf_counter() - t

    timed(2)  # warm-up (and, where the prefix cache is on, the prompt's KV cache for both timed calls)
    one = timed(1)
    many = timed(new_tokens)
    return {"dtype": dtype_name, "rows": rows, "new_tokens": new_tokens, "prefill_s": one, "total_s": many,
            "per_step_s": (many - one) / max(new_tokens - 1, 1)}


# ---------------------------------------------------------------------------------------------- report
def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min) {five:.1f} (5 min)"


def print_gemm_floors(floors: list[dict]) -> None:
    """One line per dtype: the update's GEMM rate on these cores; then bf16's rate over fp32's."""
    for f in floors:
        print(f"GEMM floor {f['dtype']:8s}: {f['gflop_per_s']:7.1f} GFLOP/s over the update's shapes ({f['rows']} decoder "
              f"rows and {f['head_rows']} LM-head rows per micro-batch, best layout each), {f['best_gflop_per_s']:.1f} "
              f"on the fastest")
    by = {f["dtype"]: f for f in floors}
    if "float32" in by and "bfloat16" in by:
        print(f"bf16/fp32 GEMM rate on these shapes: {by['bfloat16']['gflop_per_s'] / by['float32']['gflop_per_s']:.2f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="float32, bfloat16 and/or auto")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--new-tokens", type=int, default=256, help="completion tokens per row of the update")
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per micro-batch of the update")
    parser.add_argument("--chunk-rows", type=int, default=1024, help="LM-head rows at once (trainer.logprob_chunk_rows)")
    parser.add_argument("--decode-tokens", type=int, default=32, help="new tokens of the decoding measurement")
    parser.add_argument("--rows", type=int, default=8, help="samples decoded at once")
    parser.add_argument("--json", help="also write the figures to this file")
    a = parser.parse_args()

    import torch

    from benchmarks.update_inputs import load_fp32_model, prompt_ids  # the update benchmark's model and prompt

    from unifiedplayers.precision import auto_dtype

    torch.set_num_threads(a.threads)
    dtypes = resolve_dtypes(a.dtypes)
    names = list(dict.fromkeys(d for _, d, _ in dtypes))
    model, tokenizer = load_fp32_model()
    prompt = prompt_ids(tokenizer)
    print(f"SmolLM2-135M, CPU, {a.threads} threads; {load_average()} at start")
    chosen, why = auto_dtype("cpu")
    print(f"This CPU: {why}. auto -> {chosen}")

    t = time.perf_counter()
    rows, head_rows = update_rows(len(prompt), a.new_tokens, a.micro_batch, a.chunk_rows)
    floors = list(gemm_floors(model, rows, head_rows, names).values())
    print(f"[GEMM floors measured in {time.perf_counter() - t:.0f} s; {load_average()}]")
    bw = memory_bandwidth()
    decode = [measure_decode_step(model, tokenizer, prompt, n, a.rows, a.decode_tokens) for n in names]

    print_gemm_floors(floors)
    print(f"Memory bandwidth: {bw['read_gb_s']:.1f} GB/s read (sum over {bw['mib']} MiB), {bw['copy_gb_s']:.1f} GB/s "
          f"copy (read + write); floor taken at {bw['gb_s']:.1f} GB/s")
    for d in decode:
        floor = decode_floor_seconds(model, d["dtype"], bw["gb_s"])
        print(f"decode {d['dtype']:8s}: weights {weight_bytes(model, d['dtype']) / 1e6:.0f} MB, floor {floor * 1e3:.1f} ms "
              f"per step; our hf engine {d['per_step_s'] * 1e3:.1f} ms per step ({d['rows']} rows, "
              f"{d['new_tokens']} new tokens, prefill {d['prefill_s']:.2f} s) = {floor / d['per_step_s']:.0%} of the floor's "
              f"speed, {d['per_step_s'] / floor:.1f}× the floor (target ≤ 2× in the chosen dtype)")
    print(f"{load_average()} at end")
    if a.json:
        Path(a.json).write_text(json.dumps({"gemm": floors, "bandwidth": bw, "decode": decode,
                                            "weight_bytes": {n: weight_bytes(model, n) for n in names}}, indent=2))


if __name__ == "__main__":
    main()
