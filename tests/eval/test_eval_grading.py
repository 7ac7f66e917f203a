"""Grading and extraction cases worked out by hand."""
import pytest

from eval.extract import humaneval_program
from unifiedplayers.feedback.answers import extract_option_letter, last_boxed
from unifiedplayers.feedback.answers import grade, grade_math, grade_option, grade_string
from unifiedplayers.feedback.answers import extract_answer
from unifiedplayers.feedback.trajectory import parse_transcript

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(
    "prediction, reference, expected",
    [
        # equivalent fractions and decimals
        ("0.5", r"\frac{1}{2}", True),
        ("1/2", r"\frac12", True),
        (r"\frac{6}{8}", "0.75", True),
        (r"\dfrac{3}{2}", "1.5", True),
        ("0.33", r"\frac{1}{3}", False),  # 1/3 = 0.333..., not 0.33
        ("18.0", "18", True),
        ("17", "18", False),
        (r"2\sqrt{2}", r"\sqrt{8}", True),
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
        # intervals: endpoints and brackets both matter
        ("[1,3)", "[1, 3)", True),
        ("(1,3]", "[1,3)", False),
        (r"(-\infty, 2]", r"(-\infty,2]", True),
        (r"(-\infty, 2)", r"(-\infty,2]", False),
        # malformed or missing predictions are wrong, never an exception
        (None, "5", False),
        ("", "5", False),
        ("x" * 5000, "5", False),
    ],
)
def test_grade_math(prediction, reference, expected):
    assert grade_math(prediction, reference) is expected


@pytest.mark.parametrize(
    "text, n, expected",
    [
        (r"So the answer is \boxed{C}.", 4, "C"),
        (r"\boxed{\text{(B)}}", 4, "B"),
        ("The answer is (D).", 4, "D"),
        ("Answer: J", 10, "J"),
        ("Answer: J", 4, None),  # J is not an option of a 4-option question
        ("A looks wrong, B too.\nThe answer is: **C**", 4, "C"),
        ("I pick\n(A)", 4, "A"),
        ("no letter here", 4, None),
        ("The answer is a tricky one.", 4, None),  # the article "a" is not option A
        ("The answer is a tricky one. Answer: (B)", 4, "B"),
    ],
)
def test_extract_option_letter(text, n, expected):
    assert extract_option_letter(text, n) == expected


def test_option_grading_is_exact_letter():
    assert grade_option("c", "C")
    assert not grade_option("B", "C")
    assert not grade_option(None, "C")
    assert grade("option", "A", "A")


def test_string_grading():
    assert grade_string(" 'Yes'. ", "yes")
    assert grade_string("(A)", "a")
    assert grade_string("3.0", "3")
    assert not grade_string("valid", "invalid")
    with pytest.raises(ValueError):
        grade("program", "x", "y")


def test_boxed_nested_and_unclosed():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{\sqrt{2}}}") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed(r"\boxed{\frac{1}{2}") is None
    assert last_boxed("no answer") is None


def test_humaneval_program_from_block_and_from_body():
    prompt = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'
    block = "Here:\n```python\ndef f(xs):\n    return sum(xs)\n```\nDone."
    prog = humaneval_program(prompt, block, "f")
    assert "from typing import List" in prog and "return sum(xs)" in prog and "Done" not in prog
    two = "```python\ndef f(xs):\n    return 0\n```\n```output\n\n```\nFixed:\n```python\ndef f(xs):\n    return sum(xs)\n```"
    assert "return sum(xs)" in humaneval_program(prompt, two, "f") and "return 0" not in humaneval_program(prompt, two, "f")
    body = "    return sum(xs)\n\nprint('junk at top level')\n"
    prog = humaneval_program(prompt, body, "f")
    assert prog.startswith(prompt) and "return sum(xs)" in prog and "junk" not in prog


# ---- tool mode: the trajectory's own final answer (issue: evaluation and training extract alike) ------

PRINTS_BOX = "Let me compute.\n```python\nprint(r'\\boxed{5}')\n```\n```output\n\\boxed{5}\n```\nDone."
BOX_THEN_CODE = ("So the answer is \\boxed{18}.\n```python\nprint(r'\\boxed{3}')\n```\n"
                 "```output\n\\boxed{3}\n```")
PRINTS_LETTER = "```python\nprint('The answer is (C)')\n```\n```output\nThe answer is (C)\n```\n"


def test_tool_mode_reads_the_final_answer_as_training_parses_it():
    # the only box is printed by the program: training parses no answer, and tool mode grades none
    assert parse_transcript("q", PRINTS_BOX).final_answer is None
    assert extract_answer("math", PRINTS_BOX, tool=True) is None
    assert extract_answer("math", PRINTS_BOX) == "5"  # vanilla reads the whole text (it has no code)
    # the reasoning boxes 18, a later program prints \boxed{3}: graded on 18, the trajectory's answer
    assert parse_transcript("q", BOX_THEN_CODE).final_answer == "18"
    assert extract_answer("math", BOX_THEN_CODE, tool=True) == "18"
    assert extract_answer("math", BOX_THEN_CODE) == "3"
    # option and string fallbacks read the reasoning only, never the program's output
    assert extract_answer("option", PRINTS_LETTER, 4, tool=True) is None
    assert extract_answer("option", PRINTS_LETTER, 4) == "C"
    assert extract_answer("option", PRINTS_LETTER + "So the answer is (B).", 4, tool=True) == "B"
    assert extract_answer("string", PRINTS_BOX, tool=True) == "Done."  # the last line of the reasoning
    assert extract_answer("string", BOX_THEN_CODE, tool=True) == "18"
    with pytest.raises(ValueError):
        extract_answer("program", "x")


def test_the_grading_timeout_counts_cpu_time_not_wall_clock():
    """A grade's budget is this process's CPU time: a CPU-bound grade is cut off, a wait of the same wall length
    (as a starved process on a loaded machine would see) is not."""
    import time

    from unifiedplayers.feedback import answers as grading

    with grading._alarm(0.2):
        time.sleep(0.4)  # 0.4 s of wall clock, next to no CPU: no timeout
    t0 = time.process_time()
    with pytest.raises(grading._GradeTimeout):
        with grading._alarm(0.2):
            while time.process_time() - t0 < 5:
                pass
    # The kernel checks ITIMER_PROF at its ticks, against the process's sampled CPU time: on a contended host it
    # fired after 0.144 s by process_time(). The bound still tells a CPU-time alarm from an immediate one.
    assert 0.1 < time.process_time() - t0 < 2


def test_a_runaway_grade_ends_even_where_math_verify_catches_exceptions(monkeypatch):
    """sympy would evaluate 9^(9^(9^9)) for ever, inside math-verify's ``except Exception``: the timeout still
    ends the grade (a miss)."""
    import time

    from unifiedplayers.feedback import answers as grading

    monkeypatch.setattr(grading, "GRADE_TIMEOUT_S", 1)
    t0 = time.process_time()
    assert grading.grade_math("9^{9^{9^{9}}}", "1") is False
    assert time.process_time() - t0 < 10
