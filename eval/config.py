"""Typed schema of the evaluation entry point: ``conf/evaluate.yaml`` composes training's ``model``, ``rollout``,
``sandbox`` and ``logger`` groups and one ``conf/eval/`` preset. A wrong key fails at start-up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from unifiedplayers.config import LoggerConfig, ModelConfig, PlayerConfig, RolloutConfig
from unifiedplayers.sandbox import SandboxConfig


@dataclass
class BenchmarkEntry:
    """Where one benchmark's file is, and per-benchmark overrides of the registry (``unifiedplayers.data.benchmarks``)."""

    path: str = MISSING  # .jsonl/.jsonl.gz/.json/.parquet, a saved datasets dir, or pkg://PACKAGE/rel
    fields: dict[str, str] = field(default_factory=dict)  # canonical name -> field of the file
    split: Optional[str] = None  # for saved DatasetDicts
    limit: Optional[int] = None  # keep the first N problems (None: all)
    samples: Optional[int] = None  # k of mean@k (None: the registry's, 32 for AMC/AIME)
    max_new_tokens: Optional[int] = None  # None: eval.max_new_tokens
    # A benchmark outside the package: the importable module that registers it (register_benchmark)
    module: Optional[str] = None


@dataclass
class PromptTemplates:
    """Prompt text per answer type; ``{question}``, ``{options}``, ``{letters}``, ``{prompt}`` are filled in."""

    system: str = ""  # vanilla mode system message ("" = none)
    tool_system: str = MISSING  # tool mode: how to call the sandbox
    math: str = MISSING
    option: str = MISSING
    string: str = MISSING
    program: str = MISSING


@dataclass
class ToolModeConfig:
    """The ``tool`` mode's use of ``unifiedplayers.players.tool_loop``; its token budget is ``max_new_tokens``, shared
    by a sample's turns (``eval.harness.TotalTokenBudget``)."""

    max_turns: int = 4
    observation_max_chars: int = 1024
    timeout_s: Optional[float] = None  # per code block; None: the sandbox's (10 s)


@dataclass
class EvalConfig:
    """One evaluation preset (``conf/eval/<name>.yaml``)."""

    name: str = MISSING
    data_dir: str = "data/eval"
    benchmarks: dict[str, BenchmarkEntry] = field(default_factory=dict)
    run: list[str] = field(default_factory=list)  # benchmarks to run, in order (empty: all configured)
    modes: list[str] = field(default_factory=lambda: ["vanilla"])  # vanilla | tool
    # Per completion, all tool turns together (both modes alike); not given in the paper: room for chains of thought.
    max_new_tokens: int = 4096
    batch_size: int = 16  # completions generated per engine call
    sample_temperature: float = 0.6  # mean@k sampling (greedy pass@1 elsewhere); not stated in the paper
    sample_top_p: float = 0.95
    samples_override: Optional[int] = None  # k for every mean@k benchmark (e.g. 4 for a quick look)
    limit: Optional[int] = None  # cap on problems per benchmark (None: the entry's limit)
    unit_test_timeout_s: float = 10.0  # HumanEval, per program
    chat_template: str = "auto"  # auto | true | false
    # Tool mode's system text and examples: "player" = the Execution player's (the format it is trained on),
    # "eval" = prompts.tool_system. The user turn is the answer-type template either way.
    tool_prompt: str = "player"
    tool: ToolModeConfig = field(default_factory=ToolModeConfig)
    prompts: PromptTemplates = field(default_factory=PromptTemplates)
    method: Optional[str] = None  # table row label; None: Vanilla / Tool-augmented, or UnifiedPlayers with a ckpt
    backbone: Optional[str] = None  # paper backbone whose rows go beside ours; None: model.name
    seed: int = 0


@dataclass
class EvaluateConfig:
    """The root of ``conf/evaluate.yaml``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    player: PlayerConfig = field(default_factory=PlayerConfig)  # tool mode's Execution prompt
    eval: EvalConfig = field(default_factory=EvalConfig)
    # A save_pretrained directory, a trainer model.pt (state dict of ``model``) or a training run directory
    ckpt: Optional[str] = None
    out_dir: Optional[str] = None  # default: Hydra's run directory
    overwrite: bool = False  # replace the results.json of an out_dir; false: refuse


def register_eval_configs() -> None:
    ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
