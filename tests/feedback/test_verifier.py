"""Verifiers: static validity, the sandbox prelude, and what counts as an acceptance."""
from __future__ import annotations

import pytest
from tests.feedback.paper_examples import TRAJ1, VERIFIER_1_1, VERIFIER_1_2, VERIFIER_1_3, fenced

from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step
from unifiedplayers.feedback.verifier import ENTRY_POINT, compile_verifier, extract_python_block, outcome_of, sandbox_source

# ---- validity, decided without running ----------------------------------------------------------------


def test_last_fenced_python_block_is_the_verifier():
    text = (
        "Draft:\n```python\ndef check(t):\n    return False\n```\n"
        "Better:\n```python\ndef check(t):\n    return True\n```\n"
        "Example output:\n```output\nTrue\n```\n```bash\necho done\n```\n"
    )
    assert extract_python_block(text) == "def check(t):\n    return True\n"
    c = compile_verifier(text)
    assert c.valid and c.reason == "ok" and "return True" in c.source


@pytest.mark.parametrize(
    "text, reason",
    [
        ("I cannot write a verifier.\n```text\nsorry\n```", "no python code block"),
        (fenced("def check(t)\n    return True"), "does not compile"),
        (fenced("def verify(t):\n    return True"), "defines no top-level check"),
        (fenced("class A:\n    def check(self, t):\n        return True"), "defines no top-level check"),
        (fenced("async def check(t):\n    return True"), "coroutine"),
        (fenced("check = 3"), "something other than a function"),
        (fenced("def check():\n    return True"), "one argument"),
        (fenced("def check(t, u):\n    return True"), "one argument"),
        (fenced("def check(t, *, strict):\n    return True"), "one argument"),
        (fenced("x = 1\0"), "does not compile"),
        ("", "no python code block"),
        (fenced("def check(t):\n    return True\n"
                "def __unifiedplayers_verdict__(p):\n    return {'accepted': True}"), "reserved"),
    ],
)
def test_invalid_verifiers(text, reason):
    c = compile_verifier(text)
    assert not c.valid and reason in c.reason


@pytest.mark.parametrize(
    "source",
    [
        "def check(trajectory):\n    return True",
        "def check(t, strict=True):\n    return True",
        "def check(*args):\n    return True",
        "check = lambda t: True",
        "def check(t):\n    return False\ndef check(t):\n    return True",
        "def verify(t):\n    return True\ncheck = verify",
    ],
)
def test_valid_verifiers(source):
    assert compile_verifier(fenced(source)).valid
    assert compile_verifier(source).valid  # bare code without any fence is taken whole


def test_a_cut_off_final_block_runs_to_the_end():
    text = "Draft:\n```python\ndef check(t):\n    return 1\n```\nFinal:\n```python\ndef check(t):\n    return True\n"
    assert extract_python_block(text) == "def check(t):\n    return True\n"
    assert compile_verifier(text).valid
    assert not compile_verifier("```python\ndef check(t):\n    return (True").valid  # cut mid-expression


def test_a_missing_output_is_an_invalid_verifier():
    c = compile_verifier(None)
    assert not c.valid and c.source is None and "not text" in c.reason


def test_validity_does_not_run_the_code(tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\nwhile True:\n    pass\ndef check(t):\n    return True\n"
    c = compile_verifier(fenced(source))
    assert c.valid and not marker.exists()


# ---- the paper's checks through the real sandbox ----------------------------------------------------


def call(sandbox, source, traj):
    return outcome_of(sandbox.call(sandbox_source(source), ENTRY_POINT, traj.to_dict()))


def test_verifier_1_2_accepts_output_and_answer_both_8(sandbox):
    # Appendix I.3: "Verifier 1.2 ... accepts an incorrect value when both are 8 rather than 9".
    wrong = Trajectory(
        TRAJ1.question,
        [reason_step("Count the divisors."), code_step("print(8)"), output_step("8\n")],
        "8",
    )
    o = call(sandbox, VERIFIER_1_2, wrong)
    assert o.accepted and o.kind == "accepted"
    mismatch = Trajectory(TRAJ1.question, wrong.steps, "9")
    o = call(sandbox, VERIFIER_1_2, mismatch)
    assert not o.accepted and o.kind == "rejected" and "mismatch" in o.reason


def test_verifier_1_1_rejects_early_terminate_of_trajectory_1(sandbox):
    assert call(sandbox, VERIFIER_1_1, TRAJ1).accepted
    (variant,) = PerturbationEngine(["early_terminate"], seed=0).perturb(TRAJ1)
    assert variant.final_answer in {"8", "10", "0"}
    o = call(sandbox, VERIFIER_1_1, variant)
    assert not o.accepted and o.kind == "rejected" and "wrong count: expected 9" in o.reason


def test_verifier_1_3_prime_factorisation(sandbox):
    assert call(sandbox, VERIFIER_1_3, TRAJ1).accepted
    assert not call(sandbox, VERIFIER_1_3, Trajectory(TRAJ1.question, TRAJ1.steps, "10")).accepted


def test_schema_inside_the_sandbox(sandbox):
    source = '''
def check(trajectory):
    s0, s1, s2 = trajectory.steps
    assert trajectory.question.startswith("How many")
    assert (s0.type, s1.type, s2.type) == ("reason", "code", "output")
    assert s1.lang == "python" and "range(1, 197)" in s1.code and s0.text.startswith("196")
    assert s0.result is None and s2.result == "9"
    assert trajectory["steps"][2]["result"] == s2.get("result") == "9"
    return int(trajectory.final_answer) == 9, None
'''
    o = call(sandbox, source, TRAJ1)
    assert o.accepted, o.reason


# ---- what accepts, what rejects ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "ret, accepted, kind",
    [
        ("True", True, "accepted"),
        ("(True, None)", True, "accepted"),
        ("(True,)", True, "accepted"),
        ("(True, 'fine', 3)", True, "accepted"),
        ("False", False, "rejected"),
        ("(False, 2)", False, "rejected"),
        ("1", False, "bad_return"),
        ("'True'", False, "bad_return"),
        ("[True, None]", False, "bad_return"),
        ("None", False, "bad_return"),
        ("(1, None)", False, "bad_return"),
        ("()", False, "bad_return"),
        ("object()", False, "bad_return"),
    ],
)
def test_only_true_or_true_tuple_accepts(sandbox, ret, accepted, kind):
    o = call(sandbox, f"def check(t):\n    return {ret}\n", TRAJ1)
    assert (o.accepted, o.kind) == (accepted, kind), o.reason


def test_fail_step_is_recorded(sandbox):
    o = call(sandbox, "def check(t):\n    return (False, 2)\n", TRAJ1)
    assert o.fail_step == 2 and "(False, 2)" in o.reason


def test_shadowing_builtins_does_not_fake_an_acceptance(sandbox):
    source = "type = lambda x: tuple\nlen = lambda x: 1\ndef check(t):\n    return [True]\n"
    o = call(sandbox, source, TRAJ1)
    assert not o.accepted


def test_hostile_verifiers_are_rejections_and_the_batch_goes_on(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("42")
    sources = {
        "loops": "def check(t):\n    while True:\n        pass\n",
        "raises": "def check(t):\n    raise ValueError('cannot decide')\n",
        "string": "def check(t):\n    return 'True'\n",
        "reads_tmp": f"def check(t):\n    return open({str(secret)!r}).read() == '42'\n",
        "reads_etc": "def check(t):\n    open('/etc/hostname').read()\n    return True\n",
        "imports_numpy": "import numpy\ndef check(t):\n    return True\n",
        "good": VERIFIER_1_1,
    }
    calls = [(sandbox_source(s), ENTRY_POINT, TRAJ1.to_dict()) for s in sources.values()]
    outcomes = dict(zip(sources, map(outcome_of, sandbox.call_many(calls))))
    assert outcomes["good"].accepted
    assert all(not o.accepted for name, o in outcomes.items() if name != "good")
    assert outcomes["loops"].kind == "timeout" and "timed out" in outcomes["loops"].reason
    assert outcomes["raises"].kind == "raised" and "ValueError" in outcomes["raises"].reason
    assert outcomes["string"].kind == "bad_return" and "str" in outcomes["string"].reason
    assert outcomes["reads_tmp"].kind == "raised"
    assert outcomes["reads_etc"].kind == "raised"
    assert outcomes["imports_numpy"].kind == "raised" and "numpy" in outcomes["imports_numpy"].reason
