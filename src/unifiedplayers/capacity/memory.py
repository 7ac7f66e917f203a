"""Memory, item by item: one rank's device (GPU, or a CPU process) at each instant of an update, and a node's host
RAM (:class:`Instant`, each a tuple of :class:`Item`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from unifiedplayers.capacity.units import GiB, count
from unifiedplayers.capacity.workload import RoleLoad, Setup, ds_setting, micro_rows, phase_stages

GPU_RANK_OVERHEAD = 6 * GiB  # host RAM of one GPU rank: Python, torch and CUDA's host side, vLLM's, tokenizer, sandbox
CPU_RANK_OVERHEAD = 1 * GiB  # host RAM of one CPU process beyond its tensors (benchmarks/README.md: ~0.4 GiB + sandbox)
CUDA_RESERVE = 1.5 * GiB  # per GPU: CUDA context, NCCL buffers, the caching allocator's slack
VLLM_OVERHEAD = 2 * GiB  # inside vLLM's budget: activations, CUDA graphs, sampler
VLLM_CPU_KV = 4 * GiB  # vLLM's CPU build: the KV cache the engine asks for (rollout/vllm_engine.py, CPU_KV_CACHE_BYTES)
VLLM_MAX_LORAS = 4  # adapters vLLM keeps loaded (rollout/vllm_engine.py, MAX_LORAS)
ZERO3_NORM_CHUNK = 250_000_000  # DeepSpeed ZeRO-3's buffered gradient norm: elements per float64 chunk
OPTIMIZER_STATE_BYTES = 18  # per parameter, ZeRO: fp32 master 4, Adam 8, fp32 gradients 4, bf16 gradient buffer 2
ENTROPY_BATCH, ENTROPY_ROWS = 16, 512  # mean_token_entropy: contexts per forward, rows per logits block


@dataclass(frozen=True)
class Item:
    """One thing that takes memory or disk: what it is, its bytes, and the setting that changes it."""

    name: str
    bytes: float
    setting: str


@dataclass(frozen=True)
class Instant:
    """One moment of an update and what is in memory then (one GPU's, or a node's host RAM)."""

    name: str
    items: tuple[Item, ...]

    @property
    def total(self) -> float:
        return sum(i.bytes for i in self.items)


WIDTH_NAMES = {2: "16-bit", 4: "fp32"}


def resident_items(s: Setup) -> list[Item]:
    """What one rank's device holds through a whole update."""
    n, cfg = s.n, s.cfg
    if s.adapter:
        return adapter_resident_items(s)
    frozen = s.models - s.trained_models
    shard = f", 1/{s.shard} each (ZeRO-3)" if s.shard > 1 else ""
    hint = "; more GPUs under trainer=deepspeed_zero3 (it shards them)" if s.on_gpu else ""
    items = [Item(f"{s.models} players' weights ({count(n)} x {WIDTH_NAMES[s.sample_width]}{shard})",
                  s.sample_width * n * (s.trained_models / s.shard + frozen), "model.dtype" + hint)]
    if s.trained:
        items += active_state_items(s)
    if s.kl and cfg.trainer.ref_mode == "copy":
        items.append(Item("pi_ref, a whole copy (ref_mode copy)", s.compute_width * n,
                          "trainer.ref_mode=precompute keeps it on the host"))
    return items + engine_items(s)


def engine_items(s: Setup) -> list[Item]:
    """vLLM's engine and the CUDA context, on the device whatever the players hold."""
    items = vllm_items(s) if s.cfg.rollout.backend == "vllm" else []
    if s.on_gpu:
        items.append(Item("CUDA context, NCCL, allocator slack", CUDA_RESERVE, "(fixed)"))
    return items


def adapter_resident_items(s: Setup) -> list[Item]:
    """``trainer.lora.rank`` > 0: one frozen backbone in the trainers' compute dtype, an adapter per player (float32),
    the active adapter's gradients and AdamW state, π_ref an adapter too."""
    a = s.adapter
    items = [Item(f"the backbone's weights, one copy the {s.models} players share ({count(s.n)} x "
                  f"{WIDTH_NAMES[s.compute_width]})", s.compute_width * s.n, "trainer.dtype"),
             Item(f"{s.models} players' adapters ({count(a)} x fp32 each)", 4 * a * s.models, "trainer.lora.rank")]
    if s.trained:
        items += [Item("active adapter's gradients (fp32)", 4 * a, "trainer.lora.rank"),
                  Item("active adapter's AdamW state (2 x fp32)", 8 * a, "trainer.lora.rank")]
    if s.kl and s.cfg.trainer.ref_mode == "copy":
        items.append(Item("pi_ref, an adapter (ref_mode copy)", 4 * a, "trainer.ref_mode"))
    return items + engine_items(s)


def active_state_items(s: Setup) -> list[Item]:
    """The active player's training state on the device (none of it under ZeRO-Offload)."""
    n = s.n
    if s.deepspeed:
        if s.cfg.trainer.offload_optimizer:
            return []
        return [Item(f"optimizer state {OPTIMIZER_STATE_BYTES}N/{s.world} (fp32 master, Adam, gradients)",
                     OPTIMIZER_STATE_BYTES * n / s.world, "trainer.offload_optimizer=true moves it to the host")]
    items = []
    if s.sample_width != 4:
        items.append(Item("active player's fp32 master weights", 4 * n, "trainer.backend=deepspeed_*"))
    if s.compute_width not in (4, s.sample_width):
        items.append(Item("active player's compute copy", s.compute_width * n, "trainer.dtype"))
    grads = 4 * n + (s.compute_width * n if s.compute_width != 4 else 0)
    items.append(Item("active player's gradients", grads, "trainer.backend=deepspeed_* shards them"))
    items.append(Item("active player's AdamW state (2 x fp32)", 8 * n, "trainer.backend=deepspeed_* shards it"))
    return items


def vllm_items(s: Setup) -> list[Item]:
    """vLLM's engine: gpu_memory_utilization of the GPU, for its weights (and adapters), activations and KV cache;
    asleep (``rollout.sleep_level``), it frees them for the trainer's passes."""
    weights = s.sample_width * s.arch.sampled_parameters
    adapters = ([Item(f"vLLM: the adapters it keeps loaded ({VLLM_MAX_LORAS})", VLLM_MAX_LORAS * s.sample_width
                      * s.adapter, "trainer.lora.rank")] if s.adapter else [])
    if not s.on_gpu:
        return [Item("vLLM (CPU): its weights", weights, "rollout.backend"), *adapters,
                Item("vLLM (CPU): KV cache", VLLM_CPU_KV, "VLLM_CPU_KVCACHE_SPACE")]
    budget = float(s.cfg.rollout.gpu_memory_utilization) * s.machine.gpu_memory
    return [Item("vLLM: its copy of the sampling weights", weights, "rollout.gpu_memory_utilization"), *adapters,
            Item("vLLM: KV cache, activations, CUDA graphs", max(0.0, budget - weights - sum(i.bytes for i in adapters)),
                 "rollout.gpu_memory_utilization")]


def asleep(s: Setup, resident: Sequence[Item]) -> tuple[Item, ...]:
    """``resident`` while vLLM sleeps (``rollout.sleep_level``): its items freed, one line saying how much."""
    freed = sum(i.bytes for i in resident if i.name.startswith("vLLM"))
    kept = tuple(i for i in resident if not i.name.startswith("vLLM"))
    where = "to the host" if s.sleep == 1 else "dropped"
    return kept + (Item(f"vLLM asleep: {freed / GiB:.1f} GiB freed (KV cache; weights {where})", 0.0,
                        "rollout.sleep_level"),)


def pass_items(s: Setup, load: RoleLoad, kind: str) -> list[Item]:
    """What one micro-batch of ``load`` adds to the device in a pass: ``no-grad`` (π_old, π_ref), ``forward`` or
    ``backward`` (with gradient checkpointing the layer inputs, else every layer's activations; the LM head's float32
    (rows, vocab) block, whole or by trainer.logprob_chunk_rows)."""
    cfg, a, b = s.cfg, s.arch, s.compute_width
    rows = micro_rows(cfg, load)
    tokens, scored = rows * load.length, rows * load.response
    chunk = int(cfg.trainer.logprob_chunk_rows)
    block = min(chunk, scored) if chunk > 0 else scored
    layer = tokens * a.layer_activations() * b
    mb = f"{rows} x {load.length} tokens"
    items = []
    if s.backend == "deepspeed_zero3":
        live = max(a.layer_parameters, a.embedding_parameters) + ds_setting(cfg, "stage3_prefetch_bucket_size")
        items.append(Item("ZeRO-3 live parameters (a layer or the embedding)", live * b,
                          "trainer.ds_config.zero_optimization.stage3_prefetch_bucket_size"))
    head = Item(f"LM-head float32 block ({block} rows x {a.vocab_size})", block * a.vocab_size * 4,
                "trainer.logprob_chunk_rows; trainer.micro_batch_size")
    if kind == "no-grad":
        return items + [Item(f"one layer's activations ({mb})", layer, "trainer.micro_batch_size"), head]
    if cfg.trainer.gradient_checkpointing:
        kept = Item(f"checkpointed layer inputs ({mb})", a.num_hidden_layers * tokens * a.hidden_size * b,
                    "trainer.micro_batch_size; player.*_max_new_tokens")
    else:
        kept = Item(f"every layer's activations ({mb})", a.num_hidden_layers * layer,
                    "trainer.gradient_checkpointing=true; trainer.micro_batch_size")
    items += [kept, head]
    if kind == "backward":
        redo = 2 if cfg.trainer.gradient_checkpointing else 1
        items.append(Item("one layer's activations and gradients", redo * layer, "trainer.micro_batch_size"))
        # the logits' gradient block, and the head's full weight gradient (vocab x hidden) before it is reduced:
        # accumulated in float32 over chunks, else in the compute dtype (none under adapters: the head is frozen)
        head_grad = 0 if s.adapter else a.embedding_parameters * (4 if chunk > 0 else b)
        items.append(Item("LM-head gradient block" + ("" if s.adapter else " and weight gradient"),
                          block * a.vocab_size * b + head_grad, "trainer.logprob_chunk_rows"))
        if s.deepspeed:
            items.append(Item("DeepSpeed gradient reduce bucket", ds_setting(cfg, "reduce_bucket_size") * b,
                              "trainer.ds_config.zero_optimization.reduce_bucket_size"))
        if s.deepspeed and cfg.trainer.offload_optimizer:
            items += offload_gradient_items(s)
    return items


def offload_gradient_items(s: Setup) -> list[Item]:
    """ZeRO-Offload at the end of the backward, on the largest parameter's shard (the embedding; docs/gpu/): ZeRO-3
    copies the gradient partition back onto the GPU and takes its float64 norm in ZERO3_NORM_CHUNK chunks; ZeRO-2
    takes it whole."""
    shard = s.arch.embedding_parameters / s.world
    if s.backend != "deepspeed_zero3":
        return [Item("gradient norm in float64 (ZeRO-Offload, the largest parameter's partition)", 8 * shard,
                     "trainer.offload_optimizer")]
    return [Item("gradient partition back on the GPU (ZeRO-Offload, the largest parameter's)",
                 s.compute_width * shard, "trainer.offload_optimizer"),
            Item("gradient norm's float64 chunk (ZeRO-Offload, 250M elements at most)",
                 8 * min(shard, ZERO3_NORM_CHUNK), "trainer.offload_optimizer")]


def rollout_items(s: Setup, loads: Mapping[str, RoleLoad]) -> list[Item]:
    """hf generation: the KV cache and last logits of one rollout.batch_size batch of a phase's largest call at its
    full context (vLLM's engine is resident instead)."""
    if s.cfg.rollout.backend == "vllm" or not s.trained:
        return []
    size = int(s.cfg.rollout.batch_size)
    calls = [(math.ceil(st.prompts / s.world) * st.samples, st.prompt + st.steps + st.observations)
             for r in s.trained for st in phase_stages(s.cfg, r, loads)]
    rows, length = max(((min(size, n) if size > 0 else n, c) for n, c in calls), key=lambda x: x[0] * x[1])
    return [Item(f"hf generation: KV cache ({rows} x {length} tokens)",
                 rows * length * s.arch.kv_bytes_per_token(s.sample_width), "rollout.batch_size"),
            Item("hf generation: logits", rows * s.arch.vocab_size * 4, "rollout.batch_size")]


def device_instants(s: Setup, loads: Mapping[str, RoleLoad]) -> tuple[Instant, ...]:
    """One rank's device at each instant of an update; a pass's items are those of the player whose micro-batch
    makes that instant largest."""
    generation = tuple(resident_items(s))
    base = asleep(s, generation) if s.sleep else generation  # the trainer's passes
    b, n = s.compute_width, s.n
    out = []
    if s.trained and s.backend == "deepspeed_zero3":
        out.append(Instant("gather", base + (Item("a player's weights gathered whole", b * n, "trainer.backend"),)))
    kinds = (["no-grad"] if s.kl or s.cfg.trainer.recompute_old_logprobs else []) + ["forward", "backward"]
    for kind in (kinds if s.trained else ()):
        best = max((Instant(f"{kind} ({r})", base + tuple(pass_items(s, loads[r], kind))) for r in s.trained
                    if loads[r].rows), key=lambda i: i.total, default=None)
        if best is not None:
            out.append(best)
    if s.trained and s.deepspeed and s.cfg.trainer.offload_optimizer:
        out.append(Instant("step", base + (Item("updated weights back from the host", b * n / s.world,
                                                "trainer.offload_optimizer"),)))
    elif s.trained:
        out.append(Instant("step", base))
    if s.trained and s.cfg.trainer.entropy_bank_size > 0:
        out.append(Instant("bank", base + entropy_items(s, loads)))
    out.append(Instant("generation", generation + tuple(rollout_items(s, loads))))
    return tuple(out)


def entropy_items(s: Setup, loads: Mapping[str, RoleLoad]) -> tuple[Item, ...]:
    """``logprobs.mean_token_entropy``: 16 contexts at a time, the logits 512 rows at a time (log-softmax, its exp
    and their product: three float32 blocks)."""
    prompt = max(loads[r].prompt for r in s.trained)
    tokens = min(ENTROPY_BATCH, int(s.cfg.trainer.entropy_bank_size)) * prompt
    return (Item("entropy bank: one layer's activations", tokens * s.arch.layer_activations() * s.compute_width,
                 "trainer.entropy_bank_size"),
            Item("entropy bank: logits blocks", 3 * ENTROPY_ROWS * s.arch.vocab_size * 4, "(fixed)"))


# --------------------------------------------------------------------------- host RAM
def host_instants(s: Setup, device: Sequence[Instant]) -> tuple[Instant, ...]:
    """Node 0's host RAM (the largest: ZeRO-3's one π_ref is on rank 0) at start-up and during an update: the ranks'
    processes, the node's share of ZeRO-Offload's state, π_ref and, while it is swapped in, the current weights; a CPU
    run adds each process's device instants."""
    cfg, n, b, ranks = s.cfg, s.n, s.compute_width, s.node_ranks
    what = "Python, torch, CUDA and vLLM host side, sandbox" if s.on_gpu else "Python, torch, tokenizer, sandbox"
    procs = Item(f"{ranks} process{'es' if ranks > 1 else ''}: {what}",
                 ranks * (GPU_RANK_OVERHEAD if s.on_gpu else CPU_RANK_OVERHEAD), "torchrun --nproc_per_node")
    host = [procs]
    if s.sleep == 1:
        host.append(Item("vLLM's weights on the host while it sleeps (level 1)", ranks * s.sample_width
                         * s.arch.sampled_parameters, "rollout.sleep_level=2 drops them (full-parameter players)"))
    if s.trained and s.deepspeed and cfg.trainer.offload_optimizer and not s.adapter:
        share = "over the ranks" if ranks == s.world else f"over the ranks: this node's {ranks} of {s.world}"
        host.append(Item(f"active player's ZeRO-Offload state ({OPTIMIZER_STATE_BYTES}N {share})",
                         OPTIMIZER_STATE_BYTES * n * ranks / s.world, "trainer.offload_optimizer=false keeps it on "
                                                                     "the GPUs"))
    if s.kl and cfg.trainer.ref_mode == "precompute" and s.adapter:
        host.append(Item(f"pi_ref adapters on {ref_holders(s)} rank(s)", ref_holders(s) * 4 * s.adapter,
                         "trainer.ref_mode"))
    elif s.kl and cfg.trainer.ref_mode == "precompute":
        holders = ref_holders(s)
        host.append(Item(f"pi_ref on {holders} rank(s) (ref_mode precompute)", holders * b * n, "trainer.ref_mode"))
        host.append(Item("current weights while pi_ref is swapped in", holders * b * n, "trainer.ref_mode"))
    if s.on_gpu:
        start = Instant("start-up", (procs, Item("the backbone read on the host by each rank", ranks * s.sample_width
                                                 * n, "model.dtype; torchrun --nproc_per_node")))
        return (start, Instant("update", tuple(host)))
    return tuple(Instant(i.name, tuple(host) + tuple(replace(x, bytes=x.bytes * ranks) for x in i.items))
                 for i in device)


def ref_holders(s: Setup) -> int:
    """The ranks of node 0 that hold a π_ref apart: rank 0 alone under ZeRO-3 with ref_mode precompute, else each."""
    return 1 if s.backend == "deepspeed_zero3" and s.cfg.trainer.ref_mode == "precompute" else s.node_ranks
