"""Sampling a phase (§3.1, §3.3): tasks from the Planning player, K trajectories and M verifiers per task, with the
policies as they stand at the phase's start (:class:`PhaseSampler`), seeded from (seed, the phase's first update,
stream). Each generation call is a picklable job (:class:`TaskJob`, :class:`SolveJob`, :class:`VerifierJob`) that
every rank runs on its block of the prompts (:meth:`~unifiedplayers.loop.team.Team.split`), with the seeds of those
prompts in the whole call, so the samples do not depend on the number of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from unifiedplayers.config import role_temperature
from unifiedplayers.players.evaluation import write_verifiers
from unifiedplayers.players.execution import solve
from unifiedplayers.players.planning import PlanningTask, generate_tasks
from unifiedplayers.roles import ROLES
from unifiedplayers.diagnostics.timing import StageClock
from unifiedplayers.schedule import Update, seed_for

# Seed streams of a phase's generation calls (a call's seed: seed_for(seed, phase, stream) + its first sample,
# PhaseSampler.seed), one per player; Planning's attempt a uses TASK_STREAM + a.
TASK_STREAM, TRAJECTORY_STREAM, VERIFIER_STREAM = 10, 20, 30


@dataclass
class PlayedTask:
    """One played task's way through a phase, added to by each stage (the fields below); mini-batches, records and
    metrics are maps over the phase's list of them. It is also what the feedback reads
    (:class:`~unifiedplayers.feedback.pipeline.FeedbackTask`)."""

    task: PlanningTask
    rollouts: list[Any] = field(default_factory=list)  # the K Execution rollouts (rank 0 only)
    verifiers: list[Any] = field(default_factory=list)  # the M Evaluation verifiers (none without verifiers)
    feedback: Any = None  # its TaskFeedback: variants, verdict matrix, every term of Eq. 2-5 (feedback stage)
    rewards: dict[str, Any] = field(default_factory=dict)  # each player's rewards, by role (Method.phase_rewards)
    minibatch: int = 0  # the phase's mini-batch that trains on it (phase.assign_minibatches)
    method_data: dict[str, Any] = field(default_factory=dict)  # the method's own (Method.after_rollouts fills it)

    @property
    def place(self) -> tuple[int, int]:
        """(group, position): its questioner prompt among the phase's groups, and its place in that group."""
        return self.task.place

    @property
    def group(self) -> int:
        return self.task.place[0]

    # -- what the feedback reads
    @property
    def question(self) -> str:
        return self.task.question

    @property
    def expected_answer(self) -> Optional[str]:
        return self.task.expected_answer

    @property
    def answer_check(self) -> Any:
        return self.task.check

    @property
    def trajectories(self) -> list[Any]:
        return [r.trajectory for r in self.rollouts]

    @property
    def tool_calls(self) -> list[int]:
        return [r.num_tool_calls for r in self.rollouts]

    @property
    def verifier_sources(self) -> list[str]:
        return [v.source for v in self.verifiers]


@dataclass
class PhaseSample:
    """What a phase sampled: every Planning output by questioner prompt, the tasks played, and the well-formed ones
    beyond the phase's need (recorded, not played)."""

    groups: list[list[PlanningTask]]
    played: list[PlayedTask]
    unused: list[PlanningTask]
    versions: dict[str, dict[str, Any]]  # the checkpoint each player sampled with
    timing: dict[str, float] = field(default_factory=dict)  # generation_s (sandbox time left out)

    @property
    def questions(self) -> list[str]:
        return [p.question for p in self.played]


def place_outputs(groups: list[list[PlanningTask]]) -> None:
    """Give every Planning output of a phase its place (group, position) among the groups."""
    for g, group in enumerate(groups):
        for j, task in enumerate(group):
            task.place = (g, j)


@dataclass(frozen=True)
class TaskJob:
    """The G_T tasks of each questioner prompt of a block, numbered by their place among all of the attempt's prompts.
    ``prompts``: the method's own Planning prompts (None: the topic prompts)."""

    player_cfg: Any
    first_prompt: int
    n: int
    seed: int
    prompts: Optional[list[Any]]

    def __call__(self, engine: Any, sandbox: Any, tokenizer: Any, mine: range) -> list[list[PlanningTask]]:
        got = generate_tasks(engine, tokenizer, self.player_cfg, self.first_prompt + mine.start, len(mine), self.n,
                             seed=self.seed + mine.start * self.n,
                             prompts=None if self.prompts is None else self.prompts[mine.start:mine.stop])
        for task in (t for g in got for t in g):
            task.prompt_index += mine.start
        return got


@dataclass(frozen=True)
class SolveJob:
    """K Execution rollouts (the tool loop, in the rank's sandbox) of each question of a block."""

    execution_cfg: Any
    questions: list[str]
    k: int
    seed: int
    temperature: float
    top_p: float

    def __call__(self, engine: Any, sandbox: Any, tokenizer: Any, mine: range) -> list[list[Any]]:
        return solve(engine, sandbox, tokenizer, self.execution_cfg, [self.questions[i] for i in mine], self.k,
                     seed=self.seed + mine.start * self.k, temperature=self.temperature, top_p=self.top_p)


@dataclass(frozen=True)
class VerifierJob:
    """M Evaluation verifiers of each question of a block."""

    player_cfg: Any
    questions: list[str]
    m: int
    seed: int

    def __call__(self, engine: Any, sandbox: Any, tokenizer: Any, mine: range) -> list[list[Any]]:
        return write_verifiers(engine, tokenizer, self.player_cfg, [self.questions[i] for i in mine], self.m,
                               seed=self.seed + mine.start * self.m)


class PhaseSampler:
    """Samples the phases of a run with rank 0's :class:`~unifiedplayers.loop.team.Team`. ``prompt_counter`` (the
    questioner prompts used so far: it rotates the topics) is run state."""

    def __init__(self, cfg: Any, player_cfg: Any, execution_cfg: Any, method: Any, team: Any,
                 progress: Callable[[str], None] = lambda name: None, prompt_counter: int = 0) -> None:
        self.cfg, self.player_cfg, self.execution_cfg = cfg, player_cfg, execution_cfg
        self.method, self.team, self.tokenizer, self.sandbox = method, team, team.tokenizer, team.sandbox
        self.progress = progress
        self.prompt_counter = prompt_counter

    def seed(self, at: Update, stream: int) -> int:
        """The seed of a phase's generation call of seed ``stream``; a job's block of prompts from ``start`` draws with
        seed + start·n (vLLM seeds sample j of prompt i with seed + i·n + j, whichever rank draws it)."""
        return seed_for(self.cfg.seed, at.phase_first, stream)

    def sample(self, at: Update, num_minibatches: int) -> PhaseSample:
        """Tasks, then K trajectories and M verifiers per task, timed as the stage ``generation``."""
        clock = getattr(self.sandbox, "clock", None) or StageClock()  # a plain sandbox (tests): a clock of its own
        before = dict(clock.seconds)
        with clock("generation"):
            groups, played, unused, versions = self._generate(at, num_minibatches)
        return PhaseSample(groups, played, unused, versions, {"generation_s": clock.since(before)["generation"]})

    def _generate(self, at: Update, num_minibatches: int) -> tuple[list, list[PlayedTask], list, dict[str, Any]]:
        p, cfg = self.player_cfg, self.cfg
        self.progress("planning: tasks")
        groups, tasks, unused = self.tasks(at, num_minibatches)
        questions = [task.question for task in tasks]
        self.progress(f"execution: {len(tasks)} x {p.num_trajectories} trajectories")
        solve_job = SolveJob(self.execution_cfg, questions, p.num_trajectories, self.seed(at, TRAJECTORY_STREAM),
                             role_temperature(cfg, "execution"), cfg.rollout.top_p)
        rollouts = self.team.split(solve_job, "execution", at.role, len(questions))
        if self.method.writes_verifiers:
            self.progress(f"evaluation: {len(tasks)} x {p.num_verifiers} verifiers")
            verifier_job = VerifierJob(p, questions, p.num_verifiers, self.seed(at, VERIFIER_STREAM))
            verifiers = self.team.split(verifier_job, "evaluation", at.role, len(questions))
        else:  # a verdict-free method: no Evaluation samples (M = 0)
            verifiers = [[] for _ in questions]
        played = [PlayedTask(t, list(rs), list(vs)) for t, rs, vs in zip(tasks, rollouts, verifiers)]
        return groups, played, unused, {role: self.team.sampler(role, at.role)[1] for role in ROLES}

    def tasks(self, at: Update, num_minibatches: int
              ) -> tuple[list[list[PlanningTask]], list[PlanningTask], list[PlanningTask]]:
        """(groups, used, unused): the Planning outputs of a phase, the well-formed tasks played, and those beyond
        ``num_minibatches × tasks_per_update``. A phase that trains Planning plays every well-formed task of a round."""
        p = self.player_cfg
        groups: list[list[PlanningTask]] = []
        used: list[PlanningTask] = []
        unused: list[PlanningTask] = []
        every = at.role == "planning"
        attempts = 1 if every else p.task_attempts
        prompts, wanted = num_minibatches * p.prompts_per_update, num_minibatches * p.tasks_per_update
        # the method's own Planning prompts (Socratic-Zero: the Solver's failures); None: the topic prompts
        own_prompts = self.method.planning_prompts(self.tokenizer, p, prompts)
        for attempt in range(attempts):
            job = TaskJob(p, self.prompt_counter, p.tasks_per_prompt, self.seed(at, TASK_STREAM + attempt),
                          own_prompts)
            got = self.team.split(job, "planning", at.role, prompts)
            # the method builds the tasks (Absolute Zero: runs their code in the sandbox)
            got = [[self.method.build_task(t, self.sandbox) for t in g] for g in got]
            for g in got:
                for t in g:
                    t.prompt_index += len(groups)
            self.prompt_counter += prompts
            groups.extend(got)
            for t in (t for g in got for t in g if t.valid):
                if every or len(used) < wanted:
                    used.append(t)
                else:
                    unused.append(t)
            if every or len(used) >= wanted:
                break
        # the method picks the tasks played (Socratic-Zero: with its curriculum)
        groups, used, unused = self.method.phase_tasks(at.role, groups, used, unused, wanted)
        place_outputs(groups)
        return groups, used, unused
