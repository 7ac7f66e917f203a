"""Role-specific rewards from the verdict matrix (§3.2, Eq. 2-5; Appendix B.1, Eq. 11, 12). Pure numpy.

Shapes: z_orig (M_q, K), z_adv (M_q, K, P), adv_mask (K, P) or None (all variants present).

Choices the paper leaves open (set in ``conf/reward/``, see ``RewardConfig``):
- r_S when M_q = 0: ``no_valid_value`` of :func:`execution_rewards` (default 0.0 for all K, so the
  group has zero advantage: no evidence, no signal).
- ρ_adv with masked variants (a rule that could not apply) averages over the variants that exist;
  with none at all (P = 0, the "none" rule set) it is 0.
- Check errors (a raise, a timeout, a non-verdict return; ``verdict.VerdictMatrix.error_adv``): Z keeps
  the paper's 0 and, by default (``reward.variant_error_credit: true``, Eq. 11 as written), a rejection
  in ρ_adv. ``variant_error_credit: false`` gives an error on a variant no ρ_adv credit: it stays in the
  count K·P and adds nothing to the sum (an error is no evidence the perturbation was caught). A
  verifier that errors on every original is invalid (``verdict``), so it never reaches Eq. 5 or V(q).
- r_C of an invalid verifier: ``invalid_verifier_reward``; r_T of a malformed task: ``malformed_task_reward``.
- p̂ with missing answers: every sample counts in the denominator; a missing answer joins no cluster
  unless ``missing_in_majority`` (then all missing answers form one cluster).
- ρ_red: similarity on canonical code tokens (names renumbered by first use, strings and comments
  dropped), so renaming variables or rewording messages does not make two verifiers different.
- R(q): max sentence-BLEU against the last ``repetition_history`` questions (or R-Zero's share of
  the history above a BLEU threshold).

The maths is pure numpy. U(q)'s answer matching (math-verify/sympy) runs in a guard subprocess with a
time limit, because sympy can evaluate a short answer for ever.
"""
from __future__ import annotations

import atexit
import io
import keyword
import logging
import tokenize
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Optional, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------------
# Execution


def execution_rewards(z_orig: np.ndarray, no_valid_value: float = 0.0) -> np.ndarray:
    """Eq. 4: r_S(τ_k) = (1/M_q) Σ_{i ∈ I_valid} Z_orig[i, k]. Shape (K,).

    With M_q = 0 every trajectory gets ``no_valid_value`` (a choice the paper leaves open: Eq. 4 divides by M_q).
    """
    z = np.asarray(z_orig, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"z_orig must be (M_q, K), got shape {z.shape}")
    if z.shape[0] == 0:
        return np.full(z.shape[1], float(no_valid_value))
    return z.mean(axis=0)


# ---------------------------------------------------------------------------------------------------
# Evaluation


def gold_pass_rate(z_orig: np.ndarray) -> np.ndarray:
    """Eq. 11: ρ_gold_i = (1/K) Σ_k Z_orig[i, k]. Shape (M_q,); 0 when K = 0."""
    z = np.asarray(z_orig, dtype=np.float64)
    if z.shape[1] == 0:
        return np.zeros(z.shape[0])
    return z.mean(axis=1)


def _mask(z_adv: np.ndarray, adv_mask: Optional[np.ndarray]) -> np.ndarray:
    k, p = z_adv.shape[1:]
    mask = np.ones((k, p), dtype=bool) if adv_mask is None else np.asarray(adv_mask, dtype=bool)
    if mask.shape != (k, p):
        raise ValueError(f"adv_mask must be (K, P) = {(k, p)}, got {mask.shape}")
    return mask


def adversarial_rejection_rate(
    z_adv: np.ndarray, adv_mask: Optional[np.ndarray] = None, adv_errors: Optional[np.ndarray] = None
) -> np.ndarray:
    """Eq. 11: ρ_adv_i = (1/(K·P)) Σ_k Σ_j (1 − Z_adv[i, k, j]). Shape (M_q,).

    With a mask, the sum and the count run over the variants that exist (mask True); with no variant
    at all, ρ_adv = 0. With ``adv_errors`` (M_q, K, P) bool, a check that errored on a variant stays in
    the count but earns no rejection credit: the sum runs over (1 − Z_adv − E_adv).
    """
    z = np.asarray(z_adv, dtype=np.float64)
    if z.ndim != 3:
        raise ValueError(f"z_adv must be (M_q, K, P), got shape {z.shape}")
    mask = _mask(z, adv_mask)
    n = int(mask.sum())
    if n == 0:
        return np.zeros(z.shape[0])
    credit = 1.0 - z
    if adv_errors is not None:
        e = np.asarray(adv_errors, dtype=bool)
        if e.shape != z.shape:
            raise ValueError(f"adv_errors must be (M_q, K, P) = {z.shape}, got {e.shape}")
        credit = credit * ~e
    return (credit * mask[None]).sum(axis=(1, 2)) / n


def _code_tokens(source: str) -> list[str]:
    """Canonical token sequence of a verifier: names renumbered by first use (so consistent renaming
    changes nothing), keywords/builtins/attribute names kept, string literals as STR, comments dropped."""
    import builtins

    keep = set(keyword.kwlist) | set(dir(builtins))
    out: list[str] = []
    names: dict[str, str] = {}
    fstring_depth = 0
    prev = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            ttype, s = tok.type, tok.string
            if ttype == getattr(tokenize, "FSTRING_START", -1):
                fstring_depth += 1
                continue
            if ttype == getattr(tokenize, "FSTRING_END", -1):
                fstring_depth -= 1
                if fstring_depth == 0:
                    out.append("STR")
                continue
            if fstring_depth:
                continue
            if ttype in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
                continue
            if ttype == tokenize.STRING:
                out.append("STR")
            elif ttype == tokenize.NAME and s not in keep and prev != ".":
                out.append(names.setdefault(s, f"v{len(names)}"))
            elif ttype in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                out.append(tokenize.tok_name[ttype])
            else:
                out.append(s)
            prev = s
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()
    return out


def code_similarity(a: str, b: str, method: str = "sequence") -> float:
    """Similarity in [0, 1] of two verifier sources on canonical code tokens.

    ``sequence``: difflib ratio 2·matches/(|a|+|b|) of the token sequences.
    ``jaccard``: |A ∩ B| / |A ∪ B| of the sets of token trigrams.
    """
    ta, tb = _code_tokens(a), _code_tokens(b)
    if method == "sequence":
        if not ta and not tb:
            return 1.0
        return SequenceMatcher(None, ta, tb, autojunk=False).ratio()
    if method == "jaccard":
        ga = {tuple(ta[i : i + 3]) for i in range(max(1, len(ta) - 2))}
        gb = {tuple(tb[i : i + 3]) for i in range(max(1, len(tb) - 2))}
        union = ga | gb
        return len(ga & gb) / len(union) if union else 1.0
    raise ValueError(f"unknown similarity {method!r}: sequence | jaccard")


def redundancy(sources: Sequence[str], method: str = "sequence") -> np.ndarray:
    """ρ_red_i = max_{i' ≠ i} sim(v_i, v_i') over the valid verifiers of one task. Shape (M_q,).

    A lone valid verifier has ρ_red = 0 (nothing to repeat).
    """
    m = len(sources)
    sim = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            sim[i, j] = sim[j, i] = code_similarity(sources[i], sources[j], method)
    return sim.max(axis=1) if m > 1 else np.zeros(m)


def evaluation_rewards(
    z_orig: np.ndarray,
    z_adv: np.ndarray,
    redundancy: np.ndarray,
    alpha: float,
    beta: float,
    gamma: float,
    adv_mask: Optional[np.ndarray] = None,
    adv_errors: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Eq. 5: r_C(v_i) = α ρ_gold_i + β ρ_adv_i − γ ρ_red_i. Shape (M_q,).

    ``adv_errors``: see :func:`adversarial_rejection_rate` (no ρ_adv credit for an error on a variant).
    """
    red = np.asarray(redundancy, dtype=np.float64)
    adv = adversarial_rejection_rate(z_adv, adv_mask, adv_errors)
    return alpha * gold_pass_rate(z_orig) + beta * adv - gamma * red


# ---------------------------------------------------------------------------------------------------
# Planning


class _DropTimeoutNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_ANSWER_PARSE_MAX_CHARS = 200  # longer answers are compared as text: sympy on long input can hang


def _parse_answer(answer: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if len(answer) > _ANSWER_PARSE_MAX_CHARS:
        return []
    try:
        # Timeouts off: math-verify's signal-based timeout fails outside the main thread.
        return parse(f"${answer}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                     parsing_timeout=None)
    except Exception:
        return []


def _equivalent(a: str, pa: list, b: str, pb: list) -> bool:
    from math_verify import verify

    if " ".join(a.split()) == " ".join(b.split()):
        return True
    if not pa or not pb:
        return False
    try:
        return bool(verify(pa, pb, timeout_seconds=None) or verify(pb, pa, timeout_seconds=None))
    except Exception:
        return False


def _math_clusters(answers: Sequence[Optional[str]]) -> list[list[int]]:
    """The clustering itself (in whatever process runs it)."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutNotice) for f in logger.filters):
            logger.addFilter(_DropTimeoutNotice())
    clusters: list[list[int]] = []
    reps: list[tuple[str, list]] = []
    for idx, ans in enumerate(answers):
        if ans is None or not ans.strip():
            continue
        a = ans.strip()
        pa = _parse_answer(a)
        for cluster, (b, pb) in zip(clusters, reps):
            if _equivalent(a, pa, b, pb):
                cluster.append(idx)
                break
        else:
            clusters.append([idx])
            reps.append((a, pa))
    return clusters


def _text_clusters(answers: Sequence[Optional[str]]) -> list[list[int]]:
    """Fallback: answers equal up to whitespace."""
    groups: dict[str, list[int]] = {}
    for idx, ans in enumerate(answers):
        if ans is not None and ans.strip():
            groups.setdefault(" ".join(ans.split()), []).append(idx)
    return list(groups.values())


def _serve_stdio() -> None:  # pragma: no cover - runs in the guard process
    """The guard process: one JSON list of answers per line in, one JSON list of clusters per line out."""
    import json
    import os
    import sys

    try:
        import resource

        cap = 4 << 30  # a runaway sympy evaluation fails with MemoryError instead of exhausting the host
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass
    out = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # nothing a library prints can corrupt the replies
    try:  # import the matcher before saying ready: its start-up is not charged to the first request
        _math_clusters(["1", "1"])
    except Exception:  # noqa: BLE001 - the requests fail the same way and fall back
        pass
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            reply = _math_clusters(json.loads(line))
        except Exception:  # noqa: BLE001 - any failure: the caller falls back to text matching
            reply = None
        out.write(json.dumps(reply) + "\n")
        out.flush()


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used, all its threads (its CPU-time clock, as clock_getcpuclockid gives
    it); ``inf`` once it is gone, so that a wait on it ends."""
    import time

    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        return float("inf")


class _ClusterGuard:
    """Runs math-verify in a child process that is killed when it exceeds its time.

    math-verify's own timeouts rely on signals and fail outside the main thread, and sympy evaluates
    a short answer such as 9^{9^{9^{9}}} for ever; a killed child costs one restart (about a second).
    A plain subprocess (not multiprocessing) so that no caller's ``__main__`` is re-imported.
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._proc: Any = None
        self._pid = 0

    startup_timeout_s = 120.0  # importing sympy and math-verify: seconds on a quiet machine, more under load
    wall_factor = 3.0  # a request is also abandoned after this many times its CPU budget of wall clock

    def _start(self) -> bool:
        """Start the guard and wait until it has imported its matcher (not part of any request's time)."""
        import os
        import subprocess
        import sys
        import time

        code = "from unifiedplayers.feedback.rewards import _serve_stdio; _serve_stdio()"
        env = dict(os.environ, PYTHONHASHSEED="0")  # sympy iterates sets: one order in every run
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, close_fds=True, env=env)
        self._pid = os.getpid()
        if self._read_line(time.monotonic() + self.startup_timeout_s) != b"ready\n":
            self._stop()
            return False
        return True

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc = None

    def _read_line(self, deadline: float, cpu_limit: Optional[float] = None) -> Optional[bytes]:
        """The guard's next line, or None once the wall clock reaches ``deadline`` (monotonic) or the guard's own
        CPU clock reaches ``cpu_limit`` (seconds; :func:`process_cpu_seconds`)."""
        import os
        import select
        import time

        buf = b""
        fd = self._proc.stdout.fileno()
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if cpu_limit is not None:
                left = min(left, cpu_limit - process_cpu_seconds(self._proc.pid))
            if left <= 0:
                return None
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            buf += chunk
        return buf

    def clusters(self, answers: list[Optional[str]], timeout_s: float) -> Optional[list[list[int]]]:
        import json
        import os
        import time

        with self._lock:
            if self._pid != os.getpid():  # a forked copy of this process: the child is the parent's
                self._proc = None
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                if not self._start():
                    return None
            try:
                self._proc.stdin.write(json.dumps(answers).encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:
                self._stop()
                return None
            # Its CPU time decides, not the wall clock: a match that ends within its budget on a quiet machine
            # ends within it under any load (the wall-clock cap only guards against a guard that stalls).
            cpu_limit = process_cpu_seconds(self._proc.pid) + timeout_s
            line = self._read_line(time.monotonic() + self.wall_factor * timeout_s, cpu_limit)
            if line is None:
                self._stop()
                return None
            return json.loads(line)


    def close(self) -> None:
        import os

        with self._lock:
            if self._pid == os.getpid():
                self._stop()
            self._proc = None


_GUARD = _ClusterGuard()
atexit.register(_GUARD.close)


def answer_clusters(answers: Sequence[Optional[str]], timeout_s: Optional[float] = 10.0) -> list[list[int]]:
    """Group the indices of equivalent answers (math-verify: 5/2 ≡ 2.5 ≡ \\frac{5}{2}); missing answers
    (None or blank) are left out. Each answer joins the first cluster whose first member it matches.

    Runs in a guard process killed after ``timeout_s`` seconds of its CPU time (then answers are grouped by text,
    with a warning), so that the grouping, and U(q), never depend on the machine's load; ``timeout_s=None`` runs
    in this process, for trusted input only.
    """
    answers = [None if a is None else str(a) for a in answers]
    if timeout_s is None:
        return _math_clusters(answers)
    if all(a is None or not a.strip() for a in answers):
        return []
    got = _GUARD.clusters(answers, timeout_s)
    if got is None:
        logging.getLogger(__name__).warning(
            "answer matching exceeded %.1f s of CPU time or failed; grouping %d answers by text", timeout_s, len(answers))
        return _text_clusters(answers)
    return got


def majority_share(
    answers: Sequence[Optional[str]], missing_in_majority: bool = False, timeout_s: Optional[float] = 10.0
) -> float:
    """p̂: share of the K samples that give the most frequent answer (K counts missing answers too)."""
    k = len(answers)
    if k == 0:
        return 0.0
    sizes = [len(c) for c in answer_clusters(answers, timeout_s)]
    if missing_in_majority:
        sizes.append(sum(1 for a in answers if a is None or not a.strip()))
    return max(sizes, default=0) / k


def uncertainty(
    answers: Sequence[Optional[str]], missing_in_majority: bool = False, timeout_s: Optional[float] = 10.0
) -> float:
    """U(q) = min(p̂, 1 − p̂) (§3.2, below Eq. 2). ``timeout_s``: see :func:`answer_clusters`."""
    p_hat = majority_share(answers, missing_in_majority, timeout_s)
    return float(min(p_hat, 1.0 - p_hat))


def verifier_writability(
    z_adv: np.ndarray,
    num_generated: int,
    adv_mask: Optional[np.ndarray] = None,
    adv_errors: Optional[np.ndarray] = None,
) -> float:
    """Eq. 3 / 12: V(q) = (M_q/M)·(1/M_q) Σ_{i ∈ I_valid} ρ_adv_i = (1/M) Σ_{i ∈ I_valid} ρ_adv_i.

    0 when no verifier is valid (M_q = 0) or none was generated. ``adv_errors``: see
    :func:`adversarial_rejection_rate`; a verifier invalid at run time has no row, so adds nothing.
    """
    z = np.asarray(z_adv)
    if num_generated <= 0 or z.shape[0] == 0:
        return 0.0
    if z.shape[0] > num_generated:
        raise ValueError(f"{z.shape[0]} valid verifiers out of {num_generated} generated")
    return float(adversarial_rejection_rate(z, adv_mask, adv_errors).sum() / num_generated)


def repetition_penalty(
    question: str,
    history: Sequence[str],
    mode: str = "max_bleu",
    threshold: float = 0.5,
) -> float:
    """R(q) in [0, 1]: BLEU-based repetition of ``question`` against earlier questions (sacrebleu).

    ``max_bleu``: max over the history of sentence-BLEU(q, h)/100.
    ``cluster_share``: share of the history with sentence-BLEU(q, h)/100 ≥ ``threshold`` (R-Zero style).
    Empty history: 0.
    """
    from sacrebleu.metrics import BLEU

    if not history:
        return 0.0
    bleu = BLEU(effective_order=True)
    scores = np.array([bleu.sentence_score(question, [h]).score / 100.0 for h in history])
    if mode == "max_bleu":
        return float(np.clip(scores.max(), 0.0, 1.0))
    if mode == "cluster_share":
        return float((scores >= threshold).mean())
    raise ValueError(f"unknown repetition mode {mode!r}: max_bleu | cluster_share")


class QuestionHistory:
    """The earlier questions R(q) compares against: the last ``maxlen`` (``repetition_history``)."""

    def __init__(self, maxlen: int = 1000, questions: Sequence[str] = ()) -> None:
        from collections import deque

        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        self._q: Any = deque(questions, maxlen=maxlen)

    def add(self, question: str) -> None:
        self._q.append(question)

    def extend(self, questions: Sequence[str]) -> None:
        for q in questions:
            self.add(q)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)

    def __getitem__(self, i: int) -> str:
        return self._q[i]


def planning_reward(u: float, v: float, r: float, w_unc: float, w_ver: float, w_rep: float) -> float:
    """Eq. 2: r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q)."""
    return float(w_unc * u + w_ver * v - w_rep * r)


# ---------------------------------------------------------------------------------------------------
# All three rewards of one task from its record, with the open choices of the config


@dataclass
class TaskRewards:
    """The rewards of one task: execution (K,), evaluation (M,) over ALL generated verifiers (invalid
    ones get the configured reward), planning (scalar) and the terms behind them."""

    execution: np.ndarray
    evaluation: np.ndarray
    planning: float
    gold: np.ndarray
    adv: np.ndarray
    red: np.ndarray
    uncertainty: float
    writability: float
    repetition: float


def task_rewards(
    z_orig: np.ndarray,
    z_adv: np.ndarray,
    valid: Sequence[int],
    num_generated: int,
    valid_sources: Sequence[str],
    answers: Sequence[Optional[str]],
    question: str,
    history: Sequence[str],
    cfg: Any,
    adv_mask: Optional[np.ndarray] = None,
    adv_errors: Optional[np.ndarray] = None,
) -> TaskRewards:
    """Eq. 2, 4, 5 for one task; ``cfg`` is a ``RewardConfig`` (``conf/reward/``).

    ``adv_errors``: ``VerdictMatrix.error_adv``; errors on variants count as rejections (Eq. 11 as written)
    unless ``cfg.variant_error_credit`` is false (then they earn no ρ_adv credit, in r_C and V(q)).
    """
    if getattr(cfg, "variant_error_credit", True):
        adv_errors = None
    red = redundancy(valid_sources, cfg.redundancy_similarity)
    gold = gold_pass_rate(z_orig)
    adv = adversarial_rejection_rate(z_adv, adv_mask, adv_errors)
    r_c_valid = evaluation_rewards(z_orig, z_adv, red, cfg.alpha, cfg.beta, cfg.gamma, adv_mask, adv_errors)
    r_c = np.full(num_generated, float(cfg.invalid_verifier_reward))
    r_c[list(valid)] = r_c_valid
    u = uncertainty(answers, cfg.missing_answer_in_majority, cfg.answer_match_timeout_s)
    v = verifier_writability(z_adv, num_generated, adv_mask, adv_errors) if cfg.use_verifiability else 0.0
    r = repetition_penalty(question, history, cfg.repetition_mode, cfg.repetition_bleu_threshold)
    return TaskRewards(
        execution=execution_rewards(z_orig, cfg.execution_reward_no_valid_verifier),
        evaluation=r_c,
        planning=planning_reward(u, v, r, cfg.w_unc, cfg.w_ver, cfg.w_rep),
        gold=gold,
        adv=adv,
        red=red,
        uncertainty=u,
        writability=v,
        repetition=r,
    )
