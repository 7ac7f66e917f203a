"""Typed configuration schema for every Hydra group in ``conf/``.

Each group (``conf/<group>/*.yaml``) is merged onto the dataclass named here, so an unknown key or a
value of the wrong type fails at start-up with OmegaConf's message naming the key and the file.
The paper's symbol for a field is given beside it where one exists.

Ownership: each dataclass belongs to the module named in its docstring; edit a class in place rather
than redefining it elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from unifiedplayers.sandbox import SandboxConfig


@dataclass
class ModelConfig:
    """How to load one backbone (``unifiedplayers.models``)."""

    name: str = MISSING
    # "gguf_wheel": a GGUF file shipped in an installed Python package (the embedded default).
    # "pretrained": a hub id or local directory for ``from_pretrained``.
    # "tiny_random": a small random Llama built from a config, for tests.
    source: str = "pretrained"
    path: Optional[str] = None  # hub id or local directory (source=pretrained)
    package: Optional[str] = None  # python package holding the GGUF file (source=gguf_wheel)
    gguf_file: Optional[str] = None
    tokenizer: Optional[str] = None  # defaults to ``path``
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    cache_dir: Optional[str] = None  # where dequantized GGUF weights are cached as safetensors
    trust_remote_code: bool = False
    # tiny_random architecture
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    seed: int = 0


@dataclass
class RolloutConfig:
    """Generation backend (``unifiedplayers.rollout``)."""

    backend: str = "hf"  # hf | vllm
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    batch_size: int = 8
    # vllm only
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enforce_eager: bool = False


@dataclass
class TrainerConfig:
    """Optimizer, backend and checkpoints (``unifiedplayers.trainer``); SPEC §6."""

    backend: str = "torch"  # torch | deepspeed_zero2 | deepspeed_zero3
    lr: float = 1.0e-6
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    micro_batch_size: int = 4
    grad_accum_steps: int = 1  # derived from the batch when 0
    clip_eps: float = 0.2  # ε_clip
    kl_coef: float = 0.04  # β_p
    kl_estimator: str = "k3"
    aggregation: str = "seq_group_mean"  # Eq. 21; or token_mean
    ref_mode: str = "copy"  # copy: frozen reference model; precompute: ref log-probs once per batch
    lr_warmup_steps: int = 0
    entropy_bank_size: int = 256
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
    dtype: str = "float32"


@dataclass
class PerturbationConfig:
    """Which rules of SPEC §3 the engine applies (``unifiedplayers.perturbation``)."""

    rules: list[str] = field(
        default_factory=lambda: ["arg_mutation", "step_drop", "step_swap", "early_terminate", "tool_substitute"]
    )
    float_rel_change: float = 0.05
    int_offsets: list[int] = field(default_factory=lambda: [-2, -1, 1, 2])


@dataclass
class RewardConfig:
    """Reward weights and the choices SPEC §5 leaves open (``unifiedplayers.rewards``)."""

    name: str = "default"
    alpha: float = 0.4  # α, weight of ρ_gold (Eq. 5)
    beta: float = 0.5  # β, weight of ρ_adv (Eq. 5)
    gamma: float = 0.1  # γ, weight of ρ_red (Eq. 5)
    w_unc: float = 1.0  # Eq. 2
    w_ver: float = 1.0  # Eq. 2
    w_rep: float = 0.5  # Eq. 2
    use_verifiability: bool = True  # False: the "w/o V(q)" ablation
    # Open choices (SPEC §5):
    execution_reward_no_valid_verifier: float = 0.0  # r_S when M_q = 0
    invalid_verifier_reward: float = -1.0  # r_C of a verifier that does not parse/compile/define check
    malformed_task_reward: float = -1.0  # r_T of a Planning output that is not a well-formed task
    missing_answer_in_majority: bool = False  # False: a missing answer never forms the majority class
    repetition_bleu_threshold: float = 0.5
    repetition_mode: str = "max_bleu"  # max_bleu | cluster_share
    redundancy_similarity: str = "token_jaccard"


@dataclass
class PlayerPrompts:
    system: str = ""
    template: str = MISSING
    few_shot: list[dict[str, str]] = field(default_factory=list)


@dataclass
class PlayerConfig:
    """Prompts and sampling sizes of the three players (``unifiedplayers.players``); SPEC §1."""

    planning: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    execution: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    evaluation: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    topics: list[str] = field(default_factory=list)
    tasks_per_update: int = 4  # G_T: tasks sampled per Planning group
    num_trajectories: int = 8  # K
    num_verifiers: int = 4  # M
    max_turns: int = 4
    observation_max_chars: int = 1024
    planning_max_new_tokens: int = 256
    execution_max_new_tokens: int = 256
    evaluation_max_new_tokens: int = 384


@dataclass
class ScheduleConfig:
    """The outer loop (``unifiedplayers.schedule``); SPEC §7."""

    outer_iterations: int = 3
    planning_updates: int = 200
    execution_updates: int = 300
    evaluation_updates: int = 200
    feedback: str = "fresh"  # fresh | stale
    train_planning: bool = True
    train_evaluation: bool = True
    questions_per_iteration: int = 1000
    diagnostics_every: int = 50
    checkpoint_every_block: bool = True


@dataclass
class LoggerConfig:
    """Metrics sinks (``unifiedplayers.logging``)."""

    backend: str = "wandb"  # wandb | none
    mode: str = "offline"  # offline | online | disabled
    project: str = "unifiedplayers"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    progress: bool = True


@dataclass
class MethodConfig:
    """Which players exist and which reward source feeds each (``unifiedplayers.methods``); SPEC §11."""

    name: str = "unifiedplayers"
    trainable: bool = True
    roles: list[str] = field(default_factory=lambda: ["planning", "execution", "evaluation"])
    execution_reward: str = "verdict"  # verdict | majority_vote | teacher
    planning_reward: str = "unifiedplayers"  # unifiedplayers | agent0 | r_zero | none
    use_tools: bool = True
    tool_bonus: float = 0.0
    teacher_endpoint: Optional[str] = None
    teacher_model: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    """The root of ``conf/config.yaml``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    perturbation: PerturbationConfig = field(default_factory=PerturbationConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    player: PlayerConfig = field(default_factory=PlayerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    experiment: Optional[str] = None  # name of the preset in use
    ablation: Optional[str] = None
    seed: int = 0
    resume: bool = False
    run_dir: Optional[str] = None  # defaults to Hydra's output directory


def register_configs() -> None:
    """Register the schema so that ``conf/config.yaml`` can list ``schema`` first in its defaults."""
    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
