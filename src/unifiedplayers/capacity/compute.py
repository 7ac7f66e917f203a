"""Compute: tokens, sandbox calls and FLOPs per optimizer step (:mod:`unifiedplayers.trainer.flops` conventions), the
wall seconds of each stage on a GPU run, and the wall time the plan leaves out."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from unifiedplayers.capacity.arch import Arch
from unifiedplayers.capacity.memory import OPTIMIZER_STATE_BYTES, Item
from unifiedplayers.capacity.units import GB, TB
from unifiedplayers.capacity.workload import (RoleLoad, Setup, Stage, busiest_rank_rows, observation_tokens,
                                              phase_stages)
from unifiedplayers.config import resolve_player_config, role_trainer_config
from unifiedplayers.schedule import phase_steps

DISK_WRITE_BYTES_PER_S = 1e9  # checkpoint writes to the run's disk (an assumption: a local NVMe or a fast share)
GPU_LINK_BYTES_PER_S = 150e9  # per GPU, ZeRO-3's all-gather of the weights (an assumption: NVLink within a node)
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeed's CPU Adam over a node's ranks (ZeRO-Offload), parameters a second
PCIE_BYTES_PER_S = 20e9  # per GPU, gradients to the host and weights back (ZeRO-Offload)


@dataclass(frozen=True)
class RoleCompute:
    """A player's optimizer step, averaged over its phases (a phase samples for S steps, each trained μ times)."""

    generated: float  # tokens decoded
    trained: float  # tokens in the loss
    sandbox_calls: float  # tool calls, arg_mutation re-runs, verdict-matrix checks
    generation_flops: float
    training_flops: float  # 3 × the mini-batch's forward (the MFU convention; recomputation not counted)
    no_grad_flops: float  # π_old recompute, π_ref, entropy bank
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds by stage (a GPU run)


def stage_flops(a: Arch, st: Stage) -> float:
    """Prefill of each prompt once (vLLM's prefix cache), then each sample's tokens and tool outputs."""
    sample = a.extend_flops(st.prompt, st.steps + st.observations, st.steps)
    return st.prompts * (a.forward_flops(st.prompt, 0) + st.samples * sample)


def stage_seconds(s: Setup, st: Stage) -> float:
    """Wall seconds of a stage on the busiest rank (a call is split over the ranks by prompt). A decoding step reads
    the weights and every row's KV cache or does 2·P per row, whichever is slower, each row to its budget; prefill
    (prompts, tool outputs) is compute-bound."""
    m, a = s.machine, s.arch
    prompts = math.ceil(st.prompts / s.world)
    rows = prompts * st.samples
    context = st.prompt + (st.steps + st.observations) / 2
    read = s.sample_width * a.sampled_parameters + rows * context * a.kv_bytes_per_token(s.sample_width)
    step = max(read / (m.gpu_bandwidth * m.decode_efficiency),
               rows * 2 * (a.linear_parameters + a.embedding_parameters) / (m.gpu_flops * m.utilisation))
    prefill = prompts * a.forward_flops(st.prompt, 0) + rows * a.extend_flops(st.prompt, st.observations, 0)
    return st.steps * step + prefill / (m.gpu_flops * m.utilisation)


def role_compute(s: Setup, role: str, loads: Mapping[str, RoleLoad]) -> RoleCompute:
    """Tokens, sandbox calls, FLOPs and wall seconds of one optimizer step of ``role``."""
    cfg, a, m, load = s.cfg, s.arch, s.machine, loads[role]
    p, t = resolve_player_config(cfg), role_trainer_config(cfg.trainer, role)
    per_phase, mu = phase_steps(cfg), int(cfg.trainer.num_iterations)
    stages = phase_stages(cfg, role, loads)
    verifiers = loads["evaluation"].rows // p.tasks_per_update
    rules = len(cfg.perturbation.rules) if verifiers else 0
    tasks, k = stages[1].prompts, p.num_trajectories
    tools = k * stages[1].turns if cfg.method.use_tools else 0
    calls = tasks * (tools + (k if "arg_mutation" in cfg.perturbation.rules and rules else 0)
                     + verifiers * k * (1 + rules))
    row = a.forward_flops(load.length, load.response)
    grad = 2 if s.adapter else 3  # forward and backward; frozen weights (adapters) take no weight gradient
    passes = (1 if t.kl_coef != 0 else 0) + (1 / mu if cfg.trainer.recompute_old_logprobs else 0)
    # mean_token_entropy over the bank (Appendix D.2): entropy_bank_size prompts, the LM head on every position
    bank = int(cfg.trainer.entropy_bank_size) * a.forward_flops(load.prompt, load.prompt)
    bank *= bank_scorings_per_update(cfg, role)
    seconds: dict[str, float] = {}
    if s.on_gpu:
        seconds["generation"] = sum(stage_seconds(s, st) for st in stages) / per_phase
        per_rank = busiest_rank_rows(cfg, load, s.world)
        redo = 1 if cfg.trainer.gradient_checkpointing else 0  # checkpointing runs each forward twice
        seconds["training"] = per_rank * row * (grad + redo + passes) / (m.gpu_flops * m.utilisation)
        seconds["optimizer step"] = optimizer_seconds(s)
        seconds["entropy bank"] = bank / s.world / (m.gpu_flops * m.utilisation)  # the bank split over the ranks
    return RoleCompute(
        generated=sum(st.prompts * st.samples * st.steps for st in stages) / per_phase,
        trained=load.rows * load.response, sandbox_calls=calls / per_phase,
        generation_flops=sum(stage_flops(a, st) for st in stages) / per_phase,
        training_flops=grad * load.rows * row, no_grad_flops=passes * load.rows * row + bank, seconds=seconds)


def bank_scorings_per_update(cfg: Any, role: str) -> float:
    """How often the entropy bank is scored, per update of ``role`` (``trainer.diagnostics``): at each block's start
    and end, and after every ``trainer.entropy_every``-th update when it is above 0 (the end not twice)."""
    if int(cfg.trainer.entropy_bank_size) <= 0:
        return 0.0
    block, every = int(cfg.schedule[f"{role}_updates"]), int(cfg.trainer.entropy_every)
    if block <= 0:
        return 0.0
    within = block // every if every > 0 else 0
    end = 0 if every > 0 and block % every == 0 else 1
    return (1 + within + end) / block


def optimizer_seconds(s: Setup) -> float:
    """ZeRO-Offload: CPU Adam over a node's share of N, gradients and weights over PCIe; else the GPU reads and
    writes the optimizer state at HBM bandwidth."""
    n = s.n
    if s.adapter:  # the adapter's AdamW step (16 bytes a parameter read and written) on the GPU
        return 2 * 16 * s.adapter / s.machine.gpu_bandwidth
    if s.deepspeed and s.cfg.trainer.offload_optimizer:
        node_share = n * s.node_ranks / s.world
        return node_share / CPU_ADAM_PARAMS_PER_S + 2 * s.compute_width * n / s.world / PCIE_BYTES_PER_S
    return 2 * OPTIMIZER_STATE_BYTES * n / ((s.world if s.deepspeed else 1) * s.machine.gpu_bandwidth)


def pool_seconds(s: Setup, loads: Mapping[str, RoleLoad]) -> float:
    """The Appendix D.2 pool (schedule.execution_pool), answered greedily at the start and every ``every``
    Execution updates: the busiest rank's share of its questions."""
    pool, p = s.cfg.schedule.execution_pool, resolve_player_config(s.cfg)
    if not s.on_gpu or pool.every <= 0 or "execution" not in s.trained:
        return 0.0
    runs = 1 + s.cfg.schedule.outer_iterations * (s.cfg.schedule.execution_updates // pool.every)
    turns = int(pool.max_turns or p.max_turns)
    ex = loads["execution"]
    steps = turns * int(pool.max_new_tokens or p.execution_max_new_tokens)
    one = Stage("pool", int(pool.math_size + pool.general_size), 1, ex.prompt, steps,
                (turns - 1) * observation_tokens(p), turns)
    return runs * stage_seconds(s, one)


def omitted_seconds(s: Setup, loads: Mapping[str, RoleLoad], disk: Sequence[Item],
                    updates: Mapping[str, int]) -> tuple[tuple[str, float], ...]:
    """Wall time the plan does not count, estimated: checkpoint writes, the weights copied into vLLM after each
    optimizer step (gathered over the GPU links, reloaded at HBM bandwidth), and, for scale, the prefill vLLM's
    prefix cache saves (K - 1 of a prompt's K prefills, already left out of the generation stage)."""
    if not s.on_gpu:
        return ()
    out = []
    written = sum(i.bytes for i in disk if i.name.startswith("written by"))
    out.append((f"checkpoint writes ({written / TB:.2f} TB at an assumed {DISK_WRITE_BYTES_PER_S / 1e9:g} GB/s)",
                written / DISK_WRITE_BYTES_PER_S))
    if s.cfg.rollout.backend == "vllm":
        weights = 4 * s.adapter if s.adapter else s.sample_width * s.arch.sampled_parameters  # adapters: written out
        copy = weights * (s.world - 1) / s.world / GPU_LINK_BYTES_PER_S + weights / s.machine.gpu_bandwidth
        steps = sum(updates.values())
        what = "adapter copies into vLLM" if s.adapter else "weight copies into vLLM"
        size = f"{weights / 1e6:.0f} MB" if s.adapter else f"{weights / GB:.1f} GB"
        out.append((f"{what} ({steps:,} steps x {size}, GPU links at an assumed "
                    f"{GPU_LINK_BYTES_PER_S / 1e9:g} GB/s)", steps * copy))
        if s.cfg.rollout.get("enable_prefix_caching", True):
            saved = sum(updates[r] * prefix_saved_flops(s, r, loads) for r in s.trained)
            out.append(("prefill saved by vLLM's prefix cache (not spent: already outside the generation figure)",
                        -saved / s.world / (s.machine.gpu_flops * s.machine.utilisation)))
    return tuple(out)


def prefix_saved_flops(s: Setup, role: str, loads: Mapping[str, RoleLoad]) -> float:
    """The prompt prefills one optimizer step of ``role`` would repeat without a prefix cache: K - 1 per prompt."""
    stages = phase_stages(s.cfg, role, loads)
    return sum(st.prompts * (st.samples - 1) * s.arch.forward_flops(st.prompt, 0) for st in stages) / phase_steps(s.cfg)
