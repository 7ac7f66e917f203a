"""The Execution tool probe (eval/probes/make_tool_set.py, eval/probes/probes.py): its set is the script's output
and registered in the manifest, every answer is right when recomputed from the item's structured expression,
and transcripts are graded through the probe's own path (tool loop, real sandbox, tool-mode grading)."""
from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from eval.probes import make_tool_set as T
from eval.probes import probes as P
from tests.players.scripted import ScriptedEngine  # noqa: E402

SHIPPED = P.DATA_DIR / T.FILENAME


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_regenerating_gives_the_shipped_bytes_and_sha256(tmp_path):
    first = T.write_tool_set(tmp_path / "a")
    second = T.write_tool_set(tmp_path / "b")
    assert first == second == T.sha256(SHIPPED)
    assert (tmp_path / "a" / T.FILENAME).read_bytes() == SHIPPED.read_bytes()
    # Registered beside the other probe sets: tests/eval/test_probes.py checks every manifest entry's sha256.
    manifest = json.loads((P.DATA_DIR / "manifest.json").read_text())
    assert manifest["sha256"][T.FILENAME] == first
    assert {"execution.jsonl", "evaluation.jsonl", "planning.json"} <= set(manifest["sha256"])
    # write_tool_set keeps the manifest's other entries
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "manifest.json").write_text(json.dumps({"version": 1, "sha256": {"x.jsonl": "abc"}}))
    T.write_tool_set(tmp_path / "c")
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["sha256"] == {"x.jsonl": "abc", T.FILENAME: first}


def _recompute(expr) -> Fraction:
    """The expression's value in exact rationals, asserting that every division and percentage is whole."""
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a, b = _recompute(left), _recompute(right)
    if op == "pct":
        value = a / 100 * b
    elif op == "//":
        value = a / b
    else:
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
    assert value.denominator == 1, f"{expr}: not exact"
    return value


def _ops(expr) -> int:
    return 0 if isinstance(expr, int) else 1 + _ops(expr[1]) + _ops(expr[2])


def _leaves(expr, in_pct=False):
    """(value, is a percentage) of every number of the expression."""
    if isinstance(expr, int):
        return [(expr, in_pct)]
    op, left, right = expr
    return _leaves(left, op == "pct") + _leaves(right, False)


def test_every_answer_is_the_recomputed_exact_integer():
    rows = _rows(SHIPPED)
    assert len(rows) == T.N_ITEMS == 50 and len({r["question"] for r in rows}) == 50
    assert [r["id"] for r in rows] == [f"toolprobe-{i:03d}" for i in range(50)]
    assert len({r["template"] for r in rows}) == len(T.TEMPLATES)
    for r in rows:
        value = _recompute(r["expression"])
        assert value > 0 and r["answer"] == str(int(value)), r["id"]
        assert 3 <= _ops(r["expression"]) == r["operations"] <= 5, r["id"]
        for number, is_pct in _leaves(r["expression"]):
            assert (1 <= number <= 99) if is_pct else (100 <= number <= 99999), (r["id"], number)
            assert str(number) in r["question"], (r["id"], number)  # the text states every number it uses
    # the tool is needed: most answers have five digits or more
    assert sum(len(r["answer"]) >= 5 for r in rows) >= 25
    # the module's own evaluator agrees, and refuses a division that is not exact
    assert all(T.evaluate(r["expression"]) == int(r["answer"]) for r in rows)
    with pytest.raises(ValueError):
        T.evaluate(["//", 1001, 100])
    with pytest.raises(ValueError):
        T.evaluate(["pct", 15, 1010])


def _python(expr) -> str:
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    if op == "pct":
        return f"({_python(left)} * {_python(right)} // 100)"
    return f"({_python(left)} {op} {_python(right)})"


def test_grading_through_the_probe_path_in_tool_mode():
    """Three hand-written players on the probe's first three problems, through probe_execution_tool: the tool
    loop of the Execution player (real sandbox), then tool-mode grading (the trajectory's own final answer)."""
    from unifiedplayers.config import compose
    from unifiedplayers.models import build_byte_tokenizer
    from unifiedplayers.sandbox import Sandbox

    cfg = compose(["experiment=tiny", "schedule.execution_pool.max_turns=2",
                   "schedule.execution_pool.max_new_tokens=400"])
    questions = P.load_execution_tool_set(limit=3)
    assert [q.answer_type for q in questions] == ["math"] * 3
    rows = _rows(SHIPPED)[:3]
    code = {r["question"]: _python(r["expression"]) for r in rows}
    answer = {r["question"]: r["answer"] for r in rows}
    q0, q1, q2 = (r["question"] for r in rows)

    def respond(context: str, _j: int) -> str:
        ran = "```output" in context
        if q0 in context:  # computes, reads the output, states the answer in its own reasoning: correct
            return (f"The tool prints {answer[q0]}, so the answer is \\boxed{{{answer[q0]}}}." if ran else
                    f"I compute it.\n```python\nprint({code[q0]})\n```\n")
        if q1 in context:  # only the program prints a box: no final answer of its own
            return ("That is all." if ran else
                    f"```python\nprint('\\\\boxed{{' + str({code[q1]}) + '}}')\n```\n")
        if q2 in context:  # guesses without the tool: answered, wrong
            return f"About \\boxed{{{int(answer[q2]) + 1}}}."
        raise AssertionError("unknown question")

    tokenizer = build_byte_tokenizer()
    with Sandbox(cfg.sandbox) as sandbox:
        res = P.probe_execution_tool(ScriptedEngine(tokenizer, respond), sandbox, tokenizer, cfg, questions)
    items = {i["id"]: i for i in res["items"]}
    right, printed, guess = (items[f"toolprobe-00{k}"] for k in range(3))
    assert right["correct"] and right["extracted"] == answer[q0] and right["status"] == "answered"
    assert right["tool_calls"] == 1
    assert printed["extracted"] is None and not printed["correct"] and printed["status"] != "answered"
    assert printed["tool_calls"] == 1
    assert guess["extracted"] == str(int(answer[q2]) + 1) and not guess["correct"] and guess["status"] == "answered"
    assert res["n"] == 3
    assert res["accuracy"] == pytest.approx(1 / 3) and res["answered"] == pytest.approx(2 / 3)
    assert res["accuracy_se"] == pytest.approx(P.binomial_se(1 / 3, 3))


def test_an_empty_tool_probe_reports_no_rate():
    res = P.probe_execution_tool(None, None, None, None, [])
    assert res["n"] == 0 and res["accuracy"] is None and res["accuracy_se"] is None


def test_figure1_reads_the_new_series_and_reprobes_files_without_the_tool_probe(tmp_path):
    from eval.probes import figure1 as F

    old = F.probe_file(tmp_path / "seed0", 0, "execution")
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"metrics": {"execution/accuracy": 0.1}, "sources": {}}))
    assert not F.probe_done(old, "execution")  # written before the tool probe: the Execution job runs again
    new = F.probe_file(tmp_path / "seed0", 1, "execution")
    new.write_text(json.dumps({"metrics": {"execution/accuracy": 0.1, "execution/accuracy_tool": 0.3,
                                           "execution/accuracy_tool_se": 0.05}, "sources": {}}))
    assert F.probe_done(new, "execution") and F.probe_done(old, "planning") is True
    # an Evaluation file of an older version of the probes (the rate under another name) is probed again, not read
    older = F.probe_file(tmp_path / "seed0", 0, "evaluation")
    older.write_text(json.dumps({"metrics": {"evaluation/original_acceptance": 0.9}}))
    assert not F.probe_done(older, "evaluation")
    F.probe_file(tmp_path / "seed0", 1, "evaluation").write_text(json.dumps(
        {"metrics": {"evaluation/originals_accepted": 0.7, "evaluation/originals_accepted_se": 0.04}}))
    assert F.probe_done(F.probe_file(tmp_path / "seed0", 1, "evaluation"), "evaluation")
    fig = F.collect(tmp_path, [0], [0, 1])
    assert fig["series"]["evaluation/originals_accepted"] == [None, 0.7]
    assert fig["probe_se"]["0"]["evaluation/originals_accepted"] == [None, 0.04]
    assert fig["series"]["execution/accuracy_tool"] == [None, 0.3]
    assert fig["probe_se"]["0"]["execution/accuracy_tool"] == [None, 0.05]
    # a stale backbone copy is replaced by a source that has the tool probe; an up-to-date one is kept
    F.probe_file(tmp_path / "seed1", 0, "execution").parent.mkdir(parents=True)
    F.probe_file(tmp_path / "seed1", 0, "execution").write_text(old.read_text())
    old.write_text(new.read_text())
    assert F.copy_backbone_probes(tmp_path / "seed0", [tmp_path / "seed1"]) == [
        F.probe_file(tmp_path / "seed1", 0, "evaluation"), F.probe_file(tmp_path / "seed1", 0, "execution")]
    assert F.probe_done(F.probe_file(tmp_path / "seed1", 0, "execution"), "execution")
    assert F.copy_backbone_probes(tmp_path / "seed0", [tmp_path / "seed1"]) == []
    png = F.plot(fig, tmp_path / "figure1.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
