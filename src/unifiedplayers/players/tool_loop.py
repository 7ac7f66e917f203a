"""The Execution player's multi-turn tool loop (§3.2, Execution Player; Appendix D.3, E.2), shared by training
and the evaluation harness's ``tool`` mode. One call runs every sample of a batch together::

    results = run_tool_loop(engine, sandbox, prompts, questions, ToolLoopConfig(max_turns=4))
    r = results[i][j]                    # j-th sample of prompt i
    r.text, r.trajectory, r.status       # transcript, parsed Trajectory, answered|turn_limit|no_answer|error
    token_ids, loss_mask, old_logprobs = r.flatten()   # for GRPO: observations are not in the loss

One *turn* is one generation of the model, until either

- a fenced python block closes (an unlabelled fence counts as python, as in
  :func:`unifiedplayers.feedback.trajectory.parse_transcript`): the code runs in the sandbox, and its observation
  (:mod:`unifiedplayers.feedback.observation`) is appended as an inserted, non-trainable ```` ```output ```` block;
- a closed ``\\boxed{...}`` appears outside code and output fences: the sample is ``answered``;
- the model stops (eos) or runs out of ``max_new_tokens``.

Generation stops at ``"```\\n"``, which also ends an *opening* fence and the closing fence of a non-python block;
then the turn continues (a new trainable segment, at most ``max_continuations``). Text generated past a closed
python block is cut, on a token boundary, right after the fence.

Statuses, never exceptions, for malformed output: ``answered``; ``turn_limit`` (code requested in the last allowed
turn, not run); ``no_answer`` (stopped without code or answer; ``detail``: ``eos``, ``length``, ``continuations``);
``error`` (``unterminated_code_block`` at eos/length, ``context_limit`` at ``max_context_tokens``, or the sandbox or
the engine failed for this sample; a batched engine call that raises is retried sample by sample).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from unifiedplayers.feedback.observation import observation_body
from unifiedplayers.rollout.types import Completion, Segment, flatten_segments
from unifiedplayers.feedback.trajectory import (FENCE_CLOSE, FENCE_OPEN, PYTHON_LABELS, Trajectory, extract_boxed,
                                                parse_transcript)

STOP_STRINGS = ["```\n"]
OBSERVATION_OPEN = "```output\n"
OBSERVATION_CLOSE = "\n```\n"
STATUSES = ("answered", "turn_limit", "no_answer", "error")


@dataclass
class ToolLoopConfig:
    max_turns: int = 4  # generations per sample; code in the last one is not run (status turn_limit)
    max_new_tokens: int = 256  # per generation
    observation_max_chars: int = 1024
    max_continuations: int = 4  # extra generations within one turn after a non-closing stop
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    timeout_s: Optional[float] = None  # per code block; None: the sandbox's own timeout
    # Longest context (prompt + transcript) in tokens; a sample that reaches it ends with status error
    # (detail "context_limit"). None: the model's max_position_embeddings when the engine exposes it.
    max_context_tokens: Optional[int] = None

    @classmethod
    def from_player_config(cls, player_cfg: Any, **overrides: Any) -> "ToolLoopConfig":
        return cls(**{"max_turns": player_cfg.max_turns, "max_new_tokens": player_cfg.execution_max_new_tokens,
                      "observation_max_chars": player_cfg.observation_max_chars, **overrides})


@dataclass
class ToolRollout:
    question: str
    text: str  # the transcript after the prompt: generated text and rendered observations
    segments: list[Segment]  # [prompt (inserted), generated (trainable), observation (inserted), ...]
    trajectory: Trajectory  # parse_transcript(question, text)
    num_tool_calls: int
    status: str  # one of STATUSES
    detail: str = ""
    observations: list[str] = field(default_factory=list)  # observation bodies, in order

    @property
    def final_answer(self) -> Optional[str]:
        return self.trajectory.final_answer

    def flatten(self) -> tuple[list[int], list[int], list[float]]:
        """``(token_ids, loss_mask, old_logprobs)`` over prompt and response (see ``flatten_segments``)."""
        return flatten_segments(self.segments)


def render_observation(body: str) -> str:
    """The inserted observation text (without the newline that may be needed before it)."""
    return f"{OBSERVATION_OPEN}{body}{OBSERVATION_CLOSE}"


@dataclass
class _TurnScan:
    kind: str  # "code" | "answer" | "open" | "none"
    code: str = ""
    cut: int = -1  # character index after the closing fence line (code only)


def scan_turn(text: str) -> _TurnScan:
    """Classify the text generated in the current turn (since the last observation): the first closed python block
    wins unless a ``\\boxed{}`` answer comes before it; an unclosed fence is ``open``; boxes in fences never count."""
    pos = 0
    while True:
        m = FENCE_OPEN.search(text, pos)
        if m is None:
            break
        if extract_boxed(text[pos:m.start()]) is not None:
            return _TurnScan("answer")
        body_start = min(m.end() + 1, len(text))
        close = FENCE_CLOSE.search(text, body_start) if m.end() < len(text) else None
        if close is None:
            return _TurnScan("open")
        label = m.group(1).lower()
        end = close.end() + 1 if close.end() < len(text) and text[close.end()] == "\n" else close.end()
        if label in PYTHON_LABELS or label == "":
            body_end = close.start() - 1 if close.start() > body_start else close.start()
            return _TurnScan("code", code=text[body_start:body_end], cut=end)
        pos = end
    if extract_boxed(text[pos:]) is not None:
        return _TurnScan("answer")
    return _TurnScan("none")


def _cut_completion(tokenizer: Any, c: Completion, char_end: int) -> tuple[list[int], list[float], str]:
    """The shortest token prefix of ``c`` whose decoding covers ``c.text[:char_end]``."""
    target = c.text[:char_end]
    lo, hi = 1, len(c.token_ids)
    while lo < hi:  # decoded length is monotone in the prefix length
        mid = (lo + hi) // 2
        if len(tokenizer.decode(c.token_ids[:mid], skip_special_tokens=True)) >= len(target):
            hi = mid
        else:
            lo = mid + 1
    k = max(1, min(lo, len(c.token_ids)))
    return list(c.token_ids[:k]), list(c.logprobs[:k]), tokenizer.decode(c.token_ids[:k], skip_special_tokens=True)


@dataclass
class _Sample:
    segments: list[Segment]  # [prompt (inserted), ...]
    question: str
    text: str = ""  # transcript so far
    turn_text: str = ""  # generated text of the current turn
    turn: int = 1
    continuations: int = 0
    tool_calls: int = 0
    status: Optional[str] = None
    detail: str = ""
    observations: list[str] = field(default_factory=list)

    def finish(self, status: str, detail: str = "") -> None:
        self.status, self.detail = status, detail


def run_tool_loop(engine: Any, sandbox: Any, prompts: Sequence[Any], questions: Optional[Sequence[str]] = None,
                  config: Optional[ToolLoopConfig] = None, n: int = 1,
                  seed: Optional[int] = None) -> list[list[ToolRollout]]:
    """Run the tool loop on ``n`` samples of every prompt; ``out[i][j]`` is sample ``j`` of prompt ``i``.
    ``prompts``: chat-rendered strings or token-id lists; ``questions``: the task texts stored in each ``Trajectory``
    (default: the prompts, when they are strings). Each turn, all unfinished samples generate in one
    ``continue_segments`` call and all their code blocks run in one ``sandbox.run_many`` call."""
    cfg = config or ToolLoopConfig()
    if cfg.max_turns < 1:
        raise ValueError(f"max_turns={cfg.max_turns}: need at least one turn")
    tokenizer = engine.tokenizer
    if questions is None:
        questions = [p if isinstance(p, str) else "" for p in prompts]
    if len(questions) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(questions)} questions")
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p)
                  for p in prompts]
    samples = [_Sample([Segment.inserted(prompt_ids[i])], questions[i]) for i in range(len(prompts)) for _ in range(n)]

    max_context = cfg.max_context_tokens
    if max_context is None:
        max_context = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)

    call = 0
    while True:
        for s in samples:
            if s.status is None and max_context is not None and sum(len(g.token_ids) for g in s.segments) >= max_context:
                s.finish("error", "context_limit")
        active = [s for s in samples if s.status is None]
        if not active:
            break
        gen_seed = None if seed is None else seed + call
        call += 1
        done = _generate(engine, active, cfg, gen_seed)
        to_run: list[tuple[_Sample, str]] = []
        for s, c in done:
            to_run.extend(_advance(s, c, tokenizer, cfg))
        if to_run:
            _execute(to_run, sandbox, tokenizer, cfg)

    results = [ToolRollout(s.question, s.text, s.segments, parse_transcript(s.question, s.text), s.tool_calls,
                           s.status or "error", s.detail, s.observations) for s in samples]
    return [results[i * n:(i + 1) * n] for i in range(len(prompts))]


def _generate(engine: Any, active: list[_Sample], cfg: ToolLoopConfig,
              seed: Optional[int]) -> list[tuple[_Sample, Completion]]:
    """One generation for every active sample in one engine call; if the call raises, each sample
    alone, so that a failure ends only the samples it belongs to."""
    kwargs = dict(n=1, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                  stop=STOP_STRINGS, greedy=cfg.greedy, seed=seed)
    try:
        outs = engine.continue_segments([s.segments for s in active], **kwargs)
        return [(s, out[0]) for s, out in zip(active, outs)]
    except Exception as exc:
        if len(active) == 1:
            active[0].finish("error", f"engine: {type(exc).__name__}: {exc}")
            return []
    return [done for s in active for done in _generate(engine, [s], cfg, seed)]


def _advance(s: _Sample, c: Completion, tokenizer: Any, cfg: ToolLoopConfig) -> list[tuple[_Sample, str]]:
    """Record one generation of sample ``s``; return [(s, code)] when its code must run now."""
    scan = scan_turn(s.turn_text + c.text)
    token_ids, logprobs, text = list(c.token_ids), list(c.logprobs), c.text
    if scan.kind == "code":
        cut = scan.cut - len(s.turn_text)
        if cut < len(c.text):  # text went on past the closing fence: drop it
            token_ids, logprobs, text = _cut_completion(tokenizer, c, cut)
    if token_ids:
        s.segments.append(Segment(token_ids, trainable=True, logprobs=logprobs))
    s.text += text
    s.turn_text += text
    stopped_on_string = c.finish_reason == "stop" and c.stop_str is not None

    if scan.kind == "answer":
        s.finish("answered")
    elif scan.kind == "code":
        if s.turn >= cfg.max_turns:
            s.finish("turn_limit", f"code requested in turn {s.turn} of {cfg.max_turns}")
        else:
            return [(s, scan.code)]
    elif stopped_on_string and s.continuations < cfg.max_continuations:
        s.continuations += 1  # an opening fence or a non-python block ended the generation: go on
    elif scan.kind == "open" and not stopped_on_string:
        s.finish("error", "unterminated_code_block")
    elif stopped_on_string:
        s.finish("no_answer", "continuations")
    else:
        s.finish("no_answer", "length" if c.finish_reason == "length" else "eos")
    return []


def _execute(batch: list[tuple[_Sample, str]], sandbox: Any, tokenizer: Any, cfg: ToolLoopConfig) -> None:
    """Run every pending code block in one ``run_many`` call and append the observations."""
    try:
        results = sandbox.run_many([code for _, code in batch], timeout_s=cfg.timeout_s)
    except Exception as exc:  # the sandbox itself failed: these samples end, the batch goes on
        for s, _ in batch:
            s.finish("error", f"sandbox: {type(exc).__name__}: {exc}")
        return
    for (s, _), r in zip(batch, results):
        body = observation_body(r, cfg.observation_max_chars)
        obs = ("" if s.text.endswith("\n") else "\n") + render_observation(body)
        s.segments.append(Segment.from_text(tokenizer, obs))
        s.text += obs
        s.observations.append(body)
        s.tool_calls += 1
        s.turn += 1
        s.turn_text = ""
        s.continuations = 0
