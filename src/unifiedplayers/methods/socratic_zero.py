"""Socratic-Zero (Appendix G.1; Wang et al. 2025, arXiv 2509.24726): a fixed Teacher and two trained players
(docs/baselines.md says what is kept and what departs).

- **Teacher** (not trained, an OpenAI-compatible endpoint, :class:`SocraticSettings`): V(q, y) ∈ {0, 1} grades a
  solution (:meth:`TeacherClient.grade`); G(q, y_fail) → (q', y'_ref) turns a failed problem into a new one with a
  worked solution (:meth:`TeacherClient.refine`). An unparseable reply is recorded (``TeacherClient.failures``).
- **Solver** (Execution, no tools): DPO (``grpo.dpo_loss``) on Teacher-judged pairs (:func:`preference_pairs`).
- **Generator** (Planning): value-weighted SFT (``grpo.weighted_sft_loss``) imitating the refinements, weight U(s)
  (:func:`generator_utility`); the refined problems wait in :class:`SocraticCurriculum` for the next Execution phase.

:func:`socratic_phase` is the per-phase computation; :class:`SocraticZero` is what the outer loop runs.
"""
from __future__ import annotations

import json
import math
import os
import re
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from unifiedplayers.methods.base import Method, register_method
from unifiedplayers.methods.sources import register_reward_source

if TYPE_CHECKING:
    from unifiedplayers.feedback.pipeline import TaskFeedback

GRADE_PROMPT = (
    "You are a strict math teacher. Problem:\n{question}\n\nA student's final answer: {answer}\n\n"
    "Is the student's final answer correct? Reply with exactly one word: CORRECT or INCORRECT."
)
# G(q, y_fail): the Teacher's refinement. The Generator is prompted with the same input (GENERATOR_TEMPLATE).
REFINE_PROMPT = (
    "You are a math teacher. A student got this problem wrong.\n\nProblem:\n{question}\n\n"
    "The student's solution:\n{solution}\n\n"
    "Write one new problem, related to this one, that practises the step the student got wrong. It must be "
    "self-contained and have a single final answer. Then solve it. Reply in exactly this form:\n"
    "Problem: <the new problem>\nSolution: <a worked solution that ends with the final answer in \\boxed{{}}>"
)
GENERATOR_TEMPLATE = (
    "A student got this problem wrong.\n\nProblem:\n{question}\n\nThe student's solution:\n{solution}\n\n"
    "Write one new, related problem that practises the step the student got wrong, then its answer as \\boxed{}."
)
DEFAULT_MU, DEFAULT_SIGMA = 0.5, 0.2  # U(s) peaks where the Solver succeeds half the time
REFERENCE = -1  # the index of the Teacher's reference solution in a preference pair


class TeacherError(RuntimeError):
    """The Teacher endpoint could not be reached or answered with something that is no chat completion."""


def parse_grade(text: str) -> float:
    """1.0 for a reply saying CORRECT, 0.0 for INCORRECT; anything else is an error (never a silent 0)."""
    words = re.findall(r"[A-Za-z]+", text.upper())
    if "INCORRECT" in words:
        return 0.0
    if "CORRECT" in words:
        return 1.0
    raise ValueError(f"teacher reply is neither CORRECT nor INCORRECT: {text[:200]!r}")


@dataclass
class CurriculumItem:
    """One Teacher-refined problem (q', y'_ref), with the failure (q, y_fail) it was made from."""

    question: str
    answer: str  # the content of the reference solution's last \boxed{}
    solution: str  # the Teacher's worked reference solution y'_ref
    source_question: str  # q
    failed_solution: str  # y_fail

    def generator_target(self) -> str:
        """What the Generator imitates: q' in the engine's Planning output format (question, boxed answer)."""
        return f"{self.question}\nAnswer: \\boxed{{{self.answer}}}"


def parse_refinement(text: str, source_question: str, failed_solution: str) -> tuple[Optional[CurriculumItem], str]:
    """(item, "") from a Teacher reply of the form "Problem: ... Solution: ... \\boxed{a}", else (None, why)."""
    from unifiedplayers.feedback.trajectory import _boxed_spans

    m = re.search(r"Problem:\s*(.*?)\s*Solution:\s*(.*)", text, re.DOTALL | re.IGNORECASE)
    if not m:
        return None, "no 'Problem:' and 'Solution:' parts"
    question, solution = m.group(1).strip(), m.group(2).strip()
    spans = _boxed_spans(solution)
    if not question:
        return None, "empty problem"
    if not spans or not spans[-1][2].strip():
        return None, "the solution has no \\boxed{} answer"
    return CurriculumItem(question, spans[-1][2].strip(), solution, source_question, failed_solution), ""


class TeacherClient:
    """Minimal OpenAI-compatible chat client, greedy; grades are cached by (question, answer), and ``failures`` records
    every reply that could not be parsed."""

    def __init__(self, endpoint: str, model: str, api_key: Optional[str] = None, timeout_s: float = 60.0) -> None:
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.failures: list[str] = []
        self._grades: dict[tuple[str, str], Optional[float]] = {}

    def chat(self, prompt: str, max_tokens: int = 8) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0.0, "max_tokens": max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read())
            return data["choices"][0]["message"]["content"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise TeacherError(f"Teacher at {self.url} (model {self.model}) failed: {exc}") from exc

    def grade(self, question: str, answer: Optional[str]) -> Optional[float]:
        """V(q, y): 1.0 correct, 0.0 wrong or no answer (not sent); None when the reply was unparseable."""
        if answer is None or not str(answer).strip():
            return 0.0
        key = (question, str(answer))
        if key not in self._grades:
            reply = self.chat(GRADE_PROMPT.format(question=question, answer=answer))
            try:
                self._grades[key] = parse_grade(reply)
            except ValueError as exc:
                self.failures.append(f"grade: {exc}")
                self._grades[key] = None
        return self._grades[key]

    def refine(self, question: str, failed_solution: str, max_tokens: int = 1024) -> Optional[CurriculumItem]:
        """G(q, y_fail) -> a new problem with its reference solution; None (recorded) when unparseable."""
        reply = self.chat(REFINE_PROMPT.format(question=question, solution=failed_solution), max_tokens=max_tokens)
        item, why = parse_refinement(reply, question, failed_solution)
        if item is None:
            self.failures.append(f"refine: {why}: {reply[:200]!r}")
        return item


_CLIENTS: dict[tuple, TeacherClient] = {}


@dataclass
class SocraticSettings:
    """``method.extra`` of Socratic-Zero."""

    teacher_endpoint: Optional[str] = None  # the Teacher's OpenAI-compatible endpoint, http://HOST:PORT/v1
    teacher_model: Optional[str] = None  # the model name the endpoint serves
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the endpoint's API key (never the config)
    teacher_timeout_s: float = 60.0
    utility_mu: float = DEFAULT_MU
    utility_sigma: float = DEFAULT_SIGMA
    refine_per_phase: int = 8  # failures sent to the Teacher for refinement per Execution phase
    max_pairs_per_task: Optional[int] = 8  # the Solver's preference pairs per problem (None: all)
    curriculum_size: int = 1024  # refined problems waiting for the Solver (oldest dropped)
    curriculum_share: float = 0.5  # share of an Execution phase's tasks drawn from the curriculum
    imitation_per_phase: Optional[int] = None  # fresh refinements a Planning phase imitates (None: refine_per_phase)
    failure_pool: int = 64  # recent Solver failures (q, y_fail) the Generator is prompted with


def socratic_settings(settings: Any) -> SocraticSettings:
    """``settings`` when they are Socratic-Zero's, else the defaults (a source picked by another method)."""
    return settings if isinstance(settings, SocraticSettings) else SocraticSettings()


def teacher_for(settings: Optional[SocraticSettings], method_name: str = "socratic_zero") -> TeacherClient:
    """The client of the Teacher that ``settings`` (``method.extra``) name, one per endpoint and model."""
    s = socratic_settings(settings)
    require_teacher(s.teacher_endpoint, s.teacher_model, method_name)
    key = (s.teacher_endpoint, s.teacher_model)
    if key not in _CLIENTS:
        _CLIENTS[key] = TeacherClient(s.teacher_endpoint, s.teacher_model, os.environ.get(s.api_key_env),
                                      float(s.teacher_timeout_s))
    return _CLIENTS[key]


def check_teacher(method_cfg: Any) -> None:
    """The Teacher sources' start-up check (``check(method_cfg)``): ``method.extra`` names an endpoint and a model."""
    extra = getattr(method_cfg, "extra", None) or {}
    require_teacher(extra.get("teacher_endpoint"), extra.get("teacher_model"), str(method_cfg.name))


def require_teacher(endpoint: Optional[str], model: Optional[str], method_name: str) -> None:
    if not endpoint or not model:
        raise ValueError(
            f"method={method_name}: the Teacher is an external model behind an OpenAI-compatible endpoint; "
            "set method.extra.teacher_endpoint=http://HOST:PORT/v1 and method.extra.teacher_model=NAME "
            "(none is configured, so this method cannot run)"
        )


# The Solver's preference pairs, the Generator's utility

def preference_pairs(grades: Sequence[Optional[float]], has_reference: bool = False,
                     max_pairs: Optional[int] = None) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices of one problem's K graded solutions (Socratic-Zero's Y_w × Y_l): winners
    graded 1 (none: the Teacher's reference, :data:`REFERENCE`, if ``has_reference``), losers graded 0 (None is
    neither), paired round-robin so that a cap ``max_pairs`` keeps every loser before any is repeated."""
    winners = [i for i, g in enumerate(grades) if g == 1.0]
    losers = [i for i, g in enumerate(grades) if g == 0.0]
    if not winners and has_reference:
        winners = [REFERENCE]
    if not winners or not losers:
        return []
    # round j pairs loser i with winner (i + j) mod W: W rounds cover the W × L grid once, each round every loser
    pairs = [(winners[(i + j) % len(winners)], losers[i]) for j in range(len(winners)) for i in range(len(losers))]
    return pairs if max_pairs is None else pairs[:max_pairs]


def generator_utility(success_rate: float, mu: float = DEFAULT_MU, sigma: float = DEFAULT_SIGMA) -> float:
    """U(q' | π_S) = exp(−(s − μ)² / (2σ²)), s the Solver's graded success rate on q'."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success rate {success_rate} outside [0, 1]")
    if sigma <= 0:
        raise ValueError(f"sigma={sigma}: need > 0")
    return math.exp(-((success_rate - mu) ** 2) / (2.0 * sigma ** 2))


def success_rate(grades: Sequence[Optional[float]]) -> Optional[float]:
    """Mean grade over the graded solutions (None when none was graded)."""
    got = [g for g in grades if g is not None]
    return float(np.mean(got)) if got else None


@dataclass
class ImitationExample:
    """One Generator SFT example: the Teacher's input (q, y_fail), its output q' and the weight U(s)."""

    question: str  # q
    failed_solution: str  # y_fail
    target: str  # q' with its boxed answer (CurriculumItem.generator_target)
    weight: float


# The curriculum: the Teacher's refined problems, waiting for the next Execution phase

class SocraticCurriculum:
    """FIFO of :class:`CurriculumItem` (oldest dropped beyond ``max_size``); its state goes into the run state."""

    def __init__(self, max_size: int = 1024) -> None:
        if max_size < 1:
            raise ValueError(f"curriculum max_size={max_size}: need >= 1")
        self.max_size = max_size
        self.items: list[CurriculumItem] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, items: Sequence[CurriculumItem]) -> None:
        self.items.extend(items)
        del self.items[: max(0, len(self.items) - self.max_size)]

    def take(self, n: int) -> list[CurriculumItem]:
        out, self.items = self.items[:n], self.items[n:]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"max_size": self.max_size, "items": [asdict(i) for i in self.items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.max_size = int(state["max_size"])
        self.items = [CurriculumItem(**i) for i in state["items"]]


def curriculum_tasks(items: Sequence[CurriculumItem]) -> list[Any]:
    """Played tasks from curriculum items (the Teacher's answer expected), each with its item as ``task.socratic``."""
    from unifiedplayers.players.planning import PlanningTask

    out = []
    for item in items:
        task = PlanningTask(item.generator_target(), item.question, item.answer, True, "", topic="teacher")
        task.socratic = item
        out.append(task)
    return out


def mix_tasks(curriculum: SocraticCurriculum, generated: Sequence[Any], n: int, share: float) -> list[Any]:
    """The ``n`` tasks of an Execution phase: up to round(share · n) from the curriculum (oldest first), the rest the
    Generator's well-formed tasks; when either side runs short, the other fills in."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"curriculum_share={share}: need 0..1")
    generated = [t for t in generated if t.valid]
    k = min(len(curriculum), max(round(share * n), n - len(generated)))
    return curriculum_tasks(curriculum.take(k)) + list(generated[: n - k])


# One phase

@dataclass
class SocraticFeedback:
    """What one Execution phase yields under Socratic-Zero (all lists aligned with the phase's tasks)."""

    grades: list[list[Optional[float]]]  # V(q, y_k) per task and sample
    pairs: list[list[tuple[int, int]]]  # the Solver's preference pairs per task (REFERENCE: the Teacher's)
    references: list[Optional[str]]  # the reference solution a task's pairs may use (curriculum tasks)
    refinements: list[CurriculumItem] = field(default_factory=list)  # new Teacher problems for the next phase
    failed: list[tuple[str, str]] = field(default_factory=list)  # (q, y_fail): each failed task's first wrong solution
    imitation: list[ImitationExample] = field(default_factory=list)  # the Generator's weighted SFT examples
    failures: list[str] = field(default_factory=list)  # Teacher replies that could not be parsed


def socratic_phase(teacher: TeacherClient, tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]],
                   refine_limit: int = 8, max_pairs: Optional[int] = None, mu: float = DEFAULT_MU,
                   sigma: float = DEFAULT_SIGMA) -> SocraticFeedback:
    """Grade every solution, build the Solver's pairs, refine failed problems, and score the imitation examples. A
    curriculum task (``task.socratic``) offers its reference solution to its pairs and becomes an imitation example
    weighted by U(its success rate); the first ``refine_limit`` failures (a task's first wrong solution) are refined,
    and the new problems returned, not queued."""
    if len(tasks) != len(rollouts):
        raise ValueError(f"{len(tasks)} tasks but {len(rollouts)} rollout groups")
    n_failures = len(teacher.failures)
    grades, pairs, references, imitation, failed = [], [], [], [], []
    for task, group in zip(tasks, rollouts):
        g = [teacher.grade(task.question, r.final_answer) for r in group]
        item = getattr(task, "socratic", None)
        reference = item.solution if item is not None else None
        grades.append(g)
        references.append(reference)
        pairs.append(preference_pairs(g, has_reference=reference is not None, max_pairs=max_pairs))
        rate = success_rate(g)
        if item is not None and rate is not None:
            imitation.append(ImitationExample(item.source_question, item.failed_solution, item.generator_target(),
                                              generator_utility(rate, mu, sigma)))
        wrong = [r for r, x in zip(group, g) if x == 0.0]
        if wrong:
            failed.append((task.question, wrong[0].text))
    refinements = [it for it in (teacher.refine(q, y) for q, y in failed[:refine_limit]) if it is not None]
    return SocraticFeedback(grades, pairs, references, refinements, failed, imitation, teacher.failures[n_failures:])


# Training samples (the Solver's DPO pairs, the Generator's SFT examples)

def _reply_sample(tokenizer: Any, prompt: str, reply: str, advantage: float, group: int) -> Any:
    """A TrainSample of ``prompt`` + ``reply`` (+ eos), only the reply trained; behaviour log-probs 0 (never read)."""
    from unifiedplayers.trainer.sample import TrainSample

    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(reply, add_special_tokens=False)["input_ids"]
    if getattr(tokenizer, "eos_token_id", None) is not None:
        r = r + [tokenizer.eos_token_id]
    return TrainSample(p + r, [0] * len(p) + [1] * len(r), [0.0] * (len(p) + len(r)), advantage, group)


def preference_samples(tokenizer: Any, player_cfg: Any, tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]],
                       fb: SocraticFeedback) -> list[Any]:
    """The Solver's DPO batch: each pair a group of two adjacent samples, chosen (+1) then rejected (−1); a Teacher
    reference (REFERENCE) rendered after the Solver's own Execution prompt."""
    from unifiedplayers.players.execution import execution_prompt
    from unifiedplayers.trainer.sample import sample_from_segments

    out, group = [], 0
    for task, group_rollouts, task_pairs, ref in zip(tasks, rollouts, fb.pairs, fb.references):
        for chosen, rejected in task_pairs:
            if chosen == REFERENCE:
                if ref is None:
                    raise ValueError(f"a pair of {task.question[:60]!r} uses a reference solution it does not have")
                out.append(_reply_sample(tokenizer, execution_prompt(tokenizer, player_cfg, task.question), ref,
                                         1.0, group))
            else:
                out.append(sample_from_segments(group_rollouts[chosen].segments, 1.0, group))
            out.append(sample_from_segments(group_rollouts[rejected].segments, -1.0, group))
            group += 1
    return out


def generator_prompt(tokenizer: Any, planning_prompts: Any, question: str, failed_solution: str) -> str:
    """The Generator's prompt for one failure: its Planning system text and few-shot, then the Teacher's input."""
    from unifiedplayers.players.prompts import render_prompt
    from omegaconf import OmegaConf

    prompts = OmegaConf.merge(planning_prompts, {"template": GENERATOR_TEMPLATE, "response_prefix": ""})
    return render_prompt(tokenizer, prompts, question=question, solution=failed_solution)


def imitation_samples(tokenizer: Any, planning_prompts: Any, examples: Sequence[ImitationExample]) -> list[Any]:
    """The Generator's weighted SFT batch: one sample per example, its weight as the advantage."""
    return [_reply_sample(tokenizer, generator_prompt(tokenizer, planning_prompts, e.question, e.failed_solution),
                          e.target, float(e.weight), i) for i, e in enumerate(examples)]


# The loop: what the outer loop does for method=socratic_zero

def check_loop_trainers(cfg: Any) -> None:
    """Start-up: the Solver trains by DPO (β = kl_coef > 0, each pair in one micro-batch), the Generator by SFT."""
    from unifiedplayers.config import role_trainer_config

    roles = set(cfg.method.roles) if cfg.method.trainable else set()
    if "execution" in roles:
        t = role_trainer_config(cfg.trainer, "execution")
        if t.policy_loss != "dpo":
            raise ValueError(f"method=socratic_zero trains the Solver on preference pairs: needs "
                             f"trainer.roles.execution.policy_loss=dpo (got {t.policy_loss!r})")
        if not t.kl_coef > 0:
            raise ValueError(f"method=socratic_zero: DPO's β is the Solver's kl_coef, which must be > 0 "
                             f"(trainer.roles.execution.kl_coef / trainer.kl_coef = {t.kl_coef})")
        if t.grad_accum_steps > 0 or t.micro_batch_size % 2:
            raise ValueError(f"method=socratic_zero: DPO keeps each (chosen, rejected) pair in one micro-batch: needs "
                             f"an even trainer.micro_batch_size and trainer.grad_accum_steps=0 (got "
                             f"{t.micro_batch_size} and {t.grad_accum_steps})")
    if "planning" in roles:
        t = role_trainer_config(cfg.trainer, "planning")
        if t.policy_loss != "weighted_sft":
            raise ValueError(f"method=socratic_zero trains the Generator by imitating the Teacher: needs "
                             f"trainer.roles.planning.policy_loss=weighted_sft (got {t.policy_loss!r})")


SOCRATIC = "socratic"  # the key of a played task's SocraticTask in its method_data


@dataclass
class SocraticTask:
    """What the Teacher's feedback says of one played task (kept in ``PlayedTask.method_data["socratic"]``)."""

    grades: list[Optional[float]]  # V(q, y_k) of its K solutions
    pairs: list[tuple[int, int]]  # the Solver's preference pairs (REFERENCE: the Teacher's solution)
    reference: Optional[str]  # the reference solution its pairs may use (a curriculum task's)
    imitation: Optional[ImitationExample]  # the Generator's example from it (a graded curriculum task)
    failed_solution: Optional[str]  # its first wrong solution
    refinement: Optional[str]  # the Teacher's problem refined from that failure (None: none made)


def socratic_data(played: Any) -> SocraticTask:
    """A played task's :class:`SocraticTask` (left by :meth:`SocraticZero.after_rollouts`)."""
    if SOCRATIC not in played.method_data:
        raise RuntimeError("no Socratic-Zero feedback of this task: call after_rollouts first")
    return played.method_data[SOCRATIC]


@register_method("socratic_zero")
class SocraticZero(Method):
    """Socratic-Zero's hooks into the outer loop. Its run state: the curriculum, the refinements not imitated yet
    (``fresh``) and the Solver's recent failures (the Generator's prompts)."""

    Settings = SocraticSettings

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        s = self.settings
        self.teacher = teacher_for(s, self.name)
        check_loop_trainers(cfg)
        if not 0.0 <= s.curriculum_share <= 1.0:
            raise ValueError(f"method.extra.curriculum_share={s.curriculum_share}: need 0..1")
        self.imitation_limit = s.refine_per_phase if s.imitation_per_phase is None else s.imitation_per_phase
        generator_utility(0.5, s.utility_mu, s.utility_sigma)  # fails now on sigma <= 0
        if min(s.refine_per_phase, self.imitation_limit, s.failure_pool) < 0:
            raise ValueError("method.extra: refine_per_phase, imitation_per_phase and failure_pool must be >= 0")
        self.curriculum = SocraticCurriculum(int(s.curriculum_size))
        self.fresh: list[CurriculumItem] = []
        self.failures: list[tuple[str, str]] = []

    # -- before the phase's rollouts
    def planning_prompts(self, tokenizer: Any, player_cfg: Any, n: int) -> Optional[list[tuple[str, str]]]:
        """The Generator's prompts: the Teacher's input (q, y_fail) of the ``n`` most recent failures, cycled
        when fewer; None (the topic prompts) before the first failure."""
        if not self.failures or n < 1:
            return None
        recent = self.failures[-n:]
        return [("failure", generator_prompt(tokenizer, player_cfg.planning, *recent[i % len(recent)]))
                for i in range(n)]

    def phase_tasks(self, role: str, groups: list, used: list, unused: list, n: int) -> tuple[list, list, list]:
        """Execution: ``n`` tasks mixed from the curriculum and the Generator (:func:`mix_tasks`). Planning: the
        Generator's tasks plus the fresh refinements, as one extra group."""
        if role == "execution":
            tasks = mix_tasks(self.curriculum, used, n, self.settings.curriculum_share)
            unused = list(unused) + [t for t in used if not any(t is c for c in tasks)]  # the Generator's left out
            teacher = [t for t in tasks if getattr(t, "socratic", None) is not None]
        elif role == "planning":
            take, self.fresh = self.fresh[: self.imitation_limit], self.fresh[self.imitation_limit:]
            teacher = curriculum_tasks(take)
            tasks = list(used) + teacher
        else:
            return groups, used, unused
        for t in teacher:
            t.prompt_index = len(groups)
        return (list(groups) + [teacher] if teacher else list(groups)), tasks, unused

    # -- after them (rank 0)
    def after_rollouts(self, role: str, played: Sequence[Any]) -> dict[str, Any]:
        """The Teacher grades the phase; an Execution phase's failures are refined into the curriculum and kept as the
        Generator's prompts. Each played task keeps its :class:`SocraticTask`; returns the phase's Teacher figures."""
        s = self.settings
        fb = socratic_phase(self.teacher, [p.task for p in played], [p.rollouts for p in played],
                            s.refine_per_phase if role == "execution" else 0, s.max_pairs_per_task, s.utility_mu,
                            s.utility_sigma)
        if role == "execution":
            self.curriculum.add(fb.refinements)
            self.fresh = (self.fresh + fb.refinements)[-self.curriculum.max_size:]
            self.failures = (self.failures + fb.failed)[-s.failure_pool:] if s.failure_pool else []
        examples = iter(fb.imitation)  # socratic_phase made one per graded curriculum task, in task order
        for p, grades, pairs, reference in zip(played, fb.grades, fb.pairs, fb.references, strict=True):
            item = getattr(p.task, "socratic", None)
            wrong = next((r.text for r, g in zip(p.rollouts, grades) if g == 0.0), None)
            refined = [r.question for r in fb.refinements
                       if wrong is not None and (r.source_question, r.failed_solution) == (p.task.question, wrong)]
            graded = item is not None and success_rate(grades) is not None
            p.method_data[SOCRATIC] = SocraticTask(grades, pairs, reference, next(examples) if graded else None,
                                                   wrong, refined[0] if refined else None)
        if role == "evaluation":  # not trained by this method
            return {}
        return {"socratic/refinements": len(fb.refinements), "socratic/teacher_failures": len(fb.failures),
                "socratic/curriculum_size": len(self.curriculum)}

    def minibatch_samples(self, role: str, minibatch: Sequence[Any], tokenizer: Any, player_cfg: Any) -> Optional[list]:
        """Execution: the Solver's DPO pairs of the minibatch's tasks. Planning: the Generator's weighted SFT
        examples (the minibatch's refinements, weighted by U(s)). Evaluation: not trained by this method."""
        if role == "evaluation":
            return None
        data = [socratic_data(p) for p in minibatch]
        if role == "execution":
            fb = SocraticFeedback([d.grades for d in data], [d.pairs for d in data], [d.reference for d in data])
            return preference_samples(tokenizer, player_cfg, [p.task for p in minibatch], [p.rollouts for p in minibatch], fb)
        return imitation_samples(tokenizer, player_cfg.planning,
                                 [d.imitation for d in data if d.imitation is not None])

    def minibatch_metrics(self, role: str, minibatch: Sequence[Any]) -> dict[str, Any]:
        """The minibatch's Teacher figures (the phase's are :meth:`after_rollouts`')."""
        if role == "evaluation":
            return {}
        data = [socratic_data(p) for p in minibatch]
        weights = [d.imitation.weight for d in data if d.imitation is not None]
        return {
            "socratic/solver_success": success_rate([g for d in data for g in d.grades]),
            "socratic/pairs": sum(len(d.pairs) for d in data),
            "socratic/teacher_tasks": sum(getattr(p.task, "socratic", None) is not None for p in minibatch),
            "socratic/imitation_examples": len(weights) if role == "planning" else 0,
            "socratic/imitation_weight_mean": float(np.mean(weights)) if role == "planning" and weights else None,
        }

    def record_meta(self, played: Any) -> dict[str, Any]:
        """What the record of a played task keeps: the Teacher's grades, the Solver's pairs, its failure (the
        first wrong solution) and the Teacher's refinement of it, the imitation weight."""
        d, item = socratic_data(played), getattr(played.task, "socratic", None)
        return {"teacher_grades": list(d.grades), "preference_pairs": [list(p) for p in d.pairs],
                "teacher_problem": item is not None, "refined_from": item.source_question if item else None,
                "failed_solution": d.failed_solution, "refinement": d.refinement,
                "imitation_weight": d.imitation.weight if d.imitation is not None else None}

    def state_dict(self) -> dict[str, Any]:
        return {"curriculum": self.curriculum.state_dict(), "fresh": [asdict(i) for i in self.fresh],
                "failures": [list(f) for f in self.failures]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        self.fresh = [CurriculumItem(**i) for i in state["fresh"]]
        self.failures = [(q, y) for q, y in state["failures"]]



# Reward sources (the records' Teacher grades and utilities; SocraticZero trains on pairs and imitation)

@register_reward_source("execution", "teacher", check=check_teacher)
def execution_teacher(fb: TaskFeedback) -> np.ndarray:
    """The Teacher's grade of each of the K final answers (1 correct, 0 incorrect, missing or ungraded). (K,)"""
    client = teacher_for(fb.settings)
    return np.array([client.grade(fb.question, a) or 0.0 for a in fb.answers], dtype=np.float64)


@register_reward_source("planning", "socratic_utility", check=check_teacher)
def planning_socratic_utility(fb: TaskFeedback) -> float:
    """U(s) of the Generator's problem, s the Solver's graded success rate on it (0 when nothing was graded)."""
    s = socratic_settings(fb.settings)
    rate = success_rate([teacher_for(s).grade(fb.question, a) for a in fb.answers])
    if rate is None:
        return 0.0
    return generator_utility(rate, float(s.utility_mu), float(s.utility_sigma))
