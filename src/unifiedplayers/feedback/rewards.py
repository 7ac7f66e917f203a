"""Role-specific rewards from the verdict matrix (§3.2, Eq. 2-5; Appendix B.1, Eq. 11, 12). Pure numpy.

Shapes: z_orig (M_q, K), z_adv (M_q, K, P), adv_mask (K, P) or None (all variants present).

Choices the paper leaves open (``conf/reward/``, ``RewardConfig``; each explained where it is applied): r_S when
M_q = 0 (:func:`execution_rewards`); ρ_adv over the variants that exist (:func:`adversarial_rejection_rate`);
check errors earn no ρ_adv credit (docs/method.md, "Check errors"); the reward of an invalid verifier or a malformed
task; missing answers in p̂ (:func:`majority_share`); ρ_red on canonical code tokens (:func:`_code_tokens`); R(q)
against the last ``repetition_history`` questions (:func:`repetition_penalty`). U(q)'s answer matching runs in a
guard subprocess with a time limit (:mod:`unifiedplayers.feedback.sympy_guard`).
"""
from __future__ import annotations

import io
import keyword
import logging
import tokenize
from collections import deque
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.feedback.sympy_guard import _GUARD, _math_clusters, _text_clusters

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


def adversarial_rejection_rate(z_adv: np.ndarray, adv_mask: Optional[np.ndarray] = None,
                               adv_errors: Optional[np.ndarray] = None) -> np.ndarray:
    """Eq. 11: ρ_adv_i = (1/(K·P)) Σ_k Σ_j (1 − Z_adv[i, k, j]). Shape (M_q,).

    With a mask, the sum and the count run over the variants that exist; with none, ρ_adv = 0. With ``adv_errors``
    (M_q, K, P) bool, an errored check stays in the count but earns no credit: the sum runs over (1 − Z_adv − E_adv).
    """
    z = np.asarray(z_adv, dtype=np.float64)
    if z.ndim != 3:
        raise ValueError(f"z_adv must be (M_q, K, P), got shape {z.shape}")
    k, p = z.shape[1:]
    mask = np.ones((k, p), dtype=bool) if adv_mask is None else np.asarray(adv_mask, dtype=bool)
    if mask.shape != (k, p):
        raise ValueError(f"adv_mask must be (K, P) = {(k, p)}, got {mask.shape}")
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
    """ρ_red_i = max_{i' ≠ i} sim(v_i, v_i') over the valid verifiers of one task; 0 for a lone one. Shape (M_q,)."""
    m = len(sources)
    sim = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            sim[i, j] = sim[j, i] = code_similarity(sources[i], sources[j], method)
    return sim.max(axis=1) if m > 1 else np.zeros(m)


def evaluation_rewards(gold: np.ndarray, adv: np.ndarray, red: np.ndarray, alpha: float, beta: float,
                       gamma: float) -> np.ndarray:
    """Eq. 5: r_C(v_i) = α ρ_gold_i + β ρ_adv_i − γ ρ_red_i, from the terms of the valid verifiers. Shape (M_q,)."""
    gold, adv, red = (np.asarray(x, dtype=np.float64) for x in (gold, adv, red))
    return alpha * gold + beta * adv - gamma * red


def per_generated(per_valid: Sequence[float], valid: Sequence[int], num_generated: int, fill: float) -> np.ndarray:
    """One value per valid verifier (M_q,), as Z's rows, gold, adv and red hold them, spread over the M generated
    verifiers: entry ``valid[i]`` gets ``per_valid[i]``, every invalid verifier ``fill``. Shape (M,)."""
    if len(per_valid) != len(valid):
        raise ValueError(f"{len(per_valid)} values for {len(valid)} valid verifiers")
    out = np.full(num_generated, float(fill))
    out[list(valid)] = per_valid
    return out


# ---------------------------------------------------------------------------------------------------
# Planning


def answer_clusters(answers: Sequence[Optional[str]], timeout_s: Optional[float] = 10.0) -> list[list[int]]:
    """Group the indices of equivalent answers (math-verify: 5/2 ≡ 2.5 ≡ \\frac{5}{2}), missing ones left out; each
    joins the first cluster whose first member it matches. Runs in a guard process killed after ``timeout_s`` s of
    its CPU time (then grouped by text, with a warning), so U(q) never depends on the machine's load;
    ``timeout_s=None`` runs in this process, for trusted input only."""
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


def majority_share(answers: Sequence[Optional[str]], missing_in_majority: bool = False,
                   timeout_s: Optional[float] = 10.0) -> float:
    """p̂: share of the K samples that give the most frequent answer (K counts missing answers too, which form one
    cluster only with ``missing_in_majority``)."""
    k = len(answers)
    if k == 0:
        return 0.0
    sizes = [len(c) for c in answer_clusters(answers, timeout_s)]
    if missing_in_majority:
        sizes.append(sum(1 for a in answers if a is None or not a.strip()))
    return max(sizes, default=0) / k


def uncertainty(answers: Sequence[Optional[str]], missing_in_majority: bool = False,
                timeout_s: Optional[float] = 10.0) -> float:
    """U(q) = min(p̂, 1 − p̂) (§3.2, below Eq. 2). ``timeout_s``: see :func:`answer_clusters`."""
    p_hat = majority_share(answers, missing_in_majority, timeout_s)
    return float(min(p_hat, 1.0 - p_hat))


def verifier_writability(adv: np.ndarray, num_generated: int) -> float:
    """Eq. 3 / 12: V(q) = (M_q/M)·(1/M_q) Σ_{i ∈ I_valid} ρ_adv_i = (1/M) Σ_{i ∈ I_valid} ρ_adv_i, from ρ_adv (M_q,);
    0 when M_q = 0 or M = 0."""
    adv = np.asarray(adv, dtype=np.float64)
    if num_generated <= 0 or adv.size == 0:
        return 0.0
    if adv.size > num_generated:
        raise ValueError(f"{adv.size} valid verifiers out of {num_generated} generated")
    return float(adv.sum() / num_generated)


def repetition_penalty(question: str, history: Sequence[str], mode: str = "max_bleu", threshold: float = 0.5) -> float:
    """R(q) in [0, 1] against earlier questions (sacrebleu; 0 for an empty history). ``max_bleu``: max over the
    history of sentence-BLEU(q, h)/100; ``cluster_share``: share of the history at or above ``threshold`` (R-Zero)."""
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
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        self._q = deque(questions, maxlen=maxlen)

    def extend(self, questions: Sequence[str]) -> None:
        self._q.extend(questions)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)


def planning_reward(u: float, v: float, r: float, w_unc: float, w_ver: float, w_rep: float) -> float:
    """Eq. 2: r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q)."""
    return float(w_unc * u + w_ver * v - w_rep * r)


# ---------------------------------------------------------------------------------------------------
# All three rewards of one task from its record, with the open choices of the config


@dataclass
class TaskRewards:
    """The rewards of one task: execution (K,), evaluation (M,) over ALL generated verifiers, planning (scalar), and
    the terms behind them; gold, adv and red have one entry per VALID verifier (M_q,)."""

    execution: np.ndarray
    evaluation: np.ndarray
    planning: float
    gold: np.ndarray
    adv: np.ndarray
    red: np.ndarray
    uncertainty: float
    writability: float
    repetition: float


def task_rewards(z_orig: np.ndarray, z_adv: np.ndarray, valid: Sequence[int], num_generated: int,
                 valid_sources: Sequence[str], answers: Sequence[Optional[str]], question: str,
                 history: Sequence[str], cfg: Any, adv_mask: Optional[np.ndarray] = None,
                 adv_errors: Optional[np.ndarray] = None) -> TaskRewards:
    """Eq. 2, 4, 5 for one task; ``cfg`` is a ``RewardConfig``. ``adv_errors`` (``VerdictMatrix.error_adv``) earn no
    ρ_adv credit unless ``cfg.variant_error_credit`` (the "errors credited" ablation: they count as rejections)."""
    if getattr(cfg, "variant_error_credit", False):
        adv_errors = None
    gold = gold_pass_rate(z_orig)
    adv = adversarial_rejection_rate(z_adv, adv_mask, adv_errors)
    red = redundancy(valid_sources, cfg.redundancy_similarity)
    r_c = evaluation_rewards(gold, adv, red, cfg.alpha, cfg.beta, cfg.gamma)
    u = uncertainty(answers, cfg.missing_answer_in_majority, cfg.answer_match_timeout_s)
    v = verifier_writability(adv, num_generated) if cfg.use_verifiability else 0.0
    r = repetition_penalty(question, history, cfg.repetition_mode, cfg.repetition_bleu_threshold)
    return TaskRewards(execution=execution_rewards(z_orig, cfg.execution_reward_no_valid_verifier),
                       evaluation=per_generated(r_c, valid, num_generated, cfg.invalid_verifier_reward),
                       planning=planning_reward(u, v, r, cfg.w_unc, cfg.w_ver, cfg.w_rep), gold=gold, adv=adv, red=red,
                       uncertainty=u, writability=v, repetition=r)
