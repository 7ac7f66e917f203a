"""The whole plan of a run on a machine (:func:`plan`): memory, disk and compute put together, with the assumptions
its figures rest on."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from unifiedplayers.capacity.arch import Arch
from unifiedplayers.capacity.compute import (CPU_ADAM_PARAMS_PER_S, RoleCompute, omitted_seconds, pool_seconds,
                                             role_compute)
from unifiedplayers.capacity.disk import checkpoint_items, disk_items, parked_item
from unifiedplayers.capacity.hardware import Hardware
from unifiedplayers.capacity.memory import (CPU_RANK_OVERHEAD, GPU_RANK_OVERHEAD, VLLM_OVERHEAD, Instant, Item,
                                            device_instants, host_instants)
from unifiedplayers.capacity.units import GiB
from unifiedplayers.capacity.workload import CHARS_PER_TOKEN, RoleLoad, Setup, phase_stages, role_loads, setup_of
from unifiedplayers.schedule import blocks

PAPER_GPU_HOURS = 432  # Appendix H.2 (its Table 3 paragraph) and Table 16's M = 4 row: full UnifiedPlayers on
# Qwen3-4B-Base, 8 x A100 80GB, local GPU-hours per seed (Table 14's body is missing from our copy of the paper)


@dataclass(frozen=True)
class Plan:
    """What a run needs of a machine (:func:`plan`)."""

    experiment: str
    model: str
    arch: Arch
    machine: Hardware
    on_gpu: bool
    world: int  # ranks, over all the nodes
    loads: dict[str, RoleLoad]
    gpu: tuple[Instant, ...]  # per GPU; () on a CPU run
    host: tuple[Instant, ...]  # per node: the ranks on it
    checkpoint: tuple[Item, ...]  # one checkpoint of a trained player
    disk: tuple[Item, ...]  # at the run directory: the run's peak first
    parked: Optional[Item]  # the idle players' state in trainer.offload_dir, per node
    # per GPU: (vLLM's KV budget, one max_model_len sequence's KV, the largest generation call's KV on one rank)
    vllm_kv: Optional[tuple[float, float, float]]
    roles: dict[str, RoleCompute]
    updates: dict[str, int]
    pool_seconds: float  # the Appendix D.2 diagnostic pool, wall
    assumptions: tuple[str, ...]
    omitted: tuple[tuple[str, float], ...] = ()  # (what, estimated wall seconds) left out of wall_seconds
    adapter: int = 0  # trainer.lora.rank > 0: one adapter's parameters (one backbone shared by the players)
    sleep: int = 0  # rollout.sleep_level of a vLLM engine on a GPU

    @property
    def node_ranks(self) -> int:
        return self.world // self.machine.nodes

    @property
    def gpu_peak(self) -> Optional[Instant]:
        return max(self.gpu, key=lambda i: i.total) if self.gpu else None

    @property
    def host_peak(self) -> Instant:
        return max(self.host, key=lambda i: i.total)

    @property
    def run_disk(self) -> float:
        return self.disk[0].bytes

    def parked_on_run_disk(self, machine: Hardware) -> Item:
        """What the idle players' parked state adds to the run directory's disk: nothing when ``machine`` gives
        trainer.offload_dir a file system of its own, else every node's (one node's on one node)."""
        nodes = self.machine.nodes
        if self.parked is None or machine.offload_disk is not None:
            return Item("no parked state on the run directory's disk", 0.0, "trainer.offload_dir")
        if nodes == 1:
            return self.parked
        return replace(self.parked, name=f"{self.parked.name.removesuffix(' per node')} x {nodes} nodes",
                       bytes=self.parked.bytes * nodes)

    @property
    def wall_seconds(self) -> float:
        return sum(self.updates[r] * sum(c.seconds.values()) for r, c in self.roles.items()) + self.pool_seconds

    @property
    def gpu_hours(self) -> Optional[float]:
        return self.wall_seconds * self.world / 3600 if self.on_gpu else None

    @property
    def total_flops(self) -> float:
        return sum(self.updates[r] * (c.generation_flops + c.training_flops + c.no_grad_flops)
                   for r, c in self.roles.items())


def plan(cfg: Any, machine: Hardware = Hardware()) -> Plan:
    s = setup_of(cfg, machine)
    loads = role_loads(cfg)
    device = device_instants(s, loads)
    checkpoint = checkpoint_items(s) if s.trained else ()
    sizes = dict(blocks(cfg))
    updates = {r: cfg.schedule.outer_iterations * sizes.get(r, 0) for r in s.trained}
    vllm_kv = None
    if s.on_gpu and cfg.rollout.backend == "vllm":
        weights = s.sample_width * s.arch.sampled_parameters
        budget = float(cfg.rollout.gpu_memory_utilization) * machine.gpu_memory - weights
        context = int(cfg.rollout.max_model_len or s.arch.max_position_embeddings)
        per_token = s.arch.kv_bytes_per_token(s.sample_width)
        demand = max((math.ceil(st.prompts / s.world) * st.samples * (st.prompt + st.steps + st.observations)
                      for r in s.trained for st in phase_stages(cfg, r, loads)), default=0)
        vllm_kv = (budget - VLLM_OVERHEAD, context * per_token, demand * per_token)
    return Plan(
        experiment=str(cfg.get("experiment") or "(defaults)"), model=str(cfg.model.name), arch=s.arch,
        machine=machine, on_gpu=s.on_gpu, world=s.world, loads=loads, gpu=device if s.on_gpu else (),
        host=host_instants(s, device), checkpoint=checkpoint, disk=disk_items(s, checkpoint), parked=parked_item(s),
        vllm_kv=vllm_kv, roles={r: role_compute(s, r, loads) for r in s.trained}, updates=updates,
        pool_seconds=pool_seconds(s, loads), assumptions=assumptions(s),
        omitted=omitted_seconds(s, loads, disk_items(s, checkpoint), updates), adapter=s.adapter, sleep=s.sleep)


def assumptions(s: Setup) -> tuple[str, ...]:
    out = [
        f"sequences at their token budgets (player.*_max_new_tokens x max_turns, tool outputs of "
        f"observation_max_chars); prompts at {CHARS_PER_TOKEN:g} characters a token, questions of task_max_chars",
        f"auto dtypes: bfloat16 on a GPU, float32 on a CPU; {nodes_assumption(s)}; a phase's tasks all well-formed",
        f"host RAM per rank beyond its tensors: {(GPU_RANK_OVERHEAD if s.on_gpu else CPU_RANK_OVERHEAD) / GiB:g} GiB",
    ]
    if s.on_gpu:
        m = s.machine
        out += [
            f"GPU-hours: wall time x {s.world} GPUs; compute at {m.utilisation:.0%} of {m.gpu_flops / 1e12:g} TFLOP/s "
            f"(training, prefill, no-grad passes), decoding at {m.decode_efficiency:.0%} of "
            f"{m.gpu_bandwidth / 1e12:g} TB/s (it reads the weights and every row's KV cache each step)",
            f"host optimizer (ZeRO-Offload) at {CPU_ADAM_PARAMS_PER_S / 1e9:g}e9 parameters/s; sandbox time, weight "
            "copies into vLLM, checkpoint writes and start-up not counted (the GPUs idle through them)",
        ]
    return tuple(out)


def nodes_assumption(s: Setup) -> str:
    nodes = s.machine.nodes
    if nodes == 1:
        return "one node"
    return (f"{nodes} nodes of {s.node_ranks} ranks, alike (host RAM and trainer.offload_dir: each node's own, node "
            "0's shown; the run directory: one file system shared by the nodes); links between nodes timed as those "
            "within one")
