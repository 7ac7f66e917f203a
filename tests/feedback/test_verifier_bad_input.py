"""Bad input: a verifier that returns junk, floods its output, sleeps past its limit or returns an
object that raises in ``__eq__``/``__repr__``/... is an error of a named kind (``verifier.ERROR_KINDS``), never a
verdict; none of them can lose a record.

Every hostile verifier runs in ONE task beside an honest companion (``final_answer == '9'``), through the real
sandbox (conftest's: timeout_s=2, so the wall-clock cap is 6 s; all checks of the task are one parallel
``call_many`` batch, so the sleepers cost one cap, not one each), the real verdict matrix and the record the
loop writes (``loop_feedback.feedback_and_record``, then ``RecordWriter`` and ``load_records``).

Each hostile body is run two ways: *partially* (it returns True on the trajectories whose answer is 9 and is
hostile on those whose answer is 8, so it keeps its row in Z and its errors show in the masks) and, for the errors,
*totally* (hostile on every trajectory: invalid at run time, its reason naming the kind).

Decisions this file documents (what the code does):

- only ``True`` or an exact ``tuple`` whose first item ``is True`` accepts, only ``False`` or an exact ``tuple``
  whose first item ``is False`` rejects; a tuple subclass (a namedtuple, a class that calls itself ``tuple``)
  whose first item is False is a ``bad_return``, as one whose first item is True is not an acceptance;
- a rejection stays a rejection when its other items cannot be printed (their ``__repr__`` raises, recurses too
  deep, or is an int past Python's 4300-digit str limit): the prelude decides it, not the printed text; and an
  object whose ``repr`` *reads* ``False``, or a class named ``bool``, is no rejection;
- a flood (stdout or stderr past the sandbox's flood bound, max(64 x max_output_bytes, 4 MiB)) is killed:
  ``raised`` with the sandbox's "output limit exceeded"; printing under that bound is merely truncated, and the
  check's True is an acceptance;
- a sleeper is killed at the wall-clock cap: ``timeout``;
- a generator or a coroutine is a ``bad_return``;
- rebinding builtins (module level or in ``builtins`` itself) or deleting the module's globals changes nothing
  about how the result is read (the prelude captured what it uses);
- a type whose metaclass makes ``__name__`` raise is ``raised`` (the reading of its name raised inside the call);
- reasons are stored as text UTF-8 can hold: a lone surrogate in a ``repr`` or an exception message comes back
  escaped (``\\ud800``), so the record can be written.
"""
from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tests.feedback.loop_feedback import feedback_and_record
from tests.feedback.paper_examples import fenced

from unifiedplayers.diagnostics.records import RecordWriter, load_records
from unifiedplayers.feedback import pipeline
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step
from unifiedplayers.feedback.verdict import verdict_matrix
from unifiedplayers.feedback.verifier import ENTRY_POINT, ERROR_KINDS, outcome_of, sandbox_source

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
Q = "Alice has 4 bags of 2 apples and finds 1 more. How many apples?"
T0 = Trajectory(Q, [reason_step("Count."), code_step("print(4 * 2 + 1)"), output_step("9")], "9")
T1 = Trajectory(Q, [reason_step("Count."), code_step("print(4 * 2)"), output_step("8")], "8")
COMPANION = "def check(trajectory):\n    return trajectory.final_answer == '9'\n"

# An object every protocol method of which raises (the prelude must read a verdict without calling any).
EVIL = '''
class Evil:
    def _no(self, *args):
        raise RuntimeError("hostile")
    __eq__ = __ne__ = __lt__ = __bool__ = __repr__ = __str__ = __format__ = __hash__ = __len__ = _no
    __iter__ = __getitem__ = __index__ = __int__ = __getattr__ = _no
'''
ONLY = " only True or (True, ...) accepts"


@dataclass(frozen=True)
class Case:
    name: str
    body: str  # the check's body on a trajectory whose answer is 8 (indented by 4 here)
    kind: str  # what that check gives
    reason: str  # its exact reason, or its start when ``exact`` is False
    exact: bool = True
    prefix: str = ""  # module-level code before the check
    fail_step: object = None


CASES = [
    # junk tuples
    Case("int_pair", "return (1, 0)", "bad_return", "check returned tuple (1, 0);" + ONLY, fail_step=0),
    Case("str_false_pair", "return ('False', 0)", "bad_return", "check returned tuple ('False', 0);" + ONLY,
         fail_step=0),
    Case("none_single", "return (None,)", "bad_return", "check returned tuple (None,);" + ONLY),
    Case("empty", "return ()", "bad_return", "check returned tuple ();" + ONLY),
    # a tuple subclass is not a tuple verdict, whatever it calls itself
    Case("tuple_subclass_false", "class Verdict(tuple):\n    pass\nreturn Verdict((False, 0))", "bad_return",
         "check returned Verdict (False, 0);" + ONLY),
    Case("tuple_subclass_true", "class Verdict(tuple):\n    pass\nreturn Verdict((True, 0))", "bad_return",
         "check returned Verdict (True, 0);" + ONLY),
    Case("namedtuple_false", "import collections\nreturn collections.namedtuple('V', 'ok step')(False, 0)",
         "bad_return", "check returned V V(ok=False, step=0);" + ONLY),
    Case("subclass_named_tuple", "class tuple(().__class__):\n    pass\nreturn tuple((False, 0))", "bad_return",
         "check returned tuple (False, 0);" + ONLY),
    # objects that raise in every protocol method, returned directly and inside a tuple
    Case("evil", "return Evil()", "bad_return", "check returned Evil <unprintable>;" + ONLY),
    Case("evil_first", "return (Evil(), 0)", "bad_return", "check returned tuple <unprintable>;" + ONLY, fail_step=0),
    Case("false_evil", "return (False, Evil())", "rejected", "check returned <unprintable>"),
    Case("true_evil", "return (True, Evil())", "accepted", "accepted"),
    # what reads like a rejection but is none
    Case("repr_reads_false", "class F:\n    def __repr__(self):\n        return 'False'\nreturn (F(),)", "bad_return",
         "check returned tuple (False,);" + ONLY),
    Case("class_named_bool", "class bool:\n    pass\nreturn bool()", "bad_return", "check returned bool <",
         exact=False),
    Case("metaclass_name_bool", "class M(type):\n    __name__ = 'bool'\nclass X(metaclass=M):\n    pass\nreturn X()",
         "bad_return", "check returned bool <", exact=False),
    Case("metaclass_name_raises", "class M(type):\n    @property\n    def __name__(cls):\n"
         "        raise LookupError('no name')\nclass X(metaclass=M):\n    pass\nreturn X()",
         "raised", "check failed: LookupError: no name"),
    # rejections and acceptances whose other items cannot be printed or serialised
    Case("false_bigint", "return (False, 10 ** 5000)", "rejected", "check returned <unprintable>"),
    Case("true_bigint", "return (True, 10 ** 5000)", "accepted", "accepted"),
    Case("false_deep", "x = []\nfor _ in range(100000):\n    x = [x]\nreturn (False, x)", "rejected",
         "check returned <unprintable>"),
    # text UTF-8 cannot hold (a lone surrogate) in what the record keeps
    Case("surrogate_repr", "class S:\n    def __repr__(self):\n        return '\\ud800'\nreturn S()", "bad_return",
         "check returned S \\ud800;" + ONLY),
    Case("surrogate_raise", "raise ValueError('\\ud800')", "raised", "check failed: ValueError: \\ud800"),
    Case("false_surrogate", "class S:\n    def __repr__(self):\n        return '\\ud800'\nreturn (False, S())",
         "rejected", "check returned (False, \\ud800)"),
    # floods, past the flood bound (killed) and under it (truncated)
    Case("flood_stdout", "for _ in range(50):\n    print('x' * (1 << 20))\nreturn True", "raised",
         "check failed: output limit exceeded; the call was killed"),
    Case("flood_stderr", "import sys\nfor _ in range(50):\n    sys.stderr.write('x' * (1 << 20))\nreturn True",
         "raised", "check failed: output limit exceeded; the call was killed", exact=False),
    Case("prints_1mb", "print('y' * (1 << 20))\nreturn True", "accepted", "accepted"),
    # past the limit
    Case("sleeps", "import time\ntime.sleep(60)\nreturn True", "timeout", "check timed out"),
    # not a value at all
    Case("generator", "return (x for x in [True])", "bad_return", "check returned generator <generator object ",
         exact=False),
    Case("generator_function", "return _gen(trajectory)", "bad_return", "check returned generator <generator object ",
         exact=False, prefix="def _gen(trajectory):\n    yield True\n"),
    Case("coroutine", "async def inner():\n    return True\nreturn inner()", "bad_return",
         "check returned coroutine <coroutine object ", exact=False),
    # builtins rebound at module level, in builtins itself; globals deleted
    Case("module_rebinds_builtins", "return [True]", "bad_return", "check returned list [True];" + ONLY,
         prefix="type = lambda x: tuple\ntuple = list\nlen = lambda x: 1\nrepr = lambda x: '(True'\n"
                "isinstance = lambda *a: True\n"),
    Case("module_rebinds_builtins_true", "return True", "accepted", "accepted",
         prefix="type = lambda x: tuple\ntuple = list\nlen = lambda x: 1\n"),
    Case("patches_builtins", "import builtins\nbuiltins.type = lambda *a: tuple\nbuiltins.tuple = list\n"
         "builtins.len = lambda x: 1\nbuiltins.repr = lambda x: '(False'\nreturn [True]", "bad_return",
         "check returned list [True];" + ONLY),
    Case("patches_builtins_rejects", "import builtins\nbuiltins.type = lambda *a: list\nbuiltins.len = lambda x: 0\n"
         "builtins.repr = lambda x: 'True'\nreturn (False, 2)", "rejected", "check returned (False, 2)", fail_step=2),
    Case("deletes_globals", "g = globals()\nfor k in list(g):\n    if k != '__builtins__':\n        del g[k]\n"
         "return [True]", "bad_return", "check returned list [True];" + ONLY),
    Case("deletes_globals_true", "g = globals()\nfor k in list(g):\n    if k != '__builtins__':\n        del g[k]\n"
         "return True", "accepted", "accepted"),
    # a plain rejection with a reason and no step
    Case("false_x", "return (False, 'x')", "rejected", "check returned (False, 'x')"),
]
# Hostile on every trajectory too (no sleeper: one cap of wall clock is enough for this file).
TOTAL = [c for c in CASES if c.kind in ERROR_KINDS and c.kind != "timeout"]


def partial(case: Case) -> str:
    return (EVIL + case.prefix + "\ndef check(trajectory):\n"
            "    if trajectory.final_answer != '8':\n        return True\n" + textwrap.indent(case.body, "    ") + "\n")


def total(case: Case) -> str:
    return EVIL + case.prefix + "\ndef check(trajectory):\n" + textwrap.indent(case.body, "    ") + "\n"


def _reward_cfg():
    from hydra import compose, initialize_config_dir

    from unifiedplayers.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("config", overrides=["reward=default"]).reward


@pytest.fixture(scope="module")
def task(sandbox, tmp_path_factory):
    """One task: the companion (verifier 0), every case partially (1..n), the errors totally (n+1..), its
    verdict matrix (captured from the pipeline), the record and the record read back."""
    sources = [COMPANION] + [partial(c) for c in CASES] + [total(c) for c in TOTAL]
    engine = PerturbationEngine(["tool_substitute"], seed=0)  # P = 1: the python step becomes bash
    captured = []

    def capture(*args, **kwargs):
        captured.append(verdict_matrix(*args, **kwargs))
        return captured[-1]

    restarts = sandbox.restarts
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "verdict_matrix", capture)
        record, terms = feedback_and_record(Q, [T0, T1], [fenced(s) for s in sources], engine, sandbox, _reward_cfg(),
                                            task_id="bad-input", iteration=0)
    elapsed = time.perf_counter() - t0
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    with RecordWriter(path) as w:
        w.append(record)
    (back,) = load_records(path)
    (vm,) = captured
    return {"vm": vm, "record": record, "back": back, "terms": terms, "sources": sources, "elapsed": elapsed,
            "restarts": sandbox.restarts - restarts, "path": path}


def _outcomes(vm, verifier):
    """{(trajectory, variant): outcome} of one verifier's checks."""
    return {(c.trajectory, c.variant): c.outcome for c in vm.checks if c.verifier == verifier}


def _expect(case, outcome):
    assert outcome.kind == case.kind, (case.name, outcome.kind, outcome.reason)
    if case.exact:
        assert outcome.reason == case.reason, (case.name, outcome.reason)
    else:
        assert outcome.reason.startswith(case.reason), (case.name, outcome.reason)
    assert outcome.accepted is (case.kind == "accepted"), case.name
    assert outcome.is_error is (case.kind in ERROR_KINDS), case.name
    assert outcome.reason.encode("utf-8")  # text a record can hold
    if case.kind in ("rejected", "accepted"):
        assert outcome.fail_step == case.fail_step, (case.name, outcome.fail_step)


def test_the_batch_ran_every_check_and_the_sandbox_still_answers(task, sandbox):
    vm = task["vm"]
    n = len(task["sources"])
    assert vm.num_generated == n and all(c.valid for c in vm.compiled)  # all valid statically: they must run
    # every verifier ran on both originals and both variants, each check answered (none lost to a flood or a sleeper)
    assert vm.adv_mask.tolist() == [[True], [True]]
    assert len(vm.checks) == 4 * n
    assert {(c.verifier, c.trajectory, c.variant) for c in vm.checks} == \
        {(i, k, j) for i in range(n) for k in (0, 1) for j in (None, 0)}
    assert task["restarts"] == 0
    # the sleepers ran beside the rest: one wall-clock cap (3 x 2 s), not one per sleeper
    assert task["elapsed"] < 30, task["elapsed"]
    # and the sandbox answers afterwards
    after = outcome_of(sandbox.call(sandbox_source(COMPANION), ENTRY_POINT, T0.to_dict()))
    assert after.kind == "accepted"


def test_the_companion_is_untouched(task, sandbox):
    vm = task["vm"]
    assert 0 in vm.valid
    row = vm.valid.index(0)
    assert vm.z_orig[row].tolist() == [1, 0] and vm.z_adv[row].tolist() == [[1], [0]]
    assert not vm.error_orig[row].any() and not vm.error_adv[row].any()
    got = {key: (o.kind, o.reason) for key, o in _outcomes(vm, 0).items()}
    assert got == {(0, None): ("accepted", "accepted"), (0, 0): ("accepted", "accepted"),
                   (1, None): ("rejected", "check returned False"), (1, 0): ("rejected", "check returned False")}
    alone = verdict_matrix([fenced(COMPANION)], [T0, T1], [list(r) for r in task["record"].variants], sandbox)
    assert {key: (o.kind, o.reason) for key, o in _outcomes(alone, 0).items()} == got


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partial(task, case):
    """Hostile on answer 8 (τ_1 and its variant), True on answer 9: an error is 0 in Z with its mask set,
    never an acceptance, never a rejection."""
    vm = task["vm"]
    i = 1 + CASES.index(case)
    outcomes = _outcomes(vm, i)
    assert outcomes[(0, None)].kind == outcomes[(0, 0)].kind == "accepted"
    for key in ((1, None), (1, 0)):
        _expect(case, outcomes[key])
    assert i in vm.valid and i not in vm.runtime_invalid  # it accepted τ_0: it keeps its row
    row = vm.valid.index(i)
    accepted = int(case.kind == "accepted")
    error = case.kind in ERROR_KINDS
    assert vm.z_orig[row].tolist() == [1, accepted] and vm.z_adv[row].tolist() == [[1], [accepted]]
    assert vm.error_orig[row].tolist() == [False, error] and vm.error_adv[row].tolist() == [[False], [error]]


@pytest.mark.parametrize("case", TOTAL, ids=[c.name for c in TOTAL])
def test_total(task, case):
    """Hostile on every trajectory: invalid at run time, the reason naming the kind; no row in Z."""
    vm = task["vm"]
    i = 1 + len(CASES) + TOTAL.index(case)
    outcomes = _outcomes(vm, i)
    assert set(outcomes) == {(0, None), (0, 0), (1, None), (1, 0)} and len(outcomes) == 4
    for o in outcomes.values():
        _expect(case, o)
    assert i not in vm.valid
    assert vm.runtime_invalid[i].startswith(f"check errored on every original trajectory ({case.kind}): ")
    assert vm.validity[i] == vm.runtime_invalid[i]


def test_the_record_keeps_every_check_error_and_round_trips(task):
    vm, record, back = task["vm"], task["record"], task["back"]
    # the record is the verdict matrix's
    assert record.valid == vm.valid and record.num_generated == vm.num_generated == len(task["sources"])
    np.testing.assert_array_equal(record.z_orig, vm.z_orig)
    np.testing.assert_array_equal(record.z_adv, vm.z_adv)
    np.testing.assert_array_equal(record.error_orig, vm.error_orig)
    np.testing.assert_array_equal(record.error_adv, vm.error_adv)
    assert record.runtime_invalid == vm.runtime_invalid
    # every errored check of every verifier (valid or not), with its kind and reason; none else
    errors = [{"verifier": c.verifier, "trajectory": c.trajectory, "variant": c.variant, "kind": c.outcome.kind,
               "reason": c.outcome.reason} for c in vm.checks if c.outcome.is_error]
    assert record.meta["check_errors"] == errors
    assert {e["kind"] for e in errors} == set(ERROR_KINDS)
    assert len(errors) == 2 * sum(c.kind in ERROR_KINDS for c in CASES) + 4 * len(TOTAL)
    assert record.meta["verifier_validity"] == vm.validity
    assert record.meta["verifier_outputs"] == [fenced(s) for s in task["sources"]]
    # ... written and read back whole: every verifier, every trajectory and variant, Z and the masks
    assert back.to_dict() == json.loads(json.dumps(record.to_dict()))
    assert [t.to_dict() for t in back.trajectories] == [T0.to_dict(), T1.to_dict()]
    assert [[v.to_dict() for v in row] for row in back.variants] == \
        [[v.to_dict() for v in row] for row in record.variants]
    assert back.verifiers == vm.valid_sources and back.valid == vm.valid and back.num_generated == vm.num_generated
    np.testing.assert_array_equal(back.z_orig, vm.z_orig)
    np.testing.assert_array_equal(back.z_adv, vm.z_adv)
    np.testing.assert_array_equal(back.adv_mask, vm.adv_mask)
    np.testing.assert_array_equal(back.error_orig, vm.error_orig)
    np.testing.assert_array_equal(back.error_adv, vm.error_adv)
    assert back.runtime_invalid == vm.runtime_invalid
    assert back.meta["check_errors"] == errors and back.meta["verifier_validity"] == vm.validity
    assert back.error_summary() == record.error_summary()
    assert task["path"].read_bytes().count(b"\n") == 1  # one record, one line
