"""What a run asks of a machine: the settings every estimate reads (:class:`Setup`), each player's GRPO mini-batch
at its token budgets (:class:`RoleLoad`) and a phase's generation calls (:class:`Stage`, ``schedule.phase_calls``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from unifiedplayers.capacity.arch import Arch, model_arch
from unifiedplayers.capacity.hardware import Hardware
from unifiedplayers.config import resolve_player_config, role_trainer_config
from unifiedplayers.schedule import BLOCK_ORDER, phase_calls, trained_roles

# Assumptions of the estimates (Plan.assumptions prints them).
CHARS_PER_TOKEN = 3.0  # prompt and tool-output text: ~4 characters a token in English prose, ~3 in code and LaTeX
TOKENS_PER_MESSAGE = 5  # chat-template markers of one message
TOPIC_CHARS = 30  # a Planning prompt's {topic}
OBSERVATION_FENCE_CHARS = 40  # the ```output fence and the truncation marker around a tool output
# DeepSpeed's defaults (trainer.ds_config.zero_optimization overrides them): elements.
DS_DEFAULTS = {"reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7}


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
class Setup:
    """The settings every estimate reads, resolved once."""

    cfg: Any
    arch: Arch
    machine: Hardware
    on_gpu: bool
    world: int  # ranks of the run, over all its nodes
    node_ranks: int  # ranks on one node (machine.gpus, or machine.cpu_ranks on a CPU)
    sample_width: int  # bytes per value of model.dtype (the weights players sample with)
    compute_width: int  # bytes per value of trainer.dtype
    backend: str
    trained: tuple[str, ...]
    trained_models: int  # a shared model (Absolute Zero) joins two trained roles
    models: int
    kl: bool  # some trained player has β_p ≠ 0: a π_ref
    n: int  # parameters
    adapter: int = 0  # trainer.lora.rank > 0: one adapter's parameters (the players share one frozen backbone)
    sleep: int = 0  # rollout.sleep_level of a vLLM engine on a GPU: asleep through the trainer's passes

    @property
    def shard(self) -> int:
        """Over how many ranks a trained player's weights are split (ZeRO-3)."""
        return self.world if self.backend == "deepspeed_zero3" else 1

    @property
    def deepspeed(self) -> bool:
        return self.backend.startswith("deepspeed")


def dtype_width(setting: str, on_gpu: bool, bf16: Optional[bool] = None) -> int:
    """Bytes per value of a dtype setting. auto: as ``bf16`` says (``precision``'s choice on the machine a run
    starts on), else bfloat16 on a GPU and float32 on a CPU (the larger of a CPU's two choices)."""
    setting = str(setting)
    if setting == "auto":
        return 2 if (on_gpu if bf16 is None else bf16) else 4
    return 4 if setting == "float32" else 2


def setup_of(cfg: Any, machine: Hardware) -> Setup:
    device = str(cfg.model.device)
    on_gpu = device.startswith("cuda") or (device == "auto" and machine.gpu_memory > 0)
    node_ranks = machine.gpus if on_gpu else machine.cpu_ranks
    if node_ranks < 1 or machine.nodes < 1:
        raise ValueError(f"capacity: {node_ranks} ranks on each of {machine.nodes} node(s); a GPU run needs "
                         "--gpus >= 1 and --nodes >= 1")
    world = node_ranks * machine.nodes
    arch = model_arch(cfg.model)
    trained = tuple(trained_roles(cfg))
    joined = bool(cfg.method.shared_model) and {"planning", "execution"} <= set(trained)
    models = len(BLOCK_ORDER) - (1 if cfg.method.shared_model else 0)
    lora = cfg.trainer.get("lora") or {}
    adapter = arch.adapter_parameters(int(lora.rank), lora.target_modules) if lora.get("rank", 0) > 0 else 0
    sleep = int(cfg.rollout.get("sleep_level", 0)) if on_gpu and cfg.rollout.backend == "vllm" else 0
    return Setup(cfg, arch, machine, on_gpu, world, node_ranks, dtype_width(cfg.model.dtype, on_gpu, machine.bf16),
                 dtype_width(cfg.trainer.dtype, on_gpu, machine.bf16),
                 str(cfg.trainer.backend), trained, len(trained) - (1 if joined else 0), models,
                 any(role_trainer_config(cfg.trainer, r).kl_coef != 0 for r in trained), arch.parameters,
                 adapter, sleep)


def prompt_tokens(prompts: Any, filled_chars: int) -> int:
    """A prompt's tokens: its system text, few-shot pairs, template (``filled_chars`` for its placeholders) and
    response prefix, at CHARS_PER_TOKEN, plus TOKENS_PER_MESSAGE chat markers a message."""
    chars = len(prompts.system) + len(prompts.template) + len(prompts.response_prefix) + filled_chars
    chars += sum(len(str(s.get("user", ""))) + len(str(s.get("assistant", ""))) for s in prompts.few_shot)
    messages = (1 if prompts.system else 0) + 2 * len(prompts.few_shot) + 1
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * messages


def role_loads(cfg: Any) -> dict[str, RoleLoad]:
    """Each player's mini-batch at its budgets, from the calls of one update's phase (``schedule.phase_calls``);
    a task's question is task_max_chars long."""
    from unifiedplayers.feedback.trajectory import TRAJECTORY_SCHEMA

    p = resolve_player_config(cfg)
    calls = {c.name: c for c in phase_calls_of(cfg, p, "execution", 1)}
    tasks, trajectories = calls["tasks"], calls["trajectories"]
    verifiers = [calls["verifiers"]] if "verifiers" in calls else []
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
    """Rows of one micro-batch (``trainer.batching.micro_batch_members``), every row at its budget."""
    t = cfg.trainer
    budget = t.get("max_tokens_per_micro_batch")
    if budget is not None:
        size = int(budget) // load.length
    else:
        size = math.ceil(load.rows / t.grad_accum_steps) if t.grad_accum_steps > 0 else int(t.micro_batch_size)
    return max(1, min(size, load.rows))


def busiest_rank_rows(cfg: Any, load: RoleLoad, world: int) -> int:
    """Rows the busiest rank runs in one update, padding copies included: whole micro-batches round-robin, or under
    a token budget the rows spread over the ranks."""
    if cfg.trainer.get("max_tokens_per_micro_batch") is not None:
        return math.ceil(load.rows / world)
    micro = micro_rows(cfg, load)
    return math.ceil(math.ceil(load.rows / micro) / world) * micro


def ds_setting(cfg: Any, key: str) -> float:
    zero = (cfg.trainer.get("ds_config") or {}).get("zero_optimization") or {}
    return float(zero.get(key, DS_DEFAULTS[key]))


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
    """What a phase of ``role`` samples (``schedule.phase_calls``) at the lengths of ``loads``, its tasks all
    well-formed."""
    p, s = resolve_player_config(cfg), int(cfg.schedule.steps_per_generation)
    prompts = {"tasks": loads["planning"].prompt, "trajectories": loads["execution"].prompt,
               "verifiers": loads["evaluation"].prompt}
    observations = {"trajectories": loads["execution"].observations}
    return [Stage(c.name, c.prompts, c.samples, prompts[c.name], c.turns * c.max_new_tokens,
                  observations.get(c.name, 0), c.turns) for c in phase_calls_of(cfg, p, role, s)]
