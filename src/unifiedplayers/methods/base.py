"""One interface for a method: UnifiedPlayers itself, and every baseline (§4.1, Appendix G.1).

A method is a :class:`Method` subclass registered with :func:`register_method` (or named by ``method._target_``) and
a ``conf/method/<name>.yaml``; its ``Settings`` dataclass is the typed ``method.extra``. Every hook defaults to
UnifiedPlayers' behaviour; rewards come from the reward source each role names (:mod:`.sources`), never from a hook.
The outer loop never branches on a method's name. Hooks, in the order a sampling phase calls them:
:meth:`~Method.check` (start-up), :meth:`~Method.planning_prompts`, :meth:`~Method.build_task`,
:meth:`~Method.phase_tasks`, :meth:`~Method.after_rollouts` (per-task data goes on ``PlayedTask.method_data``), the
rewards (:meth:`~Method.phase_rewards`), :meth:`~Method.malformed_task_reward`, :meth:`~Method.group_shape`,
:meth:`~Method.minibatch_samples`, :meth:`~Method.minibatch_metrics`, :meth:`~Method.record_meta`; the run state
carries :meth:`~Method.state_dict`.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from unifiedplayers.methods.sources import BUILTIN_MODULES, RewardSource, import_builtin_methods, reward_source
from unifiedplayers.registry import Registry, import_object
from unifiedplayers.roles import ROLES


@dataclass
class GroupShape:
    """How a method trains one task's group (the K trajectories of a task, or the M verifiers)."""

    keep: bool = True  # False: the group is not trained on (R-Zero's band, Agent0's frontier)
    adv_scale: float = 1.0  # multiplies the group's GRPO advantages (Agent0's ADPO)
    clip_high: Optional[float] = None  # per-sample upper clip ε_high (Agent0's ADPO); None: trainer.clip_eps


@dataclass
class NoSettings:
    """A method without settings of its own: ``method.extra`` must be empty."""


def parse_settings(settings_class: type, extra: Any, method_name: str) -> Any:
    """``method.extra`` as the method's ``Settings``; an unknown key or a wrong type fails, naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    given = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra or {})
    known = [f.name for f in dataclasses.fields(settings_class)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"method.extra: unknown key(s) {unknown} for method {method_name!r}; "
                         f"its settings: {known or 'none'}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(settings_class), given))
    except OmegaConfBaseException as e:
        raise ValueError(f"method.extra of method {method_name!r}: {e}") from None


class Method:
    """UnifiedPlayers (Eq. 2, 4, 5 from the verdict matrix); the base of every baseline (hooks: module docstring)."""

    Settings: ClassVar[type] = NoSettings

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg  # the run config (a method may read the trainer or player settings at start-up)
        self.method_cfg = cfg.method
        self.name = str(cfg.method.name)
        self.settings = parse_settings(self.Settings, cfg.method.extra, self.name)

    # ------------------------------------------------------------------ properties the loop reads
    @property
    def shared_model(self) -> bool:
        """One set of weights for the Planning and Execution players (Absolute Zero)."""
        return bool(getattr(self.method_cfg, "shared_model", False))

    @property
    def use_tools(self) -> bool:
        """False: one generation per trajectory, its code never run (R-Zero, Socratic-Zero)."""
        return bool(self.method_cfg.use_tools)

    @property
    def writes_verifiers(self) -> bool:
        """False: no verifiers are written and no verdict matrices built (no reward reads a verdict)."""
        return bool(self.method_cfg.verifiers)

    # ------------------------------------------------------------------ start-up
    def check(self) -> None:
        """Fail at start-up on settings the method cannot honour (each reward source's own checks too)."""
        unknown = [r for r in self.method_cfg.roles if r not in ROLES]
        if unknown:
            raise ValueError(f"method.roles: unknown roles {unknown}; roles: {ROLES}")
        sources = {role: self.source(role) for role in ROLES}
        if not self.writes_verifiers:
            needing = [f"{role}_reward={getattr(self.method_cfg, f'{role}_reward')}" for role in self.method_cfg.roles
                       if sources[role].reads_verdicts]
            if needing:
                raise ValueError(f"method.verifiers=false, but the trained roles' rewards read verdicts: "
                                 f"{', '.join(needing)}")
        for source in sources.values():
            if source.check is not None:
                source.check(self.method_cfg)
        self.check_prompts()

    @property
    def prompt_shows_code(self) -> bool:
        """True where code in the Execution prompt is the task itself (Absolute Zero's programs), not a tool."""
        return False

    def check_prompts(self) -> None:
        """A method without tools must not ask for code: every sample that obeyed would end unanswered."""
        from unifiedplayers.config import resolve_player_config
        from unifiedplayers.players.execution import code_requests

        asks = code_requests(resolve_player_config(self.cfg))
        if not self.use_tools and not self.prompt_shows_code and asks:
            raise ValueError(
                f"method {self.name} runs without tools, but the Execution prompt asks for code ({', '.join(asks)}): "
                "every sample that obeyed would end unanswered. Give it a plain-text player.execution prompt "
                "(system, template, few_shot), as conf/method/r_zero.yaml does")

    def source(self, role: str) -> RewardSource:
        """``role``'s reward source: the one ``method.<role>_reward`` names."""
        return reward_source(role, str(getattr(self.method_cfg, f"{role}_reward")))

    # ------------------------------------------------------------------ rewards
    def malformed_task_reward(self, task: Any) -> float:
        """The Planning reward of a malformed Planning output ``task`` (``task.reason`` says why)."""
        return float(self.cfg.reward.malformed_task_reward)

    def phase_rewards(self, feedback: Sequence[Any]) -> list[dict[str, Any]]:
        """Every player's rewards of each task of a phase (``feedback`` in task order), one dict per task, from each
        role's :meth:`source`: (K,) and (M,) float64 arrays for Execution and Evaluation, a float for Planning."""
        execution, evaluation, planning = (self.source(role).over(feedback)
                                           for role in ("execution", "evaluation", "planning"))
        return [{"execution": np.asarray(x, dtype=np.float64), "evaluation": np.asarray(v, dtype=np.float64),
                 "planning": float(q)} for x, v, q in zip(execution, evaluation, planning, strict=True)]

    def group_shape(self, role: str, fb: Any, clip_eps: float) -> GroupShape:
        """How one task's group of ``role`` trains (plain GRPO by default); ``clip_eps`` is the role's ε."""
        return GroupShape()

    # ------------------------------------------------------------------ tasks
    def build_task(self, task: Any, sandbox: Any) -> Any:
        """A Planning output as a task (math by default: the parsed question and boxed answer)."""
        return task

    def planning_prompts(self, tokenizer: Any, player_cfg: Any, n: int) -> Optional[list[tuple[str, str]]]:
        return None

    def phase_tasks(self, role: str, groups: list, used: list, unused: list, n: int) -> tuple[list, list, list]:
        return groups, used, unused

    def after_rollouts(self, role: str, played: Sequence[Any]) -> dict[str, Any]:
        """Rank 0, once the phase's solutions are in (``played``: its :class:`~unifiedplayers.loop.sampling.PlayedTask`
        records). Returns the method's figures of the whole phase, added to each minibatch's metrics line."""
        return {}

    # ------------------------------------------------------------------ a minibatch's batch, metrics and records
    def minibatch_samples(self, role: str, minibatch: Sequence[Any], tokenizer: Any, player_cfg: Any) -> Optional[list]:
        """A batch that replaces the GRPO batch of a minibatch (``minibatch``: its played tasks); None: GRPO."""
        return None

    def minibatch_metrics(self, role: str, minibatch: Sequence[Any]) -> dict[str, Any]:
        """The method's figures of a minibatch's played tasks ``minibatch``."""
        return {}

    def record_meta(self, played: Any) -> dict[str, Any]:
        """What the record of one played task (a :class:`~unifiedplayers.loop.sampling.PlayedTask`) adds to its meta."""
        return {}

    # ------------------------------------------------------------------ run state
    def state_dict(self) -> Optional[dict[str, Any]]:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# The registry
METHODS = Registry("method", "method.name")
for _name in ("unifiedplayers", "vanilla", "tool_augmented"):  # the same method, three configs (conf/method/)
    METHODS.register(_name, Method)


def register_method(name: str):
    """Register a :class:`Method` subclass as ``method.name`` ``name``; a name another class took is refused."""

    def deco(cls: type[Method]) -> type[Method]:
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise TypeError(f"register_method({name!r}): {cls!r} is not a Method subclass")
        return METHODS.register(name, cls, stacklevel=2)

    return deco


def _import_target(target: str) -> type[Method]:
    try:
        cls = import_object(target)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"method._target_={target!r} cannot be imported ({e}); is its folder on PYTHONPATH?") from None
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ValueError(f"method._target_={target!r} is not a unifiedplayers.methods.Method subclass")
    return cls


def method_class(method_cfg: Any) -> type[Method]:
    """The class of ``method_cfg``: its ``_target_`` when set, else the one registered as ``method.name``."""
    target = getattr(method_cfg, "_target_", None)
    if target:
        return _import_target(str(target))
    name = str(method_cfg.name)
    if name not in METHODS and name in BUILTIN_MODULES:
        importlib.import_module(BUILTIN_MODULES[name])
    if name not in METHODS:
        import_builtin_methods()
        raise ValueError(f"method.name={name!r} is not a registered method; known: {sorted(METHODS.names())} "
                         "(a method outside the package sets method._target_ to its class)")
    return METHODS.get(name)


def build_method(cfg: Any) -> Method:
    """The run's method, built from the run config ``cfg`` and checked (fails at start-up with a message)."""
    method = method_class(cfg.method)(cfg)
    method.check()
    return method
