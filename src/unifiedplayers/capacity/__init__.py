"""The capacity and compute plan of a run (issue 30): whether a preset fits a machine's GPUs, host RAM and disk,
and what it costs in GPU-hours, before anything is spent::

    python -m unifiedplayers.capacity experiment=paper_qwen3_4b [overrides] [--gpus 8 --gpu-memory-gb 80 ...]

The plan reads the model's configuration, never its weights (``model.path`` may be a hub id out of reach): a local
``model.path`` with a config.json; a tiny_random model's own sizes; else ``conf/model/arch/<name>.json``.

- **GPU memory per GPU**, item by item, at each instant of an update (a player's weights gathered, the no-grad
  passes, forward, backward, optimizer step, the entropy bank, generation); the peak is the largest instant.
- **Host RAM per node**, at start-up (the backbone read on the host) and during an update.
- **Disk**: one checkpoint, the run's peak and what a finished run keeps, replayed from the save cadence
  (:func:`unifiedplayers.schedule.save_due`), and the idle players' state parked in ``trainer.offload_dir``.
- **Compute**: tokens, sandbox calls and FLOPs per update (:mod:`unifiedplayers.trainer.flops` conventions), and
  GPU-hours per seed at a stated utilisation.

Every figure is an estimate from shapes and settings; :attr:`Plan.assumptions` says which. :func:`check_fits`
refuses at start-up a run whose plan exceeds the machine it is on (``capacity.check=false`` turns it off).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from unifiedplayers.config import CONF_DIR, resolve_player_config, role_trainer_config
from unifiedplayers.schedule import BLOCK_ORDER, phase_calls, phase_steps, plan_updates, save_due, trained_roles

GiB, GB, TB = float(2**30), 1e9, 1e12
# The backbones' config.json figures, kept in the repository (the hub may be out of reach). MiMo-7B-Base's were
# found with the search tool (jd-opensource/xllm's MiMo registration, fitmyllm.com; its "_source" field says so).
ARCH_DIR = CONF_DIR / "model" / "arch"

# Assumptions of the estimates (Plan.assumptions prints them).
CHARS_PER_TOKEN = 3.0  # prompt and tool-output text: ~4 characters a token in English prose, ~3 in code and LaTeX
TOKENS_PER_MESSAGE = 5  # chat-template markers of one message
TOPIC_CHARS = 30  # a Planning prompt's {topic}
OBSERVATION_FENCE_CHARS = 40  # the ```output fence and the truncation marker around a tool output
GPU_RANK_OVERHEAD = 6 * GiB  # host RAM of one GPU rank: Python, torch and CUDA's host side, vLLM's, tokenizer, sandbox
CPU_RANK_OVERHEAD = 1 * GiB  # host RAM of one CPU process beyond its tensors (benchmarks/README.md: ~0.4 GiB + sandbox)
CUDA_RESERVE = 1.5 * GiB  # per GPU: CUDA context, NCCL buffers, the caching allocator's slack
VLLM_OVERHEAD = 2 * GiB  # inside vLLM's budget: activations, CUDA graphs, sampler
VLLM_CPU_KV = 4 * GiB  # vLLM's CPU build: VLLM_CPU_KVCACHE_SPACE's default
# DeepSpeed's defaults (trainer.ds_config.zero_optimization overrides them): elements.
DS_DEFAULTS = {"reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7}
DISK_WRITE_BYTES_PER_S = 1e9  # checkpoint writes to the run's disk (an assumption: a local NVMe or a fast share)
GPU_LINK_BYTES_PER_S = 150e9  # per GPU, ZeRO-3's all-gather of the weights (an assumption: NVLink within a node)
ZERO3_NORM_CHUNK = 250_000_000  # DeepSpeed ZeRO-3's buffered gradient norm: elements per float64 chunk
OPTIMIZER_STATE_BYTES = 18  # per parameter, ZeRO: fp32 master 4, Adam 8, fp32 gradients 4, bf16 gradient buffer 2
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeed's CPU Adam over a node's ranks (ZeRO-Offload), parameters a second
PCIE_BYTES_PER_S = 20e9  # per GPU, gradients to the host and weights back (ZeRO-Offload)
ENTROPY_BATCH, ENTROPY_ROWS = 16, 512  # mean_token_entropy: contexts per forward, rows per logits block
PAPER_GPU_HOURS = 432  # Appendix H.2 (its Table 3 paragraph) and Table 16's M = 4 row: full UnifiedPlayers on
# Qwen3-4B-Base, 8 x A100 80GB, local GPU-hours per seed (Table 14's body is missing from our copy of the paper)


class UnknownArchitecture(ValueError):
    """The plan cannot tell the backbone's shapes."""


class CapacityError(ValueError):
    """A run whose plan exceeds the machine it is on."""


# --------------------------------------------------------------------------- the backbone
@dataclass(frozen=True)
class Arch:
    """The shapes of a decoder-only backbone (the fields of a transformers config.json)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False  # Qwen2-style q, k, v biases (MiMo)
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's queries and keys
    num_nextn_predict_layers: int = 0  # MiMo's multi-token-prediction layers: held and optimised, never run
    source: str = ""

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: attention (biases, q/k norms), the SwiGLU MLP and its two RMSNorms."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        attention = 2 * h * q + 2 * h * kv + (q + 2 * kv if self.attention_bias else 0)
        return attention + (2 * self.head_dim if self.qk_norm else 0) + 3 * h * self.intermediate_size + 2 * h

    @property
    def linear_parameters(self) -> int:
        """P_lin of :mod:`unifiedplayers.trainer.flops`: the decoder's linear weights, LM head excluded."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        return self.num_hidden_layers * (2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size)

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def mtp_parameters(self) -> int:
        """MiMo's MTP layers: a decoder layer, the input projection (2h → h) and three more RMSNorms each."""
        h = self.hidden_size
        return self.num_nextn_predict_layers * (self.layer_parameters + 2 * h * h + 3 * h)

    @property
    def parameters(self) -> int:
        """N: the parameters the trainer holds (tied embeddings once, MTP layers included), the final norm too."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return (self.embedding_parameters + head + self.num_hidden_layers * self.layer_parameters
                + self.hidden_size + self.mtp_parameters)

    @property
    def sampled_parameters(self) -> int:
        """What vLLM loads: N without the MTP layers."""
        return self.parameters - self.mtp_parameters

    def kv_bytes_per_token(self, width: int) -> int:
        """K and V of one position in every layer."""
        return 2 * self.num_hidden_layers * self.kv_width * width

    def layer_activations(self) -> int:
        """Values per token one decoder layer keeps for its backward: its input and two norm inputs (3h), q, k, v
        and the attention output (2q + 2kv), the MLP's gate and up projections (2I: ``SwiGLUMLP`` keeps no more)."""
        return 3 * self.hidden_size + 2 * self.q_width + 2 * self.kv_width + 2 * self.intermediate_size

    def forward_flops(self, length: int, scored: int) -> float:
        """FLOPs of one row's forward (``trainer/flops.py``): ``length`` positions, the LM head on ``scored`` rows."""
        from unifiedplayers.trainer.flops import causal_pairs, head_forward_flops

        attention = 4 * self.q_width * self.num_hidden_layers * causal_pairs(length)
        return 2 * self.linear_parameters * length + attention + head_forward_flops(self.vocab_size, self.hidden_size,
                                                                                    scored)

    def extend_flops(self, start: int, new: int, scored: int) -> float:
        """FLOPs of ``new`` positions after a cached context of ``start`` (decoding, a turn's tool output)."""
        from unifiedplayers.trainer.flops import causal_pairs, head_forward_flops

        attention = 4 * self.q_width * self.num_hidden_layers * causal_pairs(start + new, start)
        return 2 * self.linear_parameters * new + attention + head_forward_flops(self.vocab_size, self.hidden_size,
                                                                                 scored)


def arch_from_config(config: Mapping[str, Any], source: str) -> Arch:
    """An :class:`Arch` from a config.json's fields. transformers' defaults where a field is absent: head_dim =
    hidden / heads, tied embeddings; QKV biases in Qwen2-type models (qwen2, mimo), q/k norms in Qwen3."""
    kind = str(config.get("model_type", ""))
    heads = int(config["num_attention_heads"])
    return Arch(
        hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        vocab_size=int(config["vocab_size"]), tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        max_position_embeddings=int(config.get("max_position_embeddings") or 0),
        attention_bias=bool(config.get("attention_bias", kind in ("qwen2", "mimo"))), qk_norm=kind.startswith("qwen3"),
        num_nextn_predict_layers=int(config.get("num_nextn_predict_layers") or 0), source=source)


def arch_file(name: str) -> Path:
    """``conf/model/arch/<name>.json``, the name as its conf/model file spells it (Qwen3-4B-Base: qwen3_4b_base)."""
    return ARCH_DIR / (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + ".json")


def model_arch(model: Any) -> Arch:
    """The backbone's shapes from its configuration only: a local ``model.path``'s config.json wins; a tiny_random
    model's own sizes (the byte tokenizer's 259 ids, untied, as ``models.build_tiny_random``); else the JSON file of
    :func:`arch_file`."""
    if model.source == "tiny_random":
        from unifiedplayers.models import BYTE_SPECIAL_TOKENS

        keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings")
        if any(model.get(k) is None for k in keys):
            raise UnknownArchitecture("capacity: model.source=tiny_random without all of model."
                                      + ", model.".join(keys))
        h, i, layers, heads, kv, positions = (int(model.get(k)) for k in keys)
        return Arch(h, i, layers, heads, kv, h // heads, 256 + len(BYTE_SPECIAL_TOKENS), False, positions,
                    source="model.* sizes (tiny_random)")
    local = Path(os.path.expanduser(model.path)) / "config.json" if model.path else None
    if local is not None and local.is_file():
        return arch_from_config(json.loads(local.read_text()), str(local))
    path = arch_file(str(model.name))
    if not path.is_file():
        raise UnknownArchitecture(
            f"capacity: no architecture for model {model.name!r}: set model.path to a local directory holding its "
            f"config.json, or add {path.relative_to(CONF_DIR.parent)} with the fields of its config.json")
    return arch_from_config(json.loads(path.read_text()), str(path.relative_to(CONF_DIR.parent)))


# --------------------------------------------------------------------------- the machine and the plan
@dataclass(frozen=True)
class Machine:
    """What a plan is checked against and timed on; the defaults are the paper's node, 8 × A100 80GB (Appendix H.2).
    Memory in bytes (an "80GB" A100 has 80 GiB), disk in bytes (disks are sold in decimal TB)."""

    gpus: int = 8  # ranks of a GPU run (torchrun --nproc_per_node), one GPU each
    gpu_memory: float = 80 * GiB  # per GPU; 0: no GPU (a GPU plan is then not checked)
    host_ram: float = 512 * GiB  # per node
    disk: float = 2 * TB  # free where the run directory lies
    offload_disk: Optional[float] = None  # free in trainer.offload_dir when another file system; None: the same
    cpu_ranks: int = 1  # processes of a CPU run
    gpu_flops: float = 312e12  # dense bf16 matmul peak per GPU (A100)
    gpu_bandwidth: float = 2.039e12  # HBM bytes a second per GPU (A100 80GB SXM)
    utilisation: float = 0.35  # MFU of the compute-bound passes (training, prefill, no-grad passes)
    decode_efficiency: float = 0.6  # share of gpu_bandwidth that decoding reaches (it reads weights and KV each step)
    bf16: Optional[bool] = None  # whether dtype auto resolves to bfloat16 here; None: on a GPU yes, on a CPU no
    name: str = "8 x A100 80GB, 512 GiB RAM, 2 TB disk (the paper's node)"


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


@dataclass(frozen=True)
class RoleLoad:
    """One player's GRPO mini-batch (one optimizer step), every row at its token budget."""

    role: str
    rows: int  # sequences trained in one optimizer step
    prompt: int  # prompt tokens of a row
    response: int  # generated tokens of a row (in the loss)
    observations: int  # tool-output tokens inside a row (run through the model, not in the loss)

    @property
    def length(self) -> int:
        return self.prompt + self.response + self.observations


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


@dataclass(frozen=True)
class Plan:
    """What a run needs of a machine (:func:`plan`)."""

    experiment: str
    model: str
    arch: Arch
    machine: Machine
    on_gpu: bool
    world: int  # ranks
    loads: dict[str, RoleLoad]
    gpu: tuple[Instant, ...]  # per GPU; () on a CPU run
    host: tuple[Instant, ...]  # per node
    checkpoint: tuple[Item, ...]  # one checkpoint of a trained player
    disk: tuple[Item, ...]  # at the run directory: the run's peak first
    parked: Optional[Item]  # the idle players' state in trainer.offload_dir
    # per GPU: (vLLM's KV budget, one max_model_len sequence's KV, the largest generation call's KV on one rank)
    vllm_kv: Optional[tuple[float, float, float]]
    roles: dict[str, RoleCompute]
    updates: dict[str, int]
    pool_seconds: float  # the Appendix D.2 diagnostic pool, wall
    assumptions: tuple[str, ...]
    omitted: tuple[tuple[str, float], ...] = ()  # (what, estimated wall seconds) left out of wall_seconds

    @property
    def gpu_peak(self) -> Optional[Instant]:
        return max(self.gpu, key=lambda i: i.total) if self.gpu else None

    @property
    def host_peak(self) -> Instant:
        return max(self.host, key=lambda i: i.total)

    @property
    def run_disk(self) -> float:
        return self.disk[0].bytes

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


# --------------------------------------------------------------------------- settings the plan reads
@dataclass(frozen=True)
class Setup:
    """The settings every estimate reads, resolved once."""

    cfg: Any
    arch: Arch
    machine: Machine
    on_gpu: bool
    world: int
    sample_width: int  # bytes per value of model.dtype (the weights players sample with)
    compute_width: int  # bytes per value of trainer.dtype
    backend: str
    trained: tuple[str, ...]
    trained_models: int  # a shared model (Absolute Zero) joins two trained roles
    models: int
    kl: bool  # some trained player has β_p ≠ 0: a π_ref
    n: int  # parameters

    @property
    def shard(self) -> int:
        """Over how many ranks a trained player's weights are split (ZeRO-3)."""
        return self.world if self.backend == "deepspeed_zero3" else 1

    @property
    def deepspeed(self) -> bool:
        return self.backend.startswith("deepspeed")


WIDTH_NAMES = {2: "16-bit", 4: "fp32"}


def count(x: float) -> str:
    """4.02B, 135M, 362k."""
    for unit, name in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= unit:
            return f"{x / unit:.3g}{name}"
    return f"{x:.0f}"


def dtype_width(setting: str, on_gpu: bool, bf16: Optional[bool] = None) -> int:
    """Bytes per value of a dtype setting. auto: as ``bf16`` says (the machine a run starts on: ``precision``'s
    choice), else bfloat16 on a GPU (the presets' A100/H100) and float32 on a CPU (the larger: a CPU with AMX or
    AVX512-BF16 resolves it to bfloat16 and needs less)."""
    setting = str(setting)
    if setting == "auto":
        return 2 if (on_gpu if bf16 is None else bf16) else 4
    return 4 if setting == "float32" else 2


def setup_of(cfg: Any, machine: Machine) -> Setup:
    device = str(cfg.model.device)
    on_gpu = device.startswith("cuda") or (device == "auto" and machine.gpu_memory > 0)
    world = machine.gpus if on_gpu else machine.cpu_ranks
    if world < 1:
        raise ValueError(f"capacity: {world} ranks; a GPU run needs --gpus >= 1")
    arch = model_arch(cfg.model)
    trained = tuple(trained_roles(cfg))
    joined = bool(cfg.method.shared_model) and {"planning", "execution"} <= set(trained)
    models = len(BLOCK_ORDER) - (1 if cfg.method.shared_model else 0)
    return Setup(cfg, arch, machine, on_gpu, world, dtype_width(cfg.model.dtype, on_gpu, machine.bf16),
                 dtype_width(cfg.trainer.dtype, on_gpu, machine.bf16),
                 str(cfg.trainer.backend), trained, len(trained) - (1 if joined else 0), models,
                 any(role_trainer_config(cfg.trainer, r).kl_coef != 0 for r in trained), arch.parameters)


def prompt_tokens(prompts: Any, filled_chars: int) -> int:
    """A prompt's tokens: its system text, few-shot pairs, template (``filled_chars`` for its placeholders) and
    response prefix, at CHARS_PER_TOKEN, plus TOKENS_PER_MESSAGE chat markers a message."""
    chars = len(prompts.system) + len(prompts.template) + len(prompts.response_prefix) + filled_chars
    chars += sum(len(str(s.get("user", ""))) + len(str(s.get("assistant", ""))) for s in prompts.few_shot)
    messages = (1 if prompts.system else 0) + 2 * len(prompts.few_shot) + 1
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * messages


def role_loads(cfg: Any) -> dict[str, RoleLoad]:
    """Each player's mini-batch at its budgets, from the calls one update's phase makes
    (``schedule.phase_calls``): Planning G_T tasks of each questioner prompt, Execution K trajectories of
    max_turns generations with a tool output between two, Evaluation M verifiers per task. A task's question is
    task_max_chars long."""
    from unifiedplayers.feedback.trajectory import TRAJECTORY_SCHEMA

    p = resolve_player_config(cfg)
    tasks, trajectories, *verifiers = phase_calls_of(cfg, p, "execution", 1)
    observation = observation_tokens(p)
    return {
        "planning": RoleLoad("planning", tasks.prompts * tasks.samples, prompt_tokens(p.planning, TOPIC_CHARS),
                             tasks.max_new_tokens, 0),
        "execution": RoleLoad("execution", trajectories.prompts * trajectories.samples,
                              prompt_tokens(p.execution, p.task_max_chars),
                              trajectories.turns * trajectories.max_new_tokens, (trajectories.turns - 1) * observation),
        "evaluation": RoleLoad("evaluation", sum(v.prompts * v.samples for v in verifiers),
                               prompt_tokens(p.evaluation, p.task_max_chars + len(TRAJECTORY_SCHEMA)),
                               int(p.evaluation_max_new_tokens), 0),
    }


def phase_calls_of(cfg: Any, player: Any, role: str, minibatches: int) -> list[Any]:
    """``schedule.phase_calls`` with the method's tools and verifiers as its config sets them."""
    return phase_calls(player, role, minibatches, bool(cfg.method.use_tools), bool(cfg.method.verifiers))


def observation_tokens(player: Any) -> int:
    """One tool output in a trajectory: observation_max_chars and its fence, at CHARS_PER_TOKEN."""
    return math.ceil((player.observation_max_chars + OBSERVATION_FENCE_CHARS) / CHARS_PER_TOKEN)


def micro_rows(cfg: Any, load: RoleLoad) -> int:
    """Rows of one micro-batch (``trainer.batching.micro_batch_members``) with every row at its budget: under
    trainer.max_tokens_per_micro_batch as many rows of ``load.length`` as the budget holds (at least one)."""
    t = cfg.trainer
    budget = t.get("max_tokens_per_micro_batch")
    if budget is not None:
        size = int(budget) // load.length
    else:
        size = math.ceil(load.rows / t.grad_accum_steps) if t.grad_accum_steps > 0 else int(t.micro_batch_size)
    return max(1, min(size, load.rows))


def busiest_rank_rows(cfg: Any, load: RoleLoad, world: int) -> int:
    """Rows the busiest rank runs in one update, padding copies included (lockstep: the ranks wait for it): whole
    micro-batches round-robin, or under a token budget the rows spread over the ranks, then filled."""
    if cfg.trainer.get("max_tokens_per_micro_batch") is not None:
        return math.ceil(load.rows / world)
    micro = micro_rows(cfg, load)
    return math.ceil(math.ceil(load.rows / micro) / world) * micro


def ds_setting(cfg: Any, key: str) -> float:
    zero = (cfg.trainer.get("ds_config") or {}).get("zero_optimization") or {}
    return float(zero.get(key, DS_DEFAULTS[key]))


# --------------------------------------------------------------------------- GPU (or CPU process) memory
def resident_items(s: Setup) -> list[Item]:
    """What one rank's device holds through a whole update."""
    n, cfg = s.n, s.cfg
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
    if cfg.rollout.backend == "vllm":
        items += vllm_items(s)
    if s.on_gpu:
        items.append(Item("CUDA context, NCCL, allocator slack", CUDA_RESERVE, "(fixed)"))
    return items


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
    """vLLM's engine: it takes gpu_memory_utilization of the GPU whatever else runs, for its weights, activations and
    KV cache, and it does not sleep while the trainer runs (rollout/vllm_engine.py builds it without sleep mode)."""
    weights = s.sample_width * s.arch.sampled_parameters
    if not s.on_gpu:
        return [Item("vLLM (CPU): its weights", weights, "rollout.backend"),
                Item("vLLM (CPU): KV cache", VLLM_CPU_KV, "VLLM_CPU_KVCACHE_SPACE")]
    budget = float(s.cfg.rollout.gpu_memory_utilization) * s.machine.gpu_memory
    return [Item("vLLM: its copy of the sampling weights", weights, "rollout.gpu_memory_utilization"),
            Item("vLLM: KV cache, activations, CUDA graphs", max(0.0, budget - weights),
                 "rollout.gpu_memory_utilization")]


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
        # accumulated in float32 over chunks, else in the compute dtype
        head_grad = a.embedding_parameters * (4 if chunk > 0 else b)
        items.append(Item("LM-head gradient block and weight gradient", block * a.vocab_size * b + head_grad,
                          "trainer.logprob_chunk_rows"))
        if s.deepspeed:
            items.append(Item("DeepSpeed gradient reduce bucket", ds_setting(cfg, "reduce_bucket_size") * b,
                              "trainer.ds_config.zero_optimization.reduce_bucket_size"))
        if s.deepspeed and cfg.trainer.offload_optimizer:
            items += offload_gradient_items(s)
    return items


def offload_gradient_items(s: Setup) -> list[Item]:
    """ZeRO-Offload at the end of the backward, on the largest parameter's shard (the embedding), measured on an
    H200 (docs/gpu/): ZeRO-3 copies the host gradient partition back onto the GPU (``stage3.partition_grads``)
    and takes its norm in float64 in chunks of 250M elements (``_constant_buffered_norm2``); ZeRO-2 takes the
    norm of a parameter's partition in float64 whole."""
    shard = s.arch.embedding_parameters / s.world
    if s.backend != "deepspeed_zero3":
        return [Item("gradient norm in float64 (ZeRO-Offload, the largest parameter's partition)", 8 * shard,
                     "trainer.offload_optimizer")]
    return [Item("gradient partition back on the GPU (ZeRO-Offload, the largest parameter's)",
                 s.compute_width * shard, "trainer.offload_optimizer"),
            Item("gradient norm's float64 chunk (ZeRO-Offload, 250M elements at most)",
                 8 * min(shard, ZERO3_NORM_CHUNK), "trainer.offload_optimizer")]


def rollout_items(s: Setup, loads: Mapping[str, RoleLoad]) -> list[Item]:
    """hf generation: the KV cache and the last position's logits of one batch (rollout.batch_size sequences, 0: all
    of a generation call's on the rank) at its full context, for the largest call of a phase; vLLM's engine is
    resident instead (:func:`vllm_items`)."""
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
    base = tuple(resident_items(s))
    b, n = s.compute_width, s.n
    out = []
    if s.trained and s.backend == "deepspeed_zero3":
        out.append(Instant("gather", base + (Item("a player's weights gathered whole", b * n, "trainer.backend"),)))
    kinds = ["forward", "backward"]
    if s.kl or s.cfg.trainer.recompute_old_logprobs:
        kinds.insert(0, "no-grad")
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
    out.append(Instant("generation", base + tuple(rollout_items(s, loads))))
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
    """A node's host RAM at start-up and at each instant of an update. A GPU run: the ranks' processes, the active
    player's ZeRO-Offload state (18N summed over the ranks), π_ref on the ranks that hold it and, while it is
    swapped in, a copy of the current weights there. A CPU run: each process's device instants too."""
    cfg, n, b = s.cfg, s.n, s.compute_width
    what = "Python, torch, CUDA and vLLM host side, sandbox" if s.on_gpu else "Python, torch, tokenizer, sandbox"
    procs = Item(f"{s.world} process{'es' if s.world > 1 else ''}: {what}",
                 s.world * (GPU_RANK_OVERHEAD if s.on_gpu else CPU_RANK_OVERHEAD), "torchrun --nproc_per_node")
    host = [procs]
    if s.trained and s.deepspeed and cfg.trainer.offload_optimizer:
        host.append(Item(f"active player's ZeRO-Offload state ({OPTIMIZER_STATE_BYTES}N over the ranks)",
                         OPTIMIZER_STATE_BYTES * n, "trainer.offload_optimizer=false keeps it on the GPUs"))
    if s.kl and cfg.trainer.ref_mode == "precompute":
        holders = 1 if s.backend == "deepspeed_zero3" else s.world
        host.append(Item(f"pi_ref on {holders} rank(s) (ref_mode precompute)", holders * b * n, "trainer.ref_mode"))
        host.append(Item("current weights while pi_ref is swapped in", holders * b * n, "trainer.ref_mode"))
    if s.on_gpu:
        start = Instant("start-up", (procs, Item("the backbone read on the host by each rank", s.world * s.sample_width
                                                 * n, "model.dtype; torchrun --nproc_per_node")))
        return (start, Instant("update", tuple(host)))
    return tuple(Instant(i.name, tuple(host) + tuple(replace(x, bytes=x.bytes * s.world) for x in i.items))
                 for i in device)


# --------------------------------------------------------------------------- disk
def checkpoint_items(s: Setup) -> tuple[Item, ...]:
    """One trained player's checkpoint (``PlayerTrainer.save_checkpoint``): model.pt (DeepSpeed: the module's
    weights in trainer.dtype; torch: the float32 masters), the optimizer state (DeepSpeed: fp32 master and Adam
    partitions, 12N; torch: AdamW, 8N) and π_ref."""
    n = s.n
    items = [Item("model.pt: the weights", (s.compute_width if s.deepspeed else 4) * n, "trainer.dtype")]
    if s.deepspeed:
        items.append(Item("deepspeed/: fp32 master + Adam partitions", 12 * n, "schedule.checkpoint_retention"))
    else:
        items.append(Item("optimizer.pt: AdamW state", 8 * n, "schedule.checkpoint_retention"))
    if s.kl:
        items.append(Item("reference.pt: pi_ref", s.compute_width * n, "schedule.checkpoint_retention"))
    return tuple(items)


def checkpoint_disk(cfg: Any, full: float, weights: float) -> tuple[float, float, float, int]:
    """(the peak bytes of checkpoints/ during the run, at its end, what the finished run keeps, saves), replayed over
    the run's updates with :func:`unifiedplayers.schedule.save_due`. An in-block save writes the resume copy the
    run state does not name (up to three at once: the named copy, the one being replaced, the new one), a block end
    a named checkpoint; the role's resume copies then go, and every named checkpoint the state no longer names is
    thinned as ``schedule.checkpoint_retention`` says (a running run keeps what a finished one would)."""
    s, per_phase = cfg.schedule, phase_steps(cfg)
    kept = {"all": lambda role: full, "weights": lambda role: weights,
            "execution_weights": lambda role: weights if role == "execution" else 0.0}[s.checkpoint_retention]
    named: list[list[Any]] = []  # [role, bytes] of checkpoints/iter<t>/<role>
    resume: dict[str, float] = {}  # checkpoints/resume/<role>-a|b
    pointer: dict[str, str] = {}
    peak, saves = 0.0, 0
    for slot in plan_updates(cfg):
        if not save_due(slot, s.save_every, per_phase, None):
            continue
        saves += 1
        peak = max(peak, sum(b for _, b in named) + sum(resume.values()) + full)
        if slot.last_of_block and s.checkpoint_every_block:
            named.append([slot.role, full])
            resume = {k: b for k, b in resume.items() if not k.startswith(slot.role + "-")}
            pointer[slot.role] = "named"
            latest = {role: i for i, (role, _) in enumerate(named)}
            named = [[r, b if latest[r] == i else min(b, kept(r))] for i, (r, b) in enumerate(named)]
            continue
        name = f"{slot.role}-{'b' if pointer.get(slot.role, '').endswith('-a') else 'a'}"
        resume[name], pointer[slot.role] = full, name
        if slot.last_of_block:  # thin_at_block_end: the role's copy the state does not name goes
            resume = {k: b for k, b in resume.items() if not k.startswith(slot.role + "-") or k == name}
    end = sum(b for _, b in named) + sum(resume.values())
    finished = sum(kept(r) for r, _ in named) + sum(kept(k.split("-")[0]) for k in resume)
    return peak, end, finished, saves


def disk_items(s: Setup, checkpoint: Sequence[Item]) -> tuple[Item, ...]:
    """The run directory: the checkpoints' peak (plus stale feedback's published copies, and the Hugging Face export of
    each trained player at the end, schedule.export_at_end), what a finished run keeps, what the saves write in all."""
    if not s.trained:
        return (Item("checkpoints (no trained player)", 0.0, "method"),)
    full = sum(i.bytes for i in checkpoint)
    peak, end, finished, saves = checkpoint_disk(s.cfg, full, checkpoint[0].bytes)
    published = s.trained_models * s.sample_width * s.n if s.cfg.schedule.feedback == "stale" else 0.0
    export = s.trained_models * s.sample_width * s.n if s.cfg.schedule.get("export_at_end", False) else 0.0
    return (Item("run directory at its peak (checkpoints, published copies, export)",
                 max(peak + published, end + export),
                 "schedule.save_every; schedule.checkpoint_retention; schedule.checkpoint_every_block"),
            Item("a finished run keeps", finished + export, "schedule.checkpoint_retention"),
            Item(f"written by {saves} saves in all", saves * full, "schedule.save_every"))


def parked_item(s: Setup) -> Optional[Item]:
    """The idle trained players' state in files without a name (``trainer/offload.py``): optimizer state (and the
    torch backend's float32 masters when it samples from a copy), π_ref. At start-up every trained player's optimizer
    state waits there; later the idle ones' with their π_ref."""
    if not s.trained:
        return None
    n = s.n
    opt = OPTIMIZER_STATE_BYTES * n if s.deepspeed else 8 * n + (4 * n if s.sample_width != 4 else 0)
    holders = 1 if (s.backend == "deepspeed_zero3" and s.cfg.trainer.ref_mode == "precompute") else s.world
    ref = holders * s.compute_width * n if s.kl else 0.0
    worst = max(s.trained_models * opt, (s.trained_models - 1) * (opt + ref))
    where = s.cfg.trainer.offload_dir or tempfile.gettempdir()
    return Item(f"idle players' parked state (trainer.offload_dir: {where})", worst,
                "trainer.offload_dir (a local disk, not tmpfs)")


# --------------------------------------------------------------------------- compute
@dataclass(frozen=True)
class Stage:
    """One generation call of a phase: ``samples`` of each of ``prompts`` prompts, ``steps`` tokens decoded each
    over ``turns`` turns with ``observations`` tool-output tokens in between."""

    name: str
    prompts: int
    samples: int
    prompt: int
    steps: int
    observations: int = 0
    turns: int = 1


def phase_stages(cfg: Any, role: str, loads: Mapping[str, RoleLoad]) -> list[Stage]:
    """What a phase of ``role`` samples: ``schedule.phase_calls`` (the calls ``PhaseSampler`` makes) with the
    prompt and tool-output lengths of ``loads``; a phase's tasks all well-formed (one round of Planning prompts)."""
    p, s = resolve_player_config(cfg), int(cfg.schedule.steps_per_generation)
    prompts = {"tasks": loads["planning"].prompt, "trajectories": loads["execution"].prompt,
               "verifiers": loads["evaluation"].prompt}
    observations = {"trajectories": loads["execution"].observations}
    return [Stage(c.name, c.prompts, c.samples, prompts[c.name], c.turns * c.max_new_tokens,
                  observations.get(c.name, 0), c.turns) for c in phase_calls_of(cfg, p, role, s)]


def stage_flops(a: Arch, st: Stage) -> float:
    """Prefill of each prompt once (vLLM's prefix cache), then each sample's tokens and tool outputs."""
    sample = a.extend_flops(st.prompt, st.steps + st.observations, st.steps)
    return st.prompts * (a.forward_flops(st.prompt, 0) + st.samples * sample)


def stage_seconds(s: Setup, st: Stage) -> float:
    """Wall seconds of a stage on the busiest rank (a call is split over the ranks by prompt). Decoding: each step
    reads the weights and every row's KV cache (bandwidth-bound at machine.decode_efficiency) or does 2·P per row
    (compute-bound at machine.utilisation), whichever is slower; every row runs to its budget (a batch lasts as long
    as its longest sample). Prefill (prompts, tool outputs): compute-bound."""
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
    passes = (1 if t.kl_coef != 0 else 0) + (1 / mu if cfg.trainer.recompute_old_logprobs else 0)
    bank = entropy_flops(s, load) * bank_scorings_per_update(cfg, role)
    seconds: dict[str, float] = {}
    if s.on_gpu:
        seconds["generation"] = sum(stage_seconds(s, st) for st in stages) / per_phase
        per_rank = busiest_rank_rows(cfg, load, s.world)
        redo = 1 if cfg.trainer.gradient_checkpointing else 0  # checkpointing runs each forward twice
        seconds["training"] = per_rank * row * (3 + redo + passes) / (m.gpu_flops * m.utilisation)
        seconds["optimizer step"] = optimizer_seconds(s)
        seconds["entropy bank"] = bank / s.world / (m.gpu_flops * m.utilisation)  # the bank split over the ranks
    return RoleCompute(
        generated=sum(st.prompts * st.samples * st.steps for st in stages) / per_phase,
        trained=load.rows * load.response, sandbox_calls=calls / per_phase,
        generation_flops=sum(stage_flops(a, st) for st in stages) / per_phase,
        training_flops=3 * load.rows * row, no_grad_flops=passes * load.rows * row + bank, seconds=seconds)


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


def entropy_flops(s: Setup, load: RoleLoad) -> float:
    """``mean_token_entropy`` over the bank (Appendix D.2): entropy_bank_size contexts of the role's prompt, the
    LM head on every position."""
    return int(s.cfg.trainer.entropy_bank_size) * s.arch.forward_flops(load.prompt, load.prompt)


def optimizer_seconds(s: Setup) -> float:
    """ZeRO-Offload: DeepSpeed's CPU Adam over N parameters, and the gradients and weights over PCIe; on the GPU the
    step reads and writes the 18N state at HBM bandwidth."""
    n = s.n
    if s.deepspeed and s.cfg.trainer.offload_optimizer:
        return n / CPU_ADAM_PARAMS_PER_S + 2 * s.compute_width * n / s.world / PCIE_BYTES_PER_S
    return 2 * OPTIMIZER_STATE_BYTES * n / ((s.world if s.deepspeed else 1) * s.machine.gpu_bandwidth)


def pool_seconds(s: Setup, loads: Mapping[str, RoleLoad]) -> float:
    """The Appendix D.2 pool (schedule.execution_pool), answered greedily at the start and every ``every``
    Execution updates, its questions split over the ranks (``execution_pool.evaluate_pool``): the busiest rank's
    share."""
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


# --------------------------------------------------------------------------- the plan
def plan(cfg: Any, machine: Machine = Machine()) -> Plan:
    """The capacity and compute plan of ``cfg`` on ``machine``."""
    s = setup_of(cfg, machine)
    loads = role_loads(cfg)
    device = device_instants(s, loads)
    checkpoint = checkpoint_items(s) if s.trained else ()
    updates = {r: sum(1 for slot in plan_updates(cfg) if slot.role == r) for r in s.trained}
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
        omitted=omitted_seconds(s, loads, disk_items(s, checkpoint), updates))


def omitted_seconds(s: Setup, loads: Mapping[str, RoleLoad], disk: Sequence[Item],
                    updates: Mapping[str, int]) -> tuple[tuple[str, float], ...]:
    """Wall time the plan does not count, estimated: checkpoint writes (at DISK_WRITE_BYTES_PER_S), the weights
    copied into vLLM after each optimizer step (ZeRO-3 gathers them over the GPU links, then vLLM reloads them at
    HBM bandwidth), and, for scale, the prefill vLLM's prefix cache saves (K - 1 of a prompt's K prefills, which
    the generation stage already leaves out)."""
    if not s.on_gpu:
        return ()
    out = []
    written = sum(i.bytes for i in disk if i.name.startswith("written by"))
    out.append((f"checkpoint writes ({written / TB:.2f} TB at an assumed {DISK_WRITE_BYTES_PER_S / 1e9:g} GB/s)",
                written / DISK_WRITE_BYTES_PER_S))
    if s.cfg.rollout.backend == "vllm":
        weights = s.sample_width * s.arch.sampled_parameters
        copy = weights * (s.world - 1) / s.world / GPU_LINK_BYTES_PER_S + weights / s.machine.gpu_bandwidth
        steps = sum(updates.values())
        out.append((f"weight copies into vLLM ({steps:,} steps x {weights / GB:.1f} GB, GPU links at an assumed "
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


def assumptions(s: Setup) -> tuple[str, ...]:
    out = [
        f"sequences at their token budgets (player.*_max_new_tokens x max_turns, tool outputs of "
        f"observation_max_chars); prompts at {CHARS_PER_TOKEN:g} characters a token, questions of task_max_chars",
        "auto dtypes: bfloat16 on a GPU, float32 on a CPU; one node; a phase's tasks all well-formed",
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


# --------------------------------------------------------------------------- the start-up refusal
def check_fits(plan: Plan, machine: Machine) -> None:
    """Refuse (:class:`CapacityError`) a plan that exceeds ``machine``: GPU memory per GPU (skipped when
    machine.gpu_memory is 0: no GPU), vLLM's KV cache, host RAM per node, free disk at the run directory and in
    trainer.offload_dir. The message names each item over its limit and the settings to change."""
    problems = []
    peak = plan.gpu_peak
    if peak is not None and machine.gpu_memory > 0 and peak.total > machine.gpu_memory:
        problems.append(_over(f"GPU memory per GPU ({_at(peak.name)})", peak.total, machine.gpu_memory, peak.items,
                              GiB, "GiB"))
    if plan.vllm_kv is not None and machine.gpu_memory > 0 and plan.vllm_kv[0] < plan.vllm_kv[1]:
        problems.append(f"vLLM KV cache: {plan.vllm_kv[0] / GiB:.1f} GiB left in rollout.gpu_memory_utilization x "
                        f"{machine.gpu_memory / GiB:.0f} GiB after its weights, < {plan.vllm_kv[1] / GiB:.1f} GiB for "
                        "one sequence of its context: raise rollout.gpu_memory_utilization or lower "
                        "rollout.max_model_len")
    host = plan.host_peak
    if host.total > machine.host_ram:
        problems.append(_over(f"host RAM per node ({_at(host.name)})", host.total, machine.host_ram, host.items, GiB,
                              "GiB"))
    parked = plan.parked.bytes if plan.parked else 0.0
    disk = plan.run_disk + (parked if machine.offload_disk is None else 0.0)
    if disk > machine.disk:
        items = plan.disk[:1] + ((plan.parked,) if plan.parked and machine.offload_disk is None else ())
        problems.append(_over("disk at the run directory", disk, machine.disk, items, GB, "GB", "free"))
    if machine.offload_disk is not None and parked > machine.offload_disk:
        problems.append(_over("disk in trainer.offload_dir", parked, machine.offload_disk, (plan.parked,), GB, "GB",
                              "free"))
    if problems:
        raise CapacityError(
            f"capacity: experiment={plan.experiment} does not fit this machine ({machine.name}):\n- "
            + "\n- ".join(problems)
            + f"\nThe plan: python -m unifiedplayers.capacity experiment={plan.experiment} (estimates; "
              "capacity.check=false starts the run anyway)")


def _at(instant: str) -> str:
    return "at start-up" if instant == "start-up" else f"at the {instant}"


def _over(what: str, need: float, have: float, items: Sequence[Item], unit: float, name: str,
          verb: str = "available") -> str:
    top = sorted(items, key=lambda i: -i.bytes)[:3]
    largest = "; ".join(f"{i.name} {i.bytes / unit:.1f} {name} (change: {i.setting})" for i in top)
    return f"{what}: plan {need / unit:.1f} {name} > {have / unit:.1f} {name} {verb}; largest items: {largest}"


def machine_here(cfg: Any, world: int, run_dir: Optional[str] = None) -> Machine:
    """The machine this process runs on: its GPU (``torch.cuda.get_device_properties``; none: no GPU check), the
    host RAM available (/proc/meminfo MemAvailable, plus what this node's ranks already hold), the free disk at the
    run directory (plus the checkpoints a resumed run already has there) and in trainer.offload_dir."""
    import torch

    from unifiedplayers.precision import native_bf16

    gpu, name = 0.0, "no GPU"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, name = float(props.total_memory), props.name
    ram = _meminfo("MemAvailable") + _rss() * int(os.environ.get("LOCAL_WORLD_SIZE", world))
    run = Path(run_dir or os.getcwd()).expanduser().resolve()
    disk = _free(run) + _bytes_under(run / "checkpoints")
    offload = Path(cfg.trainer.offload_dir or tempfile.gettempdir()).expanduser().resolve()
    other = _device(offload) != _device(run)
    return Machine(gpus=world, gpu_memory=gpu, host_ram=ram, disk=disk, offload_disk=_free(offload) if other else None,
                   cpu_ranks=world, bf16=native_bf16(str(cfg.model.device))[0],
                   name=f"{world} rank(s), {name}, {ram / GiB:.0f} GiB RAM available, {disk / GB:.0f} GB free at {run}")


def _meminfo(key: str) -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _rss() -> float:
    try:
        return float(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0.0


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free(path: Path) -> float:
    return float(shutil.disk_usage(_existing(path)).free)


def _device(path: Path) -> int:
    return _existing(path).stat().st_dev


def _bytes_under(path: Path) -> float:
    if not path.is_dir():
        return 0.0
    return float(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))
