"""Token-budget micro-batches against fixed-count ones: one GRPO update of the embedded model, same batch, one run.

For each batch, each repetition runs both arms from the same weights with a fresh optimizer, interleaved
(fixed, budget, fixed, budget, ...): ``trainer.micro_batch_size`` samples a micro-batch (the preset's), and
``trainer.max_tokens_per_micro_batch`` = micro_batch_size x the batch's longest sample (default: no micro-batch
holds more positions than the fixed split's largest one, so the activation memory bound is the same). It prints per
batch the padding (``perf/pad_share``), micro-batches, median update seconds and seconds per 1,000 trained tokens,
their ratio, and the loss and grad-norm differences (the loss against Σ w|A|, the scale of its terms, as
tests/trainer/test_token_budget.py judges it), with the load average beside the timings. A third arm, the fixed
split at half the micro-batch size, shows how far the loss moves when only the micro-batches' shapes change: in
bfloat16 that is not rounding-small (logits of magnitude ~10 carry an ulp of ~0.06), in float32 it is.

Batches: ``--phase PATH`` (a run's phase.pt: each of its minibatches, real lengths) and/or ``--synthetic N`` (N
samples of random tokens, lengths spread evenly from the preset's Execution prompt to its longest trajectory,
``capacity.role_loads``: one turn to max_turns, in a seeded random order).

    .venv/bin/python -m benchmarks.token_budget --phase runs/smoke/phase.pt --synthetic 8 [--reps 3]
        [--experiment smoke] [--budget TOKENS] [overrides ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from unifiedplayers.capacity import role_loads
from unifiedplayers.config import compose, role_trainer_config
from unifiedplayers.models import load_model
from unifiedplayers.trainer import TrainSample, build_trainer, grpo
from unifiedplayers.trainer.batching import micro_batch_members, pad_share


def phase_batches(path: Path) -> list[tuple[str, list]]:
    from unifiedplayers.loop.phase import Phase, load_phase_state

    phase = Phase.from_state(load_phase_state(path))
    return [(f"{path} minibatch {i}", list(mb.batch)) for i, mb in enumerate(phase.minibatches) if mb.batch]


def synthetic_batch(cfg, n: int, vocab: int, seed: int = 0) -> tuple[str, list]:
    load = role_loads(cfg)["execution"]
    shortest, longest = load.prompt + 32, load.length
    gen = torch.Generator().manual_seed(seed)
    groups = torch.arange(n) // max(1, int(cfg.player.num_trajectories))
    advantages = grpo.group_advantages(torch.rand(n, generator=gen), groups)
    samples = []
    order = torch.randperm(n, generator=gen).tolist()  # the lengths in no order, as a batch's groups hold them
    for i in range(n):
        length = shortest + (longest - shortest) * order[i] // max(1, n - 1)
        ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
        mask = [0] * load.prompt + [1] * (length - load.prompt)
        old = [-2.0 if m else 0.0 for m in mask]
        samples.append(TrainSample(ids, mask, old, float(advantages[i]), int(groups[i])))
    return f"synthetic execution, {n} samples of {shortest}..{longest} tokens", samples


def loss_scale(batch) -> float:
    counts = torch.tensor([int(sum(s.loss_mask)) for s in batch])
    weights = grpo.get_aggregation("seq_group_mean")(counts, torch.tensor([int(s.group) for s in batch]))
    return float((weights * torch.tensor([abs(float(s.advantage)) for s in batch])).sum())


def one_update(model, initial, tcfg, batch, pad_id: int) -> tuple[float, dict]:
    model.load_state_dict(initial)
    trainer = build_trainer(tcfg, model, role="execution", pad_token_id=pad_id)
    trainer.start_outer_iteration()
    t0 = time.perf_counter()
    metrics = trainer.update(list(batch))
    return time.perf_counter() - t0, metrics


def compare(model, initial, tcfg, batch, budget: int, reps: int, pad_id: int) -> dict:
    half = max(1, int(tcfg.micro_batch_size) // 2)
    arms = {"fixed": tcfg, "budget": OmegaConf.merge(tcfg, {"max_tokens_per_micro_batch": budget}),
            f"fixed/{half}": OmegaConf.merge(tcfg, {"micro_batch_size": half})}
    seconds = {a: [] for a in arms}
    metrics = {}
    for _ in range(reps):
        for arm, c in arms.items():
            s, metrics[arm] = one_update(model, initial, c, batch, pad_id)
            seconds[arm].append(s)
    lengths = [len(s.token_ids) for s in batch]
    trained = sum(int(sum(s.loss_mask)) for s in batch)
    out = {"n": len(batch), "lengths": (min(lengths), int(statistics.median(lengths)), max(lengths)),
           "trained": trained, "budget_tokens": budget, "load": os.getloadavg()[0]}
    for arm, c in arms.items():
        members = micro_batch_members(lengths, c)
        out[arm] = {"pad_share": pad_share(lengths, members), "micro": len(members),
                    "seconds": statistics.median(seconds[arm]), "all": seconds[arm],
                    "loss": metrics[arm]["actor/loss"], "grad_norm": metrics[arm]["actor/grad_norm"]}
    scale = max(loss_scale(batch), 1e-30)
    out["arms"] = list(arms)
    for arm in arms:  # against the preset's fixed-count split
        out[arm]["loss_diff_over_scale"] = abs(out[arm]["loss"] - out["fixed"]["loss"]) / scale
        out[arm]["grad_norm_rel"] = abs(out[arm]["grad_norm"] / out["fixed"]["grad_norm"] - 1)
    return out


def report(name: str, r: dict) -> None:
    per_k = lambda arm: 1000 * arm["seconds"] / r["trained"]  # noqa: E731
    print(f"\n{name}\n  {r['n']} samples, lengths min/median/max {r['lengths']}, {r['trained']} trained tokens; "
          f"budget {r['budget_tokens']} tokens; load average {r['load']:.2f} when it ended")
    print(f"  {'arm':<10}{'pad share':>10}{'micro':>7}{'median s':>10}{'s/1k trained':>14}{'x fixed':>9}"
          f"{'|dloss|/sum w|A|':>18}{'|dgrad-norm|':>14}   every rep (s)")
    for arm in r["arms"]:
        x = r[arm]
        print(f"  {arm:<10}{100 * x['pad_share']:>9.1f}%{x['micro']:>7d}{x['seconds']:>10.2f}{per_k(x):>14.3f}"
              f"{x['seconds'] / r['fixed']['seconds']:>9.3f}{x['loss_diff_over_scale']:>18.1e}"
              f"{x['grad_norm_rel']:>14.1e}   " + ", ".join(f"{s:.2f}" for s in x["all"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", action="append", default=[], type=Path)
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--experiment", default="smoke")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=int, default=0, help="tokens (default: micro_batch_size x the longest sample)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg = compose([f"experiment={args.experiment}", *args.overrides])
    tcfg = role_trainer_config(cfg.trainer, "execution")
    torch.set_num_threads(int(tcfg.update_threads or tcfg.num_threads or torch.get_num_threads()))
    model, tokenizer = load_model(cfg.model)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batches = [b for p in args.phase for b in phase_batches(p)]
    if args.synthetic:
        batches.append(synthetic_batch(cfg, args.synthetic, model.config.vocab_size))
    if not batches:
        raise SystemExit("no batch: give --phase PATH (a run's phase.pt) and/or --synthetic N")
    print(f"experiment={args.experiment}: {cfg.model.name if 'name' in cfg.model else cfg.model.path}, trainer.dtype "
          f"{tcfg.dtype}, micro_batch_size {tcfg.micro_batch_size}, {torch.get_num_threads()} torch thread(s), "
          f"{args.reps} interleaved reps an arm")
    for name, batch in batches:
        budget = args.budget or int(tcfg.micro_batch_size) * max(len(s.token_ids) for s in batch)
        report(name, compare(model, initial, tcfg, batch, budget, args.reps, tokenizer.pad_token_id or 0))


if __name__ == "__main__":
    main()
