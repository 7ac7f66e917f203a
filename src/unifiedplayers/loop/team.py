"""The players of a run (§3): their weights, trainers and checkpoint names, and the engines they sample with.

All three players start from the same backbone, as separate parameters (a shared model, Absolute Zero's, joins
Planning and Execution). Stale feedback (``schedule.feedback``): a co-player samples with its *published* copy from
the outer iteration's start. The methods marked :func:`~.ranks.every_rank` run on every rank.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch
from omegaconf import OmegaConf

from unifiedplayers.config import role_temperature, role_trainer_config
from unifiedplayers.loop.engines import RolloutEngines, SamplingTemperature
from unifiedplayers.loop.ranks import every_rank
from unifiedplayers.diagnostics.entropy_bank import entropy_bank_texts
from unifiedplayers.diagnostics.execution_pool import evaluate_pool
from unifiedplayers.players.evaluation import evaluation_prompt
from unifiedplayers.players.execution import execution_prompt
from unifiedplayers.players.planning import planning_prompt
from unifiedplayers.roles import ROLES
from unifiedplayers.rollout import check_backend
from unifiedplayers import lora
from unifiedplayers.trainer import build_trainer, capture_rng_state, restore_rng_state
from unifiedplayers.trainer.precision import cast_parameters


def version(role: str, outer_iteration: int, step: int) -> dict[str, Any]:
    """The name of a player's checkpoint: (player, outer iteration that produced it, update step)."""
    return {"player": role, "outer_iteration": int(outer_iteration), "step": int(step)}


@dataclass
class Player:
    """One player's weights, its trainer (None when frozen) and the name of its current checkpoint."""

    role: str
    model: Any
    trainer: Any = None
    version: Optional[dict[str, Any]] = None
    published_model: Any = None  # stale feedback: the weights at the start of the outer iteration
    published_version: Optional[dict[str, Any]] = None


class Team:
    """The run's players (``players[role]``), the engines they sample with (:meth:`engine`) and this rank's
    ``sandbox`` (set once it is open)."""

    def __init__(self, cfg: Any, player_cfg: Any, trained: list[str], shared_model: bool, dist: Any,
                 rollout_factory: Optional[Callable[..., Any]] = None) -> None:
        self.cfg, self.player_cfg, self.trained, self.dist = cfg, player_cfg, trained, dist
        self.shared_roles = ["planning", "execution"] if shared_model else []
        self.rollout_factory = rollout_factory
        self.players: dict[str, Player] = {}
        self.tokenizer: Any = None
        self.sandbox: Any = None

    # ------------------------------------------------------------------ set-up
    def load_backbone(self, backbone: Optional[tuple[Any, Any]], timing: dict[str, float]) -> tuple[Any, Any]:
        """``backbone`` when given (tests), else ``load_model(cfg.model)``, timed into ``timing["model_load_s"]``."""
        if self.rollout_factory is None:  # tests that script the engines need no backend installed
            check_backend(self.cfg.rollout)
        if backbone is not None:
            return backbone
        from unifiedplayers.models import load_model

        t = time.perf_counter()
        model_cfg = self.cfg.model
        if self.trained and self.cfg.trainer.backend == "torch" and model_cfg.dtype != "float32":
            # The torch trainer's master weights are float32: load them so, not rounded through model.dtype.
            model_cfg = OmegaConf.merge(model_cfg, {"dtype": "float32"})
        out = load_model(model_cfg)
        timing["model_load_s"] += time.perf_counter() - t
        return out

    def entropy_bank(self, role: str) -> list[list[int]]:
        """The role's first ``entropy_bank_size`` held-out contexts (Appendix D.2), rendered with its own prompt."""
        size = int(role_trainer_config(self.cfg.trainer, role).entropy_bank_size)
        render = {"planning": planning_prompt, "execution": execution_prompt, "evaluation": evaluation_prompt}[role]
        texts = [render(self.tokenizer, self.player_cfg, item) for item in entropy_bank_texts(role, size)]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def setup(self, model: Any, tokenizer: Any) -> None:
        """Three players from one backbone, a trainer for each trained one (adapters: one frozen backbone held once)."""
        self.tokenizer = tokenizer
        adapters = lora.enabled(self.cfg.trainer)
        if adapters:  # one frozen backbone, in the dtype the trainers compute in (the adapters stay float32)
            cast_parameters(lora.freeze(model), self.adapter_base_dtype)
        for i, role in enumerate(ROLES):
            if role in self.shared_roles[1:]:  # a shared model: the first shared role's model and trainer
                first = self.players[self.shared_roles[0]]
                self.players[role] = Player(role, first.model, trainer=first.trainer, version=first.version)
                continue
            if adapters:  # A from the run's seed and the role, apart from the run's RNG streams
                m = lora.add_adapter(lora.share_base(model), self.cfg.trainer.lora, seed=int(self.cfg.seed) * 3 + i)
            else:
                m = model if i == len(ROLES) - 1 else copy.deepcopy(model)
            m.eval()
            player = Player(role, m, version=version(role, 0, 0))
            if role in self.trained:
                player.trainer = build_trainer(
                    role_trainer_config(self.cfg.trainer, role), m, role=role,
                    entropy_bank=self.entropy_bank(role) or None, pad_token_id=tokenizer.pad_token_id or 0,
                    dist=self.dist)
                player.model = player.trainer.sampling_model(self.sampling_dtype)  # rollouts: in model.dtype
                player.trainer.offload_state()  # idle until its block: only the weights it samples with in memory
            else:  # a frozen adapter player samples as it is: its backbone is the others' too
                player.model = m if adapters else cast_parameters(m, self.sampling_dtype)
            player.model.eval()
            self.players[role] = player
        self.engines = RolloutEngines(self.cfg.rollout, tokenizer, self.rollout_factory)

    @property
    def sampling_dtype(self) -> torch.dtype:
        """The dtype players sample in (``model.dtype``, resolved at the run's start)."""
        from unifiedplayers.models import resolve_dtype

        return resolve_dtype(self.cfg.model.dtype, str(self.cfg.model.device))

    @property
    def adapter_base_dtype(self) -> torch.dtype:
        """The dtype of the backbone adapter players share: ``trainer.dtype``; ``model.dtype`` when nothing trains."""
        from unifiedplayers.models import resolve_dtype

        if not self.trained:
            return self.sampling_dtype
        return resolve_dtype(self.cfg.trainer.dtype, str(self.cfg.model.device))

    def trainers(self) -> list[Any]:
        """Each trainer once (a shared model's two roles have one)."""
        out: list[Any] = []
        for player in self.players.values():
            if player.trainer is not None and all(player.trainer is not t for t in out):
                out.append(player.trainer)
        return out

    # ------------------------------------------------------------------ sampling
    def sampler(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        """(model, checkpoint name) a player samples with while ``active`` is being trained."""
        p = self.players[role]
        if role != active and self.cfg.schedule.feedback == "stale" and p.published_model is not None:
            return p.published_model, p.published_version
        return p.model, p.version

    def engine(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        """The rollout engine ``role`` samples with while ``active`` trains, at ``role``'s temperature."""
        model, ver = self.sampler(role, active)
        player = self.players[role]
        key = (ver["player"], ver["outer_iteration"], ver["step"], model is player.published_model)
        own = player.trainer is not None and model is player.model
        engine = self.engines.engine(model, key, player.trainer.gathered_weights if own else contextlib.nullcontext)
        return SamplingTemperature(engine, role_temperature(self.cfg, role)), ver

    @every_rank
    def split(self, job: Callable[..., list[list[Any]]], role: str, active: str, num_prompts: int) -> Any:
        """``job(engine, sandbox, tokenizer, prompts)`` (picklable) over the ranks by prompt, with ``role``'s engine
        while ``active`` trains: every prompt's samples in prompt order on rank 0 (None elsewhere)."""
        engine, _ = self.engine(role, active)
        return self.dist.split_prompts(lambda prompts: job(engine, self.sandbox, self.tokenizer, prompts), num_prompts,
                                       to_all=False)

    @every_rank
    def answer_pool(self, execution_cfg: Any, pool_cfg: Any, questions: list[Any]) -> Optional[dict[str, Any]]:
        """The diagnostic pool answered greedily by the Execution player, graded on rank 0; the RNG states untouched."""
        rng = capture_rng_state()
        engine, _ = self.engine("execution", "execution")
        result = evaluate_pool(engine, self.sandbox, self.tokenizer, execution_cfg, pool_cfg, questions,
                               split=self.dist.split_prompts)
        restore_rng_state(rng)
        return result

    # ------------------------------------------------------------------ iterations, blocks, updates
    @every_rank
    def start_iteration(self) -> list[str]:
        """π_ref := the current weights; stale feedback publishes every trained player's weights: a copy in memory
        (and a file, :meth:`full_weights`). Returns the roles published."""
        published: list[str] = []
        for trainer in self.trainers():
            trainer.start_outer_iteration()
        if self.cfg.schedule.feedback != "stale":
            return published
        for role, player in self.players.items():
            if player.trainer is None:
                continue  # a frozen player never changes: its current weights are the published ones
            if player.published_model is None:  # an adapter player's copy shares the backbone
                player.published_model = self._copy(player.model)
            else:  # same object, new weights: its rollout engine stays valid (hf) or is re-synced (vllm)
                lora.load_policy_state(player.published_model, lora.policy_state(player.model))
            player.published_version = dict(player.version)
            published.append(role)
        return published

    @every_rank
    def full_weights(self, role: str) -> dict[str, Any]:
        """``role``'s whole weights (a collective under ZeRO-3)."""
        return self.players[role].trainer.full_state_dict()

    @staticmethod
    def _copy(model: Any) -> Any:
        """A copy of a player's module for its published weights: of the adapter alone where it is one."""
        return (lora.share_base(model) if lora.is_adapted(model) else copy.deepcopy(model)).eval()

    @every_rank
    def start_block(self, role: str) -> dict[str, Any]:
        """The other players are frozen in this block: eval mode, only the weights they sample with in memory."""
        active = self.players[role]
        for other, player in self.players.items():
            if other != role and player.model is not active.model:
                player.model.eval()
                if player.trainer is not None:
                    player.trainer.offload_state()
        return {f"{role}/{k}": v for k, v in active.trainer.start_block().items()}

    @every_rank
    def update(self, role: str, iteration: int, batch: list[Any], on_policy: bool = False) -> tuple[dict[str, float], float]:
        """One optimizer step of ``role`` on ``batch`` (skipped when empty); (trainer metrics, seconds)."""
        t = time.perf_counter()
        metrics: dict[str, float] = {}
        active = self.players[role]
        if batch:
            self.engines.sleep()  # rollout.sleep_level: the engine's memory is the trainer's until it samples again
            active.model.train()
            metrics = active.trainer.update(batch, on_policy=on_policy)
            active.model.eval()
            for player in self.players.values():  # both roles of a shared model name the new weights
                if player.model is active.model:
                    player.version = version(role, iteration, active.trainer.global_step)
        return metrics, time.perf_counter() - t

    @every_rank
    def recompute_old_logprobs(self, role: str, batches: list[list[Any]]) -> None:
        """π_old of the phase's samples := the trainer's own forward, minibatch by minibatch, before its first step."""
        if batches:
            self.engines.sleep()
        for batch in batches:
            self.players[role].trainer.recompute_old_logprobs(batch)

    @every_rank
    def save_checkpoint(self, role: str, path: Path) -> None:
        """``role``'s trainer's checkpoint in ``path`` (over several ranks: rank 0 writes, or every rank its shards)."""
        self.players[role].trainer.save_checkpoint(path)

    @every_rank
    def block_diagnostics(self, role: str) -> dict[str, Any]:
        """The trainer's figures over the block just ended (grad-norm median and CV, entropy retention)."""
        return {f"{role}/{k}": v for k, v in self.players[role].trainer.block_diagnostics().items()}

    @every_rank
    def end_block(self, role: str, later_roles: Optional[Iterable[str]] = None) -> None:
        """The block's player goes idle. A player that none of ``later_roles`` (those with blocks to come) trains took
        its last update: its optimizer state and π_ref are freed, not written (the block-end checkpoint holds them)."""
        active = self.players[role]
        final = later_roles is not None and not any(self.players[r].trainer is active.trainer for r in later_roles)
        active.trainer.offload_state(final=final)
        active.model.eval()

    # ------------------------------------------------------------------ resume
    @every_rank
    def restore_rng(self, state: dict[str, Any]) -> None:
        """The run's RNG states as saved (a resume)."""
        restore_rng_state(state)

    @every_rank
    def restore(self, run_dir: Path, versions: dict[str, Any], checkpoints: dict[str, Optional[str]]) -> None:
        """Every trained player's weights, optimizer and π_ref from its last checkpoint."""
        for role, player in self.players.items():
            player.version = versions[role]
            path = checkpoints.get(role)
            if path and player.trainer is not None:
                player.trainer.load_checkpoint(run_dir / path, restore_rng=False)
                player.trainer.offload_state()
                player.model.eval()

    @every_rank
    def resume_iteration(self, iteration: int, run_dir: Path, published_versions: dict[str, Any],
                         published: dict[str, Optional[str]]) -> None:
        """Resumed inside outer iteration ``iteration``: its reference policies and published weights."""
        for trainer in self.trainers():
            while trainer.outer_iteration < iteration:
                trainer.start_outer_iteration()
        if self.cfg.schedule.feedback != "stale":
            return
        for role, player in self.players.items():
            if player.trainer is None:
                continue
            player.published_version = published_versions[role]
            player.published_model = self._copy(player.model)
            src = published.get(role)
            if src:
                lora.load_policy_state(player.published_model,
                                       torch.load(run_dir / src, map_location="cpu", weights_only=True))
