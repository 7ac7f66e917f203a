"""Trajectory schema (Appendix E.3, I.3): JSON round trip, transcript parsing, rendering."""
from __future__ import annotations

import json
import random

import pytest
from tests.feedback.paper_examples import PAPER_TRAJECTORIES, TRAJ1

from unifiedplayers.feedback.trajectory import (Step, Trajectory, code_step, extract_boxed, format_observation,
                                                output_step, parse_transcript, reason_step, render)

TRANSCRIPT = """We need the number of divisors of 196. Since $196 = 2^2 \\cdot 7^2$, it is $(2+1)(2+1)$.

```python
count = sum(1 for d in range(1, 197) if 196 % d == 0)
print(count)
```

```output
9
```

Both agree, so the answer is \\boxed{9}.
"""


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_json_round_trip(n):
    t = PAPER_TRAJECTORIES[n]
    assert Trajectory.from_dict(t.to_dict()) == t
    assert Trajectory.from_json(t.to_json()) == t
    d = json.loads(t.to_json())
    # Every step carries every field (None where unused), so s.result on a reason step reads None.
    assert d["steps"][0] == {"type": "reason", "text": t.steps[0].text, "code": None, "lang": None, "result": None}
    assert d["steps"][1]["lang"] == "python" and d["final_answer"] == t.final_answer


def test_json_round_trip_without_answer_and_unicode():
    t = Trajectory("Wie viele Teiler hat 196? ≥ 1", [reason_step("ünïcode ✓")], None)
    assert Trajectory.from_json(t.to_json()) == t


def test_step_validation():
    with pytest.raises(ValueError):
        Step(type="tool")
    with pytest.raises(ValueError):
        Step(type="output")  # an output step needs its result
    assert code_step("print(1)").lang == "python"


def test_parse_transcript_steps_and_answer():
    t = parse_transcript("How many divisors does 196 have?", TRANSCRIPT)
    assert [s.type for s in t.steps] == ["reason", "code", "output", "reason"]
    assert t.steps[1].code == "count = sum(1 for d in range(1, 197) if 196 % d == 0)\nprint(count)"
    assert t.steps[1].lang == "python"
    assert t.steps[2].result == "9"
    assert t.steps[3].text == "Both agree, so the answer is \\boxed{9}."
    assert t.final_answer == "9"


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{\\frac{5}{2}}.", "\\frac{5}{2}"),
        ("so \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("first \\boxed{3} then corrected: \\boxed{ 4 }", "4"),  # the last box wins, stripped
        ("\\boxed{(7,3)} and a broken \\boxed{5", "(7,3)"),  # an unbalanced box is no answer
        ("\\fbox{12}", "12"),
        ("no answer here", None),
    ],
)
def test_boxed_with_nested_braces(text, answer):
    assert extract_boxed(text) == answer
    assert parse_transcript("q", text).final_answer == answer


def test_boxes_in_code_or_output_are_not_answers():
    text = "Let me print it.\n```python\nprint('\\\\boxed{1}')\n```\n```output\n\\boxed{1}\n```\nDone, no answer yet."
    t = parse_transcript("q", text)
    assert t.final_answer is None
    assert [s.type for s in t.steps] == ["reason", "code", "output", "reason"]


@pytest.mark.parametrize("tail", ["Final answer: $\\boxed{9}$.", "**Final Answer:** \\boxed{9}", "\\boxed{9}"])
def test_answer_only_tail_is_not_a_step(tail):
    text = "Reason.\n```python\nprint(9)\n```\n```output\n9\n```\n" + tail
    t = parse_transcript("q", text)
    assert [s.type for s in t.steps] == ["reason", "code", "output"]
    assert t.final_answer == "9"
    kept = parse_transcript("q", text.replace(tail, "So it is \\boxed{9}."))
    assert kept.steps[-1].text == "So it is \\boxed{9}."


def test_unlabelled_fences_and_other_languages():
    text = "```\nprint(3)\n```\n```\n3\n```\n```bash\necho hi\n```\n```\nprint(4)\n```\n\\boxed{3}"
    t = parse_transcript("q", text)
    # unlabelled after a code step without output -> output; otherwise -> python code
    assert [(s.type, s.lang) for s in t.steps] == [
        ("code", "python"), ("output", None), ("code", "bash"), ("output", None)
    ]
    assert t.steps[3].result == "print(4)"  # right after the bash code step, so it is read as its output


def test_unterminated_fence_runs_to_end():
    t = parse_transcript("q", "Try this:\n```python\nfor i in range(3):\n    print(i)")
    assert [s.type for s in t.steps] == ["reason", "code"]
    assert t.steps[1].code == "for i in range(3):\n    print(i)"
    assert t.final_answer is None


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_render_then_parse_is_identity(n):
    t = PAPER_TRAJECTORIES[n]
    text = render(t)
    assert text.endswith(f"\\boxed{{{t.final_answer}}}")
    assert "```python\n" in text and "```output\n" in text
    assert parse_transcript(t.question, text) == t


def test_parse_then_render_is_identity_for_a_transcript():
    t = parse_transcript("q", TRANSCRIPT)
    # The last reasoning step already states the boxed answer, so no answer line is appended.
    assert render(t) == TRANSCRIPT.strip()
    assert parse_transcript("q", render(t)) == t
    assert render(t, include_question=True).startswith("Question: q\n\n")


def test_render_appends_a_changed_answer():
    t = parse_transcript("q", TRANSCRIPT)
    t.final_answer = "8"  # e.g. early_terminate fabricated a new answer
    assert render(t).endswith("\\boxed{8}")
    assert parse_transcript("q", render(t)).final_answer == "8"


def test_parsing_junk_never_raises():
    rng = random.Random(0)
    pieces = ["```", "```python", "```output", "\n", "\\boxed{", "}", "{", "text", " ", "\\", "$", "print(1)"]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        t = parse_transcript("q", text)
        assert all(s.type in ("reason", "code", "output") for s in t.steps)
        assert t.final_answer is None or isinstance(t.final_answer, str)
        Trajectory.from_json(t.to_json())


def test_many_unbalanced_boxes_parse_in_linear_time():
    import time

    text = "\\boxed{" * 20000 + " and finally \\boxed{7}"
    t0 = time.perf_counter()
    assert parse_transcript("q", text).final_answer == "7"
    assert time.perf_counter() - t0 < 2.0  # a rescan per box would be 20000² steps


def test_a_failed_generation_is_an_empty_trajectory():
    assert parse_transcript("q", None) == Trajectory("q", [], None)
    assert parse_transcript("q", "") == Trajectory("q", [], None)


def test_format_observation():
    assert format_observation("9\n") == "9"
    assert format_observation("", "Traceback...\nZeroDivisionError: division by zero\n", 1) == (
        "[stderr]\nTraceback...\nZeroDivisionError: division by zero\n[exit status 1]"
    )
    assert format_observation("1\n2\n", "", -9, timed_out=True) == "1\n2\n[timed out]"
    assert format_observation("", "", -9, memory_exceeded=True) == "[memory limit exceeded]"


def test_copy_is_deep():
    c = TRAJ1.copy()
    c.steps[1].code = "print(8)"
    c.steps.append(output_step("x"))
    assert TRAJ1.steps[1].code.startswith("count") and len(TRAJ1.steps) == 3
