"""Disk: one trained player's checkpoint, the run directory replayed over the save cadence
(:func:`unifiedplayers.schedule.save_due`), and the idle players' state parked in ``trainer.offload_dir``."""
from __future__ import annotations

import tempfile
from typing import Any, Optional, Sequence

from unifiedplayers.capacity.memory import OPTIMIZER_STATE_BYTES, Item, ref_holders
from unifiedplayers.capacity.workload import Setup
from unifiedplayers.schedule import blocks, phase_steps, save_due


def checkpoint_items(s: Setup) -> tuple[Item, ...]:
    """One trained player's checkpoint (``TorchTrainer.save_checkpoint``): weights, optimizer state and π_ref."""
    n = s.n
    if s.adapter:  # an adapter player's checkpoint: its adapter, its AdamW state and pi_ref (an adapter), fp32
        return (Item("model.pt: the adapter", 4 * s.adapter, "trainer.lora.rank"),
                Item("optimizer state of the adapter", 8 * s.adapter, "trainer.lora.rank"),
                *((Item("reference.pt: pi_ref, an adapter", 4 * s.adapter, "trainer.lora.rank"),) if s.kl else ()))
    items = [Item("model.pt: the weights", (s.compute_width if s.deepspeed else 4) * n, "trainer.dtype")]
    if s.deepspeed:
        items.append(Item("deepspeed/: fp32 master + Adam partitions", 12 * n, "schedule.checkpoint_retention"))
    else:
        items.append(Item("optimizer.pt: AdamW state", 8 * n, "schedule.checkpoint_retention"))
    if s.kl:
        items.append(Item("reference.pt: pi_ref", s.compute_width * n, "schedule.checkpoint_retention"))
    return tuple(items)


def checkpoint_disk(cfg: Any, full: float, weights: float) -> tuple[float, float, float, int]:
    """(the peak bytes of checkpoints/ during the run, at its end, what the finished run keeps, saves), replayed with
    :func:`unifiedplayers.schedule.save_due`: an in-block save writes the resume copy the run state does not name, a
    block end a named checkpoint, after which the role's resume copies go and older named ones are thinned as
    ``schedule.checkpoint_retention`` says."""
    s, per_phase = cfg.schedule, phase_steps(cfg)
    kept = {"all": lambda role: full, "weights": lambda role: weights,
            "execution_weights": lambda role: weights if role == "execution" else 0.0}[s.checkpoint_retention]
    named: list[list[Any]] = []  # [role, bytes] of checkpoints/iter<t>/<role>
    resume: dict[str, float] = {}  # checkpoints/resume/<role>-a|b
    pointer: dict[str, str] = {}
    peak, saves = 0.0, 0
    ends = [(role, done, done == size) for _ in range(s.outer_iterations) for role, size in blocks(cfg)
            for done in range(per_phase, size + 1, per_phase) if save_due(done, size, per_phase, s.save_every)]
    for role, _, block_end in ends:
        saves += 1
        peak = max(peak, sum(b for _, b in named) + sum(resume.values()) + full)
        if block_end and s.checkpoint_every_block:
            named.append([role, full])
            resume = {k: b for k, b in resume.items() if not k.startswith(role + "-")}
            pointer[role] = "named"
            latest = {r: i for i, (r, _) in enumerate(named)}
            named = [[r, b if latest[r] == i else min(b, kept(r))] for i, (r, b) in enumerate(named)]
            continue
        name = f"{role}-{'b' if pointer.get(role, '').endswith('-a') else 'a'}"
        resume[name], pointer[role] = full, name
        if block_end:  # thin_at_block_end: the role's copy the state does not name goes
            resume = {k: b for k, b in resume.items() if not k.startswith(role + "-") or k == name}
    end = sum(b for _, b in named) + sum(resume.values())
    finished = sum(kept(r) for r, _ in named) + sum(kept(k.split("-")[0]) for k in resume)
    return peak, end, finished, saves


def disk_items(s: Setup, checkpoint: Sequence[Item]) -> tuple[Item, ...]:
    """The run directory: its peak (checkpoints, stale feedback's published copies, schedule.export_at_end's
    export), what a finished run keeps, what the saves write in all."""
    if not s.trained:
        return (Item("checkpoints (no trained player)", 0.0, "method"),)
    full = sum(i.bytes for i in checkpoint)
    peak, end, finished, saves = checkpoint_disk(s.cfg, full, checkpoint[0].bytes)
    copy = 4 * s.adapter if s.adapter else s.sample_width * s.n  # a published copy: an adapter, or the weights
    published = s.trained_models * copy if s.cfg.schedule.feedback == "stale" else 0.0
    export = s.trained_models * s.sample_width * s.n if s.cfg.schedule.get("export_at_end", False) else 0.0
    return (Item("run directory at its peak (checkpoints, published copies, export)",
                 max(peak + published, end + export),
                 "schedule.save_every; schedule.checkpoint_retention; schedule.checkpoint_every_block"),
            Item("a finished run keeps", finished + export, "schedule.checkpoint_retention"),
            Item(f"written by {saves} saves in all", saves * full, "schedule.save_every"))


def parked_item(s: Setup) -> Optional[Item]:
    """The idle trained players' state parked by ``trainer/offload.py`` on node 0 (the largest; each node parks its
    own ranks'): optimizer state (the torch backend's with the float32 masters when it samples from a copy), π_ref."""
    if not s.trained:
        return None
    n = s.n
    if s.adapter:  # AdamW of an adapter on every rank, pi_ref an adapter
        opt, ref = s.node_ranks * 8 * s.adapter, (ref_holders(s) * 4 * s.adapter if s.kl else 0.0)
        return _parked(s, opt, ref)
    if s.deepspeed:
        opt = OPTIMIZER_STATE_BYTES * n * s.node_ranks / s.world
    else:  # every rank holds the whole state
        opt = s.node_ranks * (8 * n + (4 * n if s.sample_width != 4 else 0))
    ref = ref_holders(s) * s.compute_width * n if s.kl else 0.0
    return _parked(s, opt, ref)


def _parked(s: Setup, opt: float, ref: float) -> Item:
    """The larger of: every trained player's optimizer state at start-up, the idle ones' with their pi_ref later."""
    worst = max(s.trained_models * opt, (s.trained_models - 1) * (opt + ref))
    where = s.cfg.trainer.offload_dir or tempfile.gettempdir()
    each = " per node" if s.machine.nodes > 1 else ""
    return Item(f"idle players' parked state (trainer.offload_dir: {where}){each}", worst,
                "trainer.offload_dir (a local disk, not tmpfs)")
