"""The hf engine's decoding economies on SmolLM2-135M-Instruct, one torch thread, float32 unless said.

(a) ended rows leave the batch: 8 rows whose lengths differ a lot (each row given its own token budget),
    tokens/s with ``hf_engine.COMPACT_FINISHED`` off (every row decodes until the longest ends) and on;
    the sampled tokens of both are compared (same seed).
(b) probe-like prefill: 8 prompts sharing a ~600-token few-shot prefix with ~60-token own parts,
    ``generate`` (greedy, 16 new tokens) with ``rollout.prefix_cache`` false, true (first call: the prefix is
    prefilled once) and true again (second call: the prefix comes from the store); are the greedy tokens
    identical in float32?
(c) the batch of (a) decoded by a bfloat16 copy of the model against float32.
(d) one decoding step of 8 rows (the prompts of (a), 40 new tokens each), float32 and bfloat16, with
    ``rollout.packed_linears`` false, auto and true, interleaved: the median time between two decoding forwards
    (the step), the forward's share, and whether tokens and log-probs are bit-equal to ``false``.

    python -m benchmarks.hf_decoding [--repeats 2] [--parts abcd]

Wall times are the best of ``--repeats``; the load average and CPU time are printed beside them.
"""
from __future__ import annotations

import argparse
import copy
import functools
import math
import os
import time
from pathlib import Path

import torch

from unifiedplayers.config import RolloutConfig
from unifiedplayers.models import cast_parameters
from unifiedplayers.rollout import build_rollout
from unifiedplayers.rollout import hf_engine

ROOT = Path(__file__).resolve().parents[1]

BUDGETS = [256, 12, 40, 96, 20, 160, 8, 64]  # new tokens of each row of (a): ended rows are most of the batch
QUESTIONS = [
    "A farmer has 17 sheep and buys 3 times as many goats as sheep. He then sells 12 goats. How many animals "
    "does he have now, counting both sheep and goats, and how many more goats than sheep are there?",
    "Tom reads 23 pages on Monday and twice as many on Tuesday. The book has 180 pages. How many pages are left "
    "for the rest of the week, and what share of the book has he read so far, as a percentage?",
    "A shop sells pencils at 35 cents each or a box of 12 for 3 dollars and 60 cents. How much does a class "
    "save by buying 48 pencils in boxes rather than one at a time, in dollars?",
    "The sum of three consecutive odd integers is 147. What are the integers, and what is the product of the "
    "smallest and the largest of them? Give both answers as whole numbers.",
    "A tank holds 2400 litres. One pipe fills it in 6 hours and another drains it in 10 hours. Starting empty with "
    "both open, how long does it take to fill the tank completely, in hours and minutes?",
    "A rectangle has a perimeter of 64 cm and its length is 4 cm more than three times its width. What are its "
    "length, its width and its area? Give the area in square centimetres.",
    "Maria invests 5000 dollars at 4 percent simple interest per year and Ben invests 4000 dollars at 6 percent. "
    "After how many whole years does Ben's total first exceed Maria's total?",
    "A train leaves at 9:40 and travels 315 km at an average of 84 km per hour. At what time does it arrive, and "
    "how many minutes late is it if it was due at 13:15?",
]
SHOTS = [
    ("What is 15% of 240?", "15% of 240 is 0.15 * 240 = 36. The answer is \\boxed{36}."),
    ("A car uses 6 litres per 100 km. How much fuel for 350 km?", "350 / 100 * 6 = 21 litres. The answer is \\boxed{21}."),
    ("If 3x + 7 = 25, what is x?", "3x = 18, so x = 6. The answer is \\boxed{6}."),
    ("How many minutes are there in 3.5 hours?", "3.5 * 60 = 210 minutes. The answer is \\boxed{210}."),
    ("A shirt costs 40 dollars after a 20% discount. What was its price?", "0.8 p = 40, so p = 50. The answer is \\boxed{50}."),
    ("What is the least common multiple of 12 and 18?", "12 = 2^2*3, 18 = 2*3^2, lcm = 2^2*3^2 = 36. The answer is \\boxed{36}."),
    ("A recipe needs 250 g of flour for 4 people. How much for 10?", "250 / 4 * 10 = 625 g. The answer is \\boxed{625}."),
    ("What is the average of 14, 22, 9 and 35?", "(14 + 22 + 9 + 35) / 4 = 80 / 4 = 20. The answer is \\boxed{20}."),
    ("A square has an area of 81 square metres. What is its perimeter?", "Its side is 9 m, so 4 * 9 = 36 m. The answer is \\boxed{36}."),
]
SYSTEM = ("You are a careful math assistant. Solve the problem step by step, write any arithmetic you need as a short "
          "python block when it helps, and end with the final answer in \\boxed{}. Keep the reasoning short and precise.")


def model_and_tokenizer():
    from omegaconf import OmegaConf

    from unifiedplayers.config import ModelConfig
    from unifiedplayers.models import load_model

    yaml = OmegaConf.load(ROOT / "conf" / "model" / "smollm2_135m_instruct.yaml")
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml, {"dtype": "float32", "device": "cpu"})
    return load_model(OmegaConf.to_object(cfg))


def timed(fn, repeats: int):
    """``(result of the last call, best wall seconds, CPU seconds of that call)``."""
    best, cpu, out = float("inf"), 0.0, None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall = time.perf_counter() - t0
        if wall < best:
            best, cpu = wall, time.process_time() - c0
    return out, best, cpu


def ragged_engine(model, tok):
    """An engine whose rows get the token budgets of :data:`BUDGETS` (by their place in the batch)."""
    engine = build_rollout(RolloutConfig(batch_size=0, prefix_cache="false"), model, tok)
    engine._budgets = lambda prompts, max_new_tokens: BUDGETS[: len(prompts)]
    return engine


def chat(tok, question: str, shots=()) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}]
    for q, a in shots:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": question})
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def bench_compaction(model, tok, repeats: int) -> None:
    prompts = [chat(tok, q) for q in QUESTIONS]
    engine = ragged_engine(model, tok)
    kw = dict(n=1, max_new_tokens=max(BUDGETS), temperature=1.0, seed=0, ignore_eos=True)
    tokens = sum(BUDGETS)
    results = {}
    for on in (False, True):
        hf_engine.COMPACT_FINISHED = on
        outs, wall, cpu = timed(lambda: engine.generate(prompts, **kw), repeats)
        results[on] = [row[0] for row in outs]
        print(f"(a) compaction {'on ' if on else 'off'}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tokens/s "
              f"(CPU {cpu:.2f} s), load {os.getloadavg()}")
    hf_engine.COMPACT_FINISHED = True
    report_agreement(results[False], results[True])
    return prompts


def report_agreement(full, compacted) -> None:
    """How far each row's sampled tokens agree with and without compaction, and where they part: a draw whose
    uniform falls within float rounding of a CDF boundary (in practice on a tail token, whose interval is as
    narrow as that rounding) picks the neighbouring token."""
    same = sum(a.token_ids == b.token_ids for a, b in zip(full, compacted))
    print(f"(a) rows with identical sampled tokens with and without compaction: {same}/{len(full)}")
    for i, (a, b) in enumerate(zip(full, compacted)):
        if a.token_ids != b.token_ids:
            t = next(k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
            lp = max(abs(x - y) for x, y in zip(a.logprobs[:t], b.logprobs[:t])) if t else 0.0
            print(f"    row {i}: equal for {t} of {len(a.token_ids)} tokens (log-probs within {lp:.1e}), then "
                  f"token {a.token_ids[t]} (p={math.exp(a.logprobs[t]):.1e}) vs {b.token_ids[t]} (p={math.exp(b.logprobs[t]):.1e})")


def bench_prefix(model, tok, repeats: int) -> None:
    prompts = [chat(tok, q, SHOTS) for q in QUESTIONS]
    from unifiedplayers.rollout.prefix_cache import common_prefix_length

    shared = common_prefix_length(prompts)
    own = [len(p) - shared for p in prompts]
    print(f"(b) prompts: {shared} shared tokens + {min(own)}..{max(own)} own tokens")
    kw = dict(n=1, max_new_tokens=16, greedy=True)
    plain = build_rollout(RolloutConfig(prefix_cache="false"), model, tok)
    base, wall, cpu = timed(lambda: plain.generate(prompts, **kw), repeats)
    print(f"(b) prefix_cache=false: {wall:.2f} s (CPU {cpu:.2f} s), load {os.getloadavg()}")

    def cold():
        engine = build_rollout(RolloutConfig(prefix_cache="true"), model, tok)
        return engine, engine.generate(prompts, **kw)

    (engine, first), wall, cpu = timed(cold, repeats)
    print(f"(b) prefix_cache=true, first call (prefix prefilled once): {wall:.2f} s (CPU {cpu:.2f} s), load {os.getloadavg()}")
    second, wall, cpu = timed(lambda: engine.generate(prompts, **kw), repeats)
    print(f"(b) prefix_cache=true, next call (prefix from the store): {wall:.2f} s (CPU {cpu:.2f} s), load {os.getloadavg()}")
    ids = lambda outs: [row[0].token_ids for row in outs]  # noqa: E731
    worst = max(abs(a - b) for x, y in zip(base, first) for a, b in zip(x[0].logprobs, y[0].logprobs))
    print(f"(b) float32 greedy tokens identical with and without the prefix cache: first call "
          f"{ids(first) == ids(base)}, next call {ids(second) == ids(base)}; largest log-prob difference {worst:.2e}")


def bench_bf16(model, tok, prompts, repeats: int) -> None:
    kw = dict(n=1, max_new_tokens=max(BUDGETS), temperature=1.0, seed=0, ignore_eos=True)
    tokens = sum(BUDGETS)
    for name, m in (("float32", model), ("bfloat16", cast_parameters(copy.deepcopy(model), torch.bfloat16))):
        engine = ragged_engine(m, tok)
        _, wall, cpu = timed(lambda: engine.generate(prompts, **kw), repeats)
        print(f"(c) {name}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tokens/s (CPU {cpu:.2f} s), "
              f"load {os.getloadavg()}")


def bench_steps(model, tok, prompts, repeats: int, steps: int = 40) -> None:
    import statistics

    settings = ("false", "auto", "true")
    for name, m in (("float32", model), ("bfloat16", cast_parameters(copy.deepcopy(model), torch.bfloat16))):
        starts, forwards, outs = [], [], {}
        times = {s: ([], []) for s in settings}
        forward = m.forward

        @functools.wraps(forward)  # the engine reads the forward's keywords from its signature
        def timed_forward(*args, **kw):
            t0 = time.perf_counter()
            out = forward(*args, **kw)
            if kw["input_ids"].shape[1] == 1:  # a decoding step
                starts.append(t0)
                forwards.append(time.perf_counter() - t0)
            return out

        m.forward = timed_forward
        for _ in range(repeats):
            for s in settings:  # interleaved, so that the neighbours' load falls on all three alike
                cfg = RolloutConfig(batch_size=0, prefix_cache="false")
                cfg.packed_linears = s
                starts.clear()
                forwards.clear()
                outs[s] = build_rollout(cfg, m, tok).generate(prompts, n=1, max_new_tokens=steps, temperature=1.0,
                                                              seed=0, ignore_eos=True)
                times[s][0].extend(b - a for a, b in zip(starts, starts[1:]))
                times[s][1].extend(forwards)
        del m.forward
        base = statistics.median(times["false"][0])
        for s in settings:
            step, fwd = statistics.median(times[s][0]), statistics.median(times[s][1])
            rows = [(x, y) for ra, rb in zip(outs[s], outs["false"]) for x, y in zip(ra, rb)]
            same_tokens = all(x.token_ids == y.token_ids for x, y in rows)
            worst = max(abs(a - b) for x, y in rows for a, b in zip(x.logprobs, y.logprobs))
            print(f"(d) {name} packed_linears={s}: {step * 1e3:.1f} ms per step of 8 rows (forward {fwd * 1e3:.1f} ms, "
                  f"the engine's own {(step - fwd) * 1e3:.1f} ms), {base / step:.2f}x false; tokens as false: "
                  f"{same_tokens}, largest log-prob difference {worst:.1e}; load {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parts", default="abcd", help="which of (a), (b), (c), (d) to run, e.g. ab")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    print(f"load at start {os.getloadavg()}, torch {torch.__version__}, 1 thread")
    model, tok = model_and_tokenizer()
    if "a" in args.parts:
        bench_compaction(model, tok, args.repeats)
    if "b" in args.parts:
        bench_prefix(model, tok, args.repeats)
    if "c" in args.parts:
        bench_bf16(model, tok, [chat(tok, q) for q in QUESTIONS], args.repeats)
    if "d" in args.parts:
        bench_steps(model, tok, [chat(tok, q) for q in QUESTIONS], args.repeats)


if __name__ == "__main__":
    main()
