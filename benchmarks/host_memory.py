"""Host memory of the three players (an idle player keeps only the weights it samples with): process RSS and the
bytes each player holds, per item.

    python -m benchmarks.host_memory                          # experiment=smoke (SmolLM2-135M, torch backend)
    python -m benchmarks.host_memory trainer=deepspeed_zero3 trainer.offload_optimizer=true trainer.ref_mode=precompute

Builds the players of experiment=smoke on the CPU (the run's precision, ``auto`` resolved as a run resolves it), then
calls what the outer loop calls around two blocks, without sampling: ``start_iteration``; Planning's block
(``start_block``, two updates on a synthetic batch, the block-end checkpoint, ``end_block``); then Execution's block.
After each step it prints the process RSS (``VmRSS``, after ``malloc_trim`` so that memory the allocator keeps but
no tensor holds is not counted) and its peak (``VmHWM``). At the end, the bytes each player holds in host memory,
per item (a storage counted once, in the first item that names it):

- sampling weights: what the player samples with (``players[role].model``): all an idle player needs in memory;
- master weights: the trainer's float32 weights when they are not the sampling weights (torch: its module; DeepSpeed:
  the optimizer's fp32 partitions);
- optimizer state: AdamW's moments (and step counts);
- gradients: the master weights' and the compute copy's ``.grad``; DeepSpeed's gradient buffers;
- reference: π_ref (``ref_mode`` copy: a module; precompute: a state dict);
- other: any other host tensor the DeepSpeed optimizer holds.

The load average is printed at the start and the end: on a shared machine RSS is exact, times are not.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

ITEMS = ("sampling weights", "master weights", "optimizer state", "gradients", "reference", "other")


def status(key: str) -> int:
    """``/proc/self/status`` field ``key`` (VmRSS, VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def trimmed_rss() -> int:
    """RSS after glibc hands its free pages back (malloc_trim): what the process's objects hold."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return status("VmRSS")


def _tensors(obj, depth: int = 3, grads: bool = True):
    """The tensors inside ``obj`` (a tensor, or nested lists, tuples and dicts of them), and their gradients."""
    if isinstance(obj, torch.Tensor):
        yield obj
        if grads and obj.is_leaf and obj.grad is not None:
            yield obj.grad
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth - 1, grads)
    elif depth > 0 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth - 1, grads)


def _module_tensors(module) -> list[torch.Tensor]:
    if module is None:
        return []
    out = [p for p in module.parameters()] + [b for b in module.buffers()]
    out += [p.ds_tensor for p in module.parameters() if hasattr(p, "ds_tensor")]  # ZeRO-3 partitions
    return out


def _grads(module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters() if p.grad is not None] if module is not None else []


def player_items(player) -> dict[str, list[torch.Tensor]]:
    """The tensors of one player, by item (see the module docstring)."""
    trainer = player.trainer
    items: dict[str, list[torch.Tensor]] = {k: [] for k in ITEMS}
    items["sampling weights"] = _module_tensors(player.model)
    if trainer is None:
        return items
    engine = getattr(trainer, "engine", None)
    if engine is None:  # the torch backend; its module as is (``trainer.model`` brings parked master weights back)
        held = trainer.held_weights
        items["master weights"] = _module_tensors(held.masters)
        items["gradients"] = _grads(held.masters) + [g for m in held.copies.values() for g in _grads(m)]
        if trainer.optimizer is not None:
            items["optimizer state"] = list(_tensors(list(trainer.optimizer.state.values())))
    else:
        zero = engine.optimizer
        for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
            items["master weights"] += list(_tensors(getattr(zero, name, None), 1, grads=False))
        basic = getattr(zero, "optimizer", zero)
        items["optimizer state"] = list(_tensors(list(getattr(basic, "state", {}).values())))
        items["gradients"] = [t.grad for t in items["master weights"] if t.grad is not None]
        items["gradients"] += _grads(trainer.model)
        for name in ("grad_partitions_flat_buffer", "averaged_gradients"):
            items["gradients"] += list(_tensors(getattr(zero, name, None)))
        items["other"] = [t for v in vars(zero).values() for t in _tensors(v)]
    reference = trainer.held_reference
    items["reference"] = _module_tensors(reference.module) + list(_tensors(dict(reference.weights)))
    return items


def held_bytes(players) -> dict[str, dict[str, int]]:
    """Host bytes per role per item; a storage counted once over the whole team (a shared model: once)."""
    seen: set[int] = set()
    out = {}
    for role, player in players.items():
        row = {}
        for item, tensors in player_items(player).items():
            total = 0
            for t in tensors:
                if t is None or t.device.type != "cpu":
                    continue
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if storage.nbytes() == 0 or key in seen:
                    continue
                seen.add(key)
                total += storage.nbytes()
            row[item] = total
        out[role] = row
    return out


def synthetic_batch(vocab: int, n: int = 8, length: int = 96, group_size: int = 4, seed: int = 0):
    """``n`` samples of random tokens (a 16-token prompt, the rest trained) with advantages ±1 in groups."""
    from unifiedplayers.trainer import TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        mask = [0] * 16 + [1] * (length - 16)
        out.append(TrainSample(ids, mask, [0.0] * length, 1.0 if i % 2 else -1.0, i // group_size))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    print(f"load average at start {os.getloadavg()}, cores {os.cpu_count()}")
    run_dir = Path(tempfile.mkdtemp(prefix="up-hostmem-"))  # the block-end checkpoints (removed at the end)
    try:
        measure(run_dir, args.overrides)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def measure(run_dir: Path, overrides: list[str]) -> None:
    from unifiedplayers.config import compose
    from unifiedplayers.loop.outer import OuterLoop
    from unifiedplayers.precision import resolve_run_precision

    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", "resume=false"] + overrides)
    resolve_run_precision(cfg)
    torch.set_num_threads(max(1, int(cfg.trainer.num_threads)))
    loop = OuterLoop(cfg, run_dir)
    team, timing = loop.team, {"model_load_s": 0.0}
    rows = []

    def mark(what: str) -> None:
        rows.append((what, trimmed_rss(), status("VmHWM")))
        print(f"  {what:<46} RSS {rows[-1][1] / 2**20:8.0f} MiB   peak {rows[-1][2] / 2**20:8.0f} MiB", flush=True)

    mark("imports")
    team.setup(*team.load_backbone(None, timing))
    print(f"backend {cfg.trainer.backend}, model.dtype {cfg.model.dtype}, trainer.dtype {cfg.trainer.dtype}, "
          f"ref_mode {cfg.trainer.ref_mode}, kl_coef {cfg.trainer.kl_coef}, "
          f"{sum(getattr(p, 'ds_numel', p.numel()) for p in team.players['execution'].model.parameters()) / 1e6:.1f}M "
          "parameters")
    mark("players built")
    team.start_iteration(run_dir, {})
    mark("start_iteration (pi_ref := current weights)")
    batch = synthetic_batch(team.tokenizer.vocab_size if hasattr(team.tokenizer, "vocab_size") else 49152)
    t0 = time.perf_counter()
    for i, role in enumerate(("planning", "execution")):
        team.start_block(role)
        trainer = team.players[role].trainer
        trainer.recompute_old_logprobs(batch)  # pi_old: the trainer's own forward (ratios near 1)
        for step in range(2):
            team.update(role, 1, batch, on_policy=step == 0)
        mark(f"{role}: 2 updates")
        trainer.save_checkpoint(run_dir / "checkpoints" / "iter1" / role)  # a block end always saves
        team.end_block(role)
        mark(f"{role}: block end (checkpoint, end_block)")
    print(f"blocks: {time.perf_counter() - t0:.1f} s")
    held = held_bytes(team.players)
    print("host bytes held per player, after both blocks (MiB):")
    print(f"  {'':<12}" + "".join(f"{k:>18}" for k in ITEMS) + f"{'total':>10}")
    for role, row in held.items():
        cells = "".join(f"{row[k] / 2**20:18.1f}" for k in ITEMS)
        print(f"  {role:<12}{cells}{sum(row.values()) / 2**20:10.1f}")
    total = sum(sum(r.values()) for r in held.values())
    print(f"  all players {total / 2**20:.1f} MiB; process RSS {trimmed_rss() / 2**20:.0f} MiB, "
          f"peak {status('VmHWM') / 2**20:.0f} MiB")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
