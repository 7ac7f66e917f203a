"""A worked extension: a perturbation rule defined outside the package, in one Python file and one YAML.

``given_quantity`` (global) answers the question with one of the quantities the question itself gives: in "Tom
has 3 apples and buys 4 more. How many apples does he have?" the answer 7 becomes 3 or 4. Copying a number from
the problem statement is a common way to get a word problem wrong, and the variant is hard to tell by its form:
every step of the trajectory is kept, and only the box that states the final answer changes (a trajectory that
states no answer gets the sentence "So the answer is \\boxed{3}." on its last reasoning step, as the tool loop's
trajectories end). A verifier that recomputes the answer from the question rejects it; one that checks only that
a number is boxed, or that the answer appears somewhere in the task, accepts it.

How it differs from the five built-in rules (Appendix F.1): early_terminate also fabricates a final answer, but it
cuts the trajectory first and draws the answer from the answer's own neighbours (off by one, rounded, ±10 %,
zero); arg_mutation changes a literal of the code and re-runs it. This rule cuts nothing, runs nothing, and its
distractor is a number the task states. Where the question gives no number other than the answer, the rule
cannot apply (None: the variant is masked out of ρ_adv).

Train with it beside the five rules (from the repository root)::

    PYTHONPATH=examples/custom_rule python -m unifiedplayers.train experiment=tiny \\
      perturbation=with_given_quantity hydra.searchpath=[file://examples/custom_rule/conf] run_dir=runs/given_quantity
"""
from __future__ import annotations

import random
import re
from decimal import Decimal, InvalidOperation
from typing import Optional

from unifiedplayers.feedback.perturbation import RuleParams, register_rule
from unifiedplayers.feedback.trajectory import Trajectory, extract_boxed, state_answer

# A number of the question: 12, 2.5, 1,000 (not a piece of a longer number).
_NUMBER = re.compile(r"(?<![\d.,])(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\d])")


def _value(text: Optional[str]) -> Optional[Decimal]:
    try:
        return Decimal((text or "").strip().strip("$").replace(",", ""))
    except InvalidOperation:
        return None


def given_quantities(question: str, answer: Optional[str]) -> list[str]:
    """The numbers ``question`` gives, in order, without repeats and without any equal in value to ``answer``."""
    answer_value = _value(answer)
    out, seen = [], set()
    for text in _NUMBER.findall(question):
        value = _value(text)
        if value in seen or (answer_value is not None and value == answer_value) or text == answer:
            continue
        seen.add(value)
        out.append(text)
    return out


@register_rule("given_quantity", scope="global", abbrev="given")
def given_quantity(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Global: the final answer becomes a quantity the question gives, drawn uniformly; every step is kept."""
    candidates = given_quantities(traj.question, traj.final_answer)
    if not candidates:
        return None
    new = rng.choice(candidates)
    out = traj.copy()
    if traj.final_answer is not None:  # restate it where the trajectory boxed it: its last step that does
        box = f"\\boxed{{{traj.final_answer}}}"
        for step in reversed(out.steps):
            text = step.text or ""
            if step.type == "reason" and extract_boxed(text) == traj.final_answer and box in text:
                cut = text.rindex(box)
                step.text = text[:cut] + f"\\boxed{{{new}}}" + text[cut + len(box):]
                out.final_answer = new
                return out
    state_answer(out, new)  # no step boxes the answer: state one, as a trajectory of the tool loop ends
    return out
