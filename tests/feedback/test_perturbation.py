"""The perturbation engine (Appendix F.1): each rule on the paper's Appendix I.2 trajectories."""
from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import pytest
from tests.feedback.paper_examples import PAPER_TRAJECTORIES, TRAJ1, TRAJ2

from unifiedplayers.feedback.perturbation import (ALL_RULES, GLOBAL_RULES, LOCAL_RULES, RULES, PerturbationEngine,
                                                  RuleParams, distractors_for, numeric_literals, propose_arg_mutation,
                                                  movable_spans)
from unifiedplayers.feedback.trajectory import (Trajectory, code_step, extract_boxed, output_step, parse_transcript,
                                                reason_step, render)

PARAMS = RuleParams()
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def run_locally(code: str) -> str:
    """Run trusted fixture code in-process and return its stdout (to check the sandbox's re-execution)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})
    return buf.getvalue().rstrip("\n")


def random_trajectory(rng: random.Random) -> Trajectory:
    steps = []
    for _ in range(rng.randint(0, 7)):
        kind = rng.choice(["reason", "code", "code_out", "output"])
        if kind == "reason":
            steps.append(reason_step(f"r{len(steps)}"))
        elif kind == "code":
            steps.append(code_step(f"print({len(steps)})"))
        elif kind == "code_out":
            steps += [code_step(f"print({len(steps)})"), output_step(f"{len(steps)}")]
        else:
            steps.append(output_step(f"o{len(steps)}"))
    return Trajectory("q", steps, str(rng.randint(0, 20)))


# ---- step_drop --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_step_drop_removes_the_reason_step(n):
    t = PAPER_TRAJECTORIES[n]
    v = RULES["step_drop"](t, random.Random(0), PARAMS)
    # I.2 trajectories have one reason step, so it is the one dropped; code and output stay.
    assert v.steps == t.steps[1:] and v.final_answer == t.final_answer
    assert len(t.steps) == 3  # the input is not modified


def test_step_drop_is_uniform_over_reason_steps_only():
    t = Trajectory("q", [reason_step("a"), code_step("print(1)"), output_step("1"), reason_step("b")], "1")
    dropped = set()
    for seed in range(40):
        v = RULES["step_drop"](t, random.Random(seed), PARAMS)
        assert [s.type for s in v.steps].count("code") == 1 and [s.type for s in v.steps].count("output") == 1
        dropped.add(next(s.text for s in t.steps if s.type == "reason" and s not in v.steps))
    assert dropped == {"a", "b"}


def test_step_drop_without_reason_step_is_none():
    t = Trajectory("q", [code_step("print(1)"), output_step("1")], "1")
    assert RULES["step_drop"](t, random.Random(0), PARAMS) is None


# ---- step_swap --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_step_swap_moves_code_and_output_as_one_unit(n):
    t = PAPER_TRAJECTORIES[n]
    v = RULES["step_swap"](t, random.Random(0), PARAMS)
    # [reason, (code, output)] has one adjacent pair: the unit moves in front of the reasoning.
    assert v.steps == [t.steps[1], t.steps[2], t.steps[0]]


def test_step_swap_never_separates_code_from_its_output():
    rng = random.Random(1)
    for _ in range(300):
        t = random_trajectory(rng)
        v = RULES["step_swap"](t, rng, PARAMS)
        if v is None:
            assert len(movable_spans(t.steps)) < 2 or len({repr(t.steps[slice(*u)]) for u in movable_spans(t.steps)}) == 1
            continue
        assert sorted(map(repr, v.steps)) == sorted(map(repr, t.steps)) and v.steps != t.steps
        for i in range(len(t.steps) - 1):
            if t.steps[i].type == "code" and t.steps[i + 1].type == "output":
                j = v.steps.index(t.steps[i])
                assert v.steps[j + 1] is not None and v.steps[j + 1] == t.steps[i + 1]


def test_step_swap_not_applicable():
    one_unit = Trajectory("q", [code_step("print(1)"), output_step("1")], "1")
    assert RULES["step_swap"](one_unit, random.Random(0), PARAMS) is None
    identical = Trajectory("q", [reason_step("same"), reason_step("same")], "1")
    assert RULES["step_swap"](identical, random.Random(0), PARAMS) is None


# ---- early_terminate --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, pool",
    [
        ("9", ["8", "10", "0"]),
        ("1", ["0", "2"]),  # zero is also a neighbour: listed once
        ("0", ["-1", "1"]),  # zero is the answer: only the neighbours
        ("-3", ["-4", "-2", "0"]),
        ("2.5", ["1.5", "3.5", "0.0", "2.75", "2.25"]),  # the whole pool: tests/feedback/test_distractors.py
        ("5/2", ["3/2", "7/2", "0", "11/4", "9/4"]),
        ("\\frac{5}{2}", ["\\frac{3}{2}", "\\frac{7}{2}", "0", "\\frac{11}{4}", "\\frac{9}{4}"]),
        ("(7,3)", ["0"]),  # not a number: zero only
        (None, ["0"]),
    ],
)
def test_distractor_pool(answer, pool):
    assert distractors_for(answer) == pool


def test_huge_numbers_do_not_break_the_rules():
    huge = "9" * 5000  # past int()'s 4300-digit conversion limit
    assert distractors_for(huge) == ["0"]
    code = f"x = {huge}\ny = 3\n"
    (lit,) = numeric_literals(code)  # the huge literal is skipped, the 3 is found
    assert (lit.text, lit.value, code[lit.start : lit.end]) == ("3", 3, "3")
    # 1.75e308 · 1.05 overflows to inf (max float 1.797e308), so both directions give 1.75e308 · 0.95
    t = Trajectory("q", [code_step("print(1.75e308 * 1)")], None)
    codes = {propose_arg_mutation(t, random.Random(s), PARAMS)[0].steps[0].code for s in range(60)}
    float_codes = {c for c in codes if not c.startswith("print(1.75e308 *")}
    assert float_codes == {f"print({1.75e308 * 0.95!r} * 1)"}


SENTENCE = "So the answer is \\boxed{{{}}}."  # how early_terminate states its fabricated answer


def injected(answer: str):
    """The reasoning step early_terminate appends after a code or output step (Appendix I.4)."""
    return reason_step(SENTENCE.format(answer))


def ends_with_injected_answer(v: Trajectory, kept: list) -> bool:
    """``v`` is ``kept`` followed by a reasoning step that boxes ``v.final_answer``: a step of its own after
    a code or output step, or the sentence joined to ``kept``'s last step when that is a reasoning step."""
    sentence = SENTENCE.format(v.final_answer)
    if kept and kept[-1].type == "reason":
        return v.steps == kept[:-1] + [reason_step(f"{kept[-1].text}\n\n{sentence}")]
    return v.steps == kept + [reason_step(sentence)]


class Picks:
    """A stand-in for random.Random whose choice() returns the listed positions, in order."""

    def __init__(self, *positions: int) -> None:
        self.positions = list(positions)

    def choice(self, seq):
        return seq[self.positions.pop(0)]


def test_early_terminate_on_trajectory_1():
    # Appendix I.4, Pair 1: the suffix is discarded and "replaced by injected \boxed{8}" (here a distractor
    # from {8, 10, 0}), stated by the variant's last step, a reasoning step.
    seen_cuts, seen_answers = set(), set()
    for seed in range(60):
        v = RULES["early_terminate"](TRAJ1, random.Random(seed), PARAMS)
        assert v.final_answer in {"8", "10", "0"}
        # cut at a unit boundary: [reason] or [reason, code, output], never code without its output
        cut = 3 if len(v.steps) == 4 else 1
        assert ends_with_injected_answer(v, TRAJ1.steps[:cut])
        assert v.steps[-1].type == "reason" and extract_boxed(v.steps[-1].text) == v.final_answer
        seen_cuts.add(cut)
        seen_answers.add(v.final_answer)
    assert seen_cuts == {1, 3} and seen_answers == {"8", "10", "0"}


def test_early_terminate_by_hand():
    # Trajectory 1 of Appendix I.2 with its answer stated in a reasoning step, as our Execution player writes it.
    t = Trajectory(
        "How many positive whole-number divisors does 196 have?",
        [reason_step("Count the divisors."), code_step("print(sum(196 % d == 0 for d in range(1, 197)))"),
         output_step("9"), reason_step("So the answer is \\boxed{9}.")],
        "9",
    )
    # units (0,1) (1,3) (3,4); the answer is stated at step 3, so the cuts are [1, 3]; the pool of 9 is
    # [8, 10, 0]. Cut 3 (position 1), distractor 8 (position 0): steps 0-2 kept, step 3 gone, an injected
    # step states 8: Pair 1, "discarded after the code output of 9, replaced by injected \boxed{8}".
    v = RULES["early_terminate"](t, Picks(1, 0), PARAMS)
    assert v == Trajectory(t.question, t.steps[:3] + [reason_step("So the answer is \\boxed{8}.")], "8")
    # Cut 1 (position 0), distractor 0 (position 2): steps 1-3 gone; the kept step is a reasoning step, so
    # the sentence joins it (text between fences is one step: no two reasoning steps in a row).
    w = RULES["early_terminate"](t, Picks(0, 2), PARAMS)
    assert w == Trajectory(t.question, [reason_step("Count the divisors.\n\nSo the answer is \\boxed{0}.")], "0")
    # what a verifier reads: the last step is a reasoning step whose box is the final answer, in the original
    # and in the variants alike; each variant reads back from its transcript unchanged, with one box
    for traj in (t, v, w):
        assert traj.steps[-1].type == "reason" and extract_boxed(traj.steps[-1].text) == traj.final_answer
        assert parse_transcript(traj.question, render(traj)) == traj
    assert render(v).endswith("```output\n9\n```\n\nSo the answer is \\boxed{8}.") and render(v).count("boxed") == 1
    assert render(w) == "Count the divisors.\n\nSo the answer is \\boxed{0}."


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_early_terminate_never_keeps_the_answer(n):
    t = PAPER_TRAJECTORIES[n]
    for seed in range(20):
        v = RULES["early_terminate"](t, random.Random(seed), PARAMS)
        assert v.final_answer != t.final_answer
        # I.2 layout (reason, code, output; the answer alone after the output): cut 1 or 3
        assert any(ends_with_injected_answer(v, t.steps[:cut]) for cut in (1, 3))
        assert parse_transcript(t.question, render(v)) == v


def test_early_terminate_cuts_before_the_step_stating_the_answer():
    t = Trajectory(
        "q",
        [reason_step("plan"), code_step("print(9)"), output_step("9"), reason_step("So the answer is \\boxed{9}.")],
        "9",
    )
    for seed in range(30):
        v = RULES["early_terminate"](t, random.Random(seed), PARAMS)
        # the answering reason step is always discarded, and the injected sentence states the distractor
        assert v.final_answer in {"8", "10", "0"}
        assert any(ends_with_injected_answer(v, t.steps[:cut]) for cut in (1, 3))
        assert all("boxed{9}" not in (s.text or "") for s in v.steps)


@pytest.mark.parametrize("answer", ["\\frac{5}{2}", "12\\%", "30 \\text{ cm}", "1,000", "2.5", "(7,3)", "none"])
def test_early_terminate_injected_step_boxes_every_distractor_style(answer):
    t = Trajectory("q", [reason_step("r"), code_step("print(1)"), output_step("1"),
                         reason_step(f"The answer is \\boxed{{{answer}}}.")], answer)
    for seed in range(30):
        v = RULES["early_terminate"](t, random.Random(seed), PARAMS)
        assert v.final_answer in distractors_for(answer)
        assert extract_boxed(v.steps[-1].text) == v.final_answer
        assert parse_transcript("q", render(v)) == v


def test_early_terminate_without_answer_fabricates_zero():
    t = Trajectory("q", [reason_step("thinking"), code_step("print(1)")], None)
    # no step states an answer: the cuts are the unit ends [1, 2]; the pool is ["0"]
    v = RULES["early_terminate"](t, Picks(1, 0), PARAMS)
    assert v == Trajectory("q", [reason_step("thinking"), code_step("print(1)"), injected("0")], "0")
    v = RULES["early_terminate"](t, Picks(0, 0), PARAMS)
    assert v == Trajectory("q", [reason_step("thinking\n\nSo the answer is \\boxed{0}.")], "0")


def test_early_terminate_on_a_trajectory_of_one_answering_step():
    # nothing comes before the answer: the cut is 0 and the variant is the injected step alone
    t = Trajectory("q", [reason_step("I guess \\boxed{40}.")], "40")
    v = RULES["early_terminate"](t, Picks(0, 1), PARAMS)  # pool of 40: [39, 41, 44, 36, 0]
    assert v == Trajectory("q", [injected("41")], "41")


# ---- tool_substitute --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_tool_substitute(n):
    t = PAPER_TRAJECTORIES[n]
    v = RULES["tool_substitute"](t, random.Random(0), PARAMS)
    assert v.steps[1].lang == "bash"
    assert v.steps[1].code == t.steps[1].code and v.steps[2].result == t.steps[2].result
    assert v.steps[0] == t.steps[0] and v.final_answer == t.final_answer and t.steps[1].lang == "python"


def test_tool_substitute_without_python_step_is_none():
    t = Trajectory("q", [reason_step("no code"), code_step("echo 1", "bash")], "1")
    assert RULES["tool_substitute"](t, random.Random(0), PARAMS) is None


# ---- arg_mutation -----------------------------------------------------------------------------------


def test_numeric_literals_skip_strings_comments_and_unchangeable_floats():
    code = 'print("7")  # 8\nx = 5 + 0.0 + 2.5 + 1j + 0x10\n'
    assert [(lit.text, lit.value) for lit in numeric_literals(code)] == [("5", 5), ("2.5", 2.5), ("0x10", 16)]
    assert numeric_literals("print(len('abc'))") == []
    assert numeric_literals("x = (1,\n") == []  # untokenizable code holds no literal


def test_arg_mutation_proposal_changes_one_literal_by_an_allowed_amount():
    template = "count = sum({} for d in range({}, {}) if {} % d == {})\nprint(count)"
    values = [1, 1, 197, 196, 0]
    assert TRAJ1.steps[1].code == template.format(*values)
    expected = set()
    for i in range(5):
        for off in (-2, -1, 1, 2):
            new = list(values)
            new[i] += off
            expected.add(template.format(*[f"({v})" if v < 0 else v for v in new]))
    seen = set()
    for seed in range(300):
        v, idx = propose_arg_mutation(TRAJ1, random.Random(seed), PARAMS)
        assert idx == 1 and v.steps[1].code in expected
        assert v.steps[2] == TRAJ1.steps[2]  # the output is replaced only after re-execution
        seen.add(v.steps[1].code)
    assert seen == expected  # uniform over 5 literals x 4 offsets: all 20 programs reached


def test_arg_mutation_float_shift():
    t = Trajectory("q", [code_step("print(2.0 * 3)"), output_step("6.0")], "6")
    seen = set()
    for seed in range(100):
        v, _ = propose_arg_mutation(t, random.Random(seed), PARAMS)
        seen.add(v.steps[0].code)
    # 2.0 -> 2.0*0.95 or 2.0*1.05; 3 -> 3 + {-2,-1,1,2}
    assert seen == {"print(1.9 * 3)", "print(2.1 * 3)", "print(2.0 * 1)", "print(2.0 * 2)", "print(2.0 * 4)",
                    "print(2.0 * 5)"}


def test_arg_mutation_negative_result_is_parenthesised():
    t = Trajectory("q", [code_step("print(7-1)"), output_step("6")], "6")
    codes = {propose_arg_mutation(t, random.Random(s), PARAMS)[0].steps[0].code for s in range(100)}
    assert "print(7-(-1))" in codes and all(run_locally(c) for c in codes)


def test_arg_mutation_without_literal_is_none():
    t = Trajectory("q", [reason_step("r"), code_step("print(len('abc'))"), output_step("3")], "3")
    assert propose_arg_mutation(t, random.Random(0), PARAMS) is None


@pytest.mark.parametrize("n", sorted(PAPER_TRAJECTORIES))
def test_arg_mutation_reexecutes_in_the_sandbox(n, sandbox):
    t = PAPER_TRAJECTORIES[n]
    engine = PerturbationEngine(["arg_mutation"], seed=n, sandbox=sandbox)
    (v,) = engine.perturb(t)
    assert v.steps[1].code != t.steps[1].code
    assert v.steps[0] == t.steps[0] and v.final_answer == t.final_answer and len(v.steps) == 3
    # the recorded output is what the mutated code prints (run here too, it is our own fixture code)
    assert v.steps[2].result == run_locally(v.steps[1].code)


def test_arg_mutation_records_errors_and_inserts_missing_output(sandbox):
    t = Trajectory("q", [code_step("print(10 // (2 - 2))")], None)  # no recorded output yet
    engine = PerturbationEngine(["arg_mutation"], seed=0, sandbox=sandbox)
    results = {}
    for seed in range(12):
        engine.seed = seed
        (v,) = engine.perturb(t)
        assert [s.type for s in v.steps] == ["code", "output"]
        results[v.steps[0].code] = v.steps[1].result
    for code, out in results.items():
        if "(2 - 2)" in code:  # the 10 was mutated: still a division by zero
            assert "ZeroDivisionError" in out and out.endswith("[exit status 1]")
        else:
            assert out == run_locally(code)


def test_rule_function_and_engine_agree(sandbox):
    engine = PerturbationEngine(["arg_mutation"], seed=3, sandbox=sandbox)
    from unifiedplayers.feedback.perturbation import rule_rng

    params = RuleParams(execute=engine._execute)
    direct = RULES["arg_mutation"](TRAJ2, rule_rng(3, "arg_mutation", TRAJ2), params)
    assert engine.perturb(TRAJ2) == [direct]


# ---- engine -----------------------------------------------------------------------------------------


def test_engine_all_rules_on_trajectory_1(sandbox):
    engine = PerturbationEngine(seed=0, sandbox=sandbox)
    assert engine.rules == ALL_RULES and engine.num_rules == 5
    variants = engine.perturb(TRAJ1)
    assert len(variants) == 5 and all(v is not None and v != TRAJ1 for v in variants)
    arg, drop, swap, early, tool = variants
    assert arg.steps[1].code != TRAJ1.steps[1].code
    assert drop.steps == TRAJ1.steps[1:]
    assert swap.steps == [TRAJ1.steps[1], TRAJ1.steps[2], TRAJ1.steps[0]]
    assert early.final_answer in {"8", "10", "0"}
    assert tool.steps[1].lang == "bash"


def test_engine_is_seeded_and_independent_of_batch_order(sandbox):
    a = PerturbationEngine(seed=7, sandbox=sandbox)
    trajs = [PAPER_TRAJECTORIES[n] for n in sorted(PAPER_TRAJECTORIES)]
    forward = a.perturb_many(trajs)
    backward = PerturbationEngine(seed=7, sandbox=sandbox).perturb_many(trajs[::-1])[::-1]
    assert forward == backward
    assert forward[0] == a.perturb(trajs[0])
    # the rule subset does not change a rule's draw either
    only_early = PerturbationEngine(["early_terminate"], seed=7).perturb_many(trajs)
    assert [row[3] for row in forward] == [row[0] for row in only_early]
    other_seed = PerturbationEngine(["early_terminate"], seed=8).perturb_many(trajs * 4)
    draws = {(v.final_answer, len(v.steps)) for (v,) in only_early + other_seed}
    assert len(draws) > 1


def test_engine_rejects_bad_settings():
    with pytest.raises(ValueError, match="unknown"):
        PerturbationEngine(["step_shuffle"])
    with pytest.raises(ValueError, match="sandbox"):
        PerturbationEngine(["arg_mutation"])
    with pytest.raises(ValueError):
        PerturbationEngine(["step_drop", "step_drop"])
    with pytest.raises(ValueError):
        PerturbationEngine(["step_drop"], int_offsets=[0, 1])
    with pytest.raises(ValueError):
        PerturbationEngine(["tool_substitute"], substitute_lang="python")


def test_engine_none_preset_gives_no_variants():
    assert PerturbationEngine([], seed=0).perturb_many([TRAJ1, TRAJ2]) == [[], []]


def test_rule_kinds_follow_the_spec():
    assert {name: RULES.get(name).scope for name in ALL_RULES} == {
        "arg_mutation": "local", "step_drop": "local", "step_swap": "local",
        "early_terminate": "global", "tool_substitute": "global",
    }
    assert list(RULES) == list(ALL_RULES)


@pytest.mark.parametrize(
    "preset, rules",
    [("all", ALL_RULES), ("local", LOCAL_RULES), ("global", GLOBAL_RULES), ("none", ())],
)
def test_perturbation_config_groups(preset, rules, sandbox):
    from hydra import compose, initialize_config_dir

    from unifiedplayers.config import PerturbationConfig, register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=[f"perturbation={preset}"]).perturbation
    assert tuple(cfg.rules) == rules and cfg.name == preset
    assert set(cfg.keys()) == set(PerturbationConfig.__dataclass_fields__)
    engine = PerturbationEngine.from_config(cfg, seed=0, sandbox=sandbox)
    assert engine.rules == rules and engine.params.int_offsets == (-2, -1, 1, 2)
    assert engine.params.float_rel_change == 0.05 and engine.params.substitute_lang == "bash"
    assert len(engine.perturb(TRAJ1)) == len(rules)


def test_the_tool_loops_formatter_writes_the_reexecuted_output(sandbox):
    t = Trajectory("q", [code_step("print(10 * 10)"), output_step("<10")], "100")

    def shout(result):  # e.g. a tool loop that truncates and tags its observations
        return "<" + result.stdout.strip()[:2]

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"rules": ["arg_mutation"], "int_offsets": [1], "float_rel_change": 0.05,
                            "substitute_lang": "bash"})
    (v,) = PerturbationEngine.from_config(cfg, seed=0, sandbox=sandbox, format_result=shout).perturb(t)
    # either 11 * 10 = 110 or 10 * 11 = 110 -> "<11"
    assert v.steps[0].code in ("print(11 * 10)", "print(10 * 11)") and v.steps[1].result == "<11"
