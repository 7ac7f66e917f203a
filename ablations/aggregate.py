"""Aggregate a sweep's run directories into the paper's tables (3, 5, 15, 16, 17 and 1), markdown and LaTeX.

Pure functions over run directories (:func:`load_run_row` says what is read from each); nothing here trains or
evaluates. ``Math AVG`` and ``General AVG`` are the means of the math and general benchmarks evaluated, in the
``tool`` mode when present (:func:`eval_scores`).

Table 3 (Appendix C.1, paired over seeds s): with Y(P, E, s) the score of the configuration with Planning
trained (P) and Evaluation trained (E),

- Planning marginal  = ½[(Y(1,0) − Y(0,0)) + (Y(1,1) − Y(0,1))]
- Evaluation marginal = ½[(Y(0,1) − Y(0,0)) + (Y(1,1) − Y(1,0))]
- Interaction (difference-in-differences) = (Y(1,1) − Y(0,1)) − (Y(1,0) − Y(0,0))
- Fresh-feedback gain = Y_fresh(1,1) − Y_stale(1,1)

each computed per seed (only seeds with every cell the contrast needs), then mean ± SD (ddof = 1) over
those seeds; an SD over one seed is undefined and printed as "–".

Command: ``python -m ablations.aggregate {table3,table5,table15,table16,table17,table1} SWEEP_DIR [--out DIR]``
writes ``<table>.md``, ``<table>.tex`` and ``<table>.runs.csv`` (the per-run frame) and prints the markdown.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import yaml

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `python ablations/aggregate.py` as well as `python -m ablations.aggregate`
    sys.path.insert(0, _ROOT)

from ablations import paper_numbers as paper  # noqa: E402
from eval.analysis.compute import compute_accounting  # noqa: E402
from eval.analysis.rundir import RunData  # noqa: E402
from eval.tables import render_latex, render_markdown, rows_from_results, write_tables  # noqa: E402
from unifiedplayers import rundir  # noqa: E402
from unifiedplayers.data.benchmarks import REGISTRY  # noqa: E402

RESULTS_FILE = "results.json"
ADV_REJECT_FILE = "adv_reject.json"  # ablations.adv_reject.RESULT_FILE
ADV_REJECT_KEY = "evaluation/rho_adv"
ITERATION_KEYS = ("outer_iteration", "iteration")
METRIC_NAMES = {"math_avg": "Math AVG", "general_avg": "General AVG"}
COLUMNS = {**{m: [f"{name} (ours)", f"{name} (paper)"] for m, name in METRIC_NAMES.items()},  # a metric's headers
           "adv_reject": ["Adv. Reject (ours, held-out)", "Adv. Reject (paper)"]}


# --------------------------------------------------------------------------------------------------
# Reading run directories


def _get(d: Any, dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def benchmark_domain(name: str) -> str:
    """``math`` or ``general`` for a benchmark of the registry; offline subsets by their answer type."""
    if name not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r} in an eval results.json; known: {sorted(REGISTRY)}")
    b = REGISTRY[name]
    if b.table in ("math", "general"):
        return b.table
    return "math" if b.answer_type == "math" else "general"


def eval_scores(results: dict[str, Any], mode: Optional[str] = None) -> dict[str, Any]:
    """Per-benchmark scores of one mode of an eval ``results.json`` and the two domain averages."""
    modes = results.get("modes") or {}
    if not modes:
        return {}
    if mode is None:
        mode = "tool" if "tool" in modes else next(iter(modes))
    if mode not in modes:
        raise ValueError(f"eval results have modes {sorted(modes)}, not {mode!r}")
    out: dict[str, Any] = {"eval_mode": mode, "eval_label": modes[mode].get("label")}
    names: dict[str, list[str]] = {"math": [], "general": []}
    for name, res in modes[mode].get("benchmarks", {}).items():
        s = res.get("score")
        if s is None or (isinstance(s, float) and math.isnan(s)):
            continue
        out[f"score/{name}"] = float(s)
        names[benchmark_domain(name)].append(name)
    for dom, covered in names.items():
        out[f"{dom}_avg"] = float(np.mean([out[f"score/{n}"] for n in covered])) if covered else np.nan
        out[f"n_{dom}"] = len(covered)
        out[f"benchmarks_{dom}"] = ",".join(sorted(covered))  # what the average covers
    return out


def adversarial_rejection(metrics: Sequence[dict[str, Any]]) -> float:
    """Mean ``evaluation/rho_adv`` over the updates of the last outer iteration that logged it."""
    rows = [m for m in metrics if isinstance(m.get(ADV_REJECT_KEY), (int, float))]
    if not rows:
        return np.nan
    it_key = next((k for k in ITERATION_KEYS if k in rows[-1]), None)
    if it_key is not None:
        last = max(m.get(it_key, 0) for m in rows)
        rows = [m for m in rows if m.get(it_key) == last]
    return float(np.mean([m[ADV_REJECT_KEY] for m in rows]))


def compute_hours(run_dir: Path, metrics: list[dict[str, Any]], config: dict, summary: dict) -> tuple[float, float]:
    """(wall hours, device hours) of the run's updates (``eval.analysis.compute``)."""
    acc = compute_accounting(RunData(path=run_dir, records=[], metrics=metrics, config=config, summary=summary))
    return float(acc["run"]["wall_h"]), float(acc["run"]["device_h"])


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def load_run_row(run_dir: str | Path, mode: Optional[str] = None) -> dict[str, Any]:
    """One row of the sweep frame, from ``config.yaml`` (the resolved config), ``summary.json`` (present once
    training finished), ``metrics.jsonl`` (training's ``evaluation/rho_adv`` over the last outer iteration, compute
    hours), ``eval/adv_reject.json`` (Table 15's Adv. Reject) and ``eval/results.json`` (the harness's scores)."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / rundir.CONFIG
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found: not a run directory")
    config = yaml.safe_load(cfg_path.read_text()) or {}
    summary = _read_json(run_dir / rundir.SUMMARY_JSON)
    adv_reject = _read_json(run_dir / rundir.EVAL / ADV_REJECT_FILE).get("adv_reject")
    scores = eval_scores(_read_json(run_dir / rundir.EVAL / RESULTS_FILE), mode)
    metrics = rundir.read_jsonl(run_dir / rundir.METRICS, missing_ok=True)
    reward = config.get("reward", {}) or {}
    rules = _get(config, "perturbation.rules", []) or []
    row: dict[str, Any] = {
        "run_dir": str(run_dir),
        "name": run_dir.name,
        "method": _get(config, "method.name", "unifiedplayers"),
        "model": _get(config, "model.name"),
        "experiment": config.get("experiment"),
        "ablation": config.get("ablation"),
        "seed": int(config.get("seed", 0)),
        "train_planning": bool(_get(config, "schedule.train_planning", True)),
        "train_evaluation": bool(_get(config, "schedule.train_evaluation", True)),
        "feedback": _get(config, "schedule.feedback", "fresh"),
        "outer_iterations": _get(config, "schedule.outer_iterations"),
        "perturbation": _get(config, "perturbation.name", "all"),
        "num_rules": len(rules),
        "num_verifiers": _get(config, "player.num_verifiers"),
        "alpha": reward.get("alpha"),
        "beta": reward.get("beta"),
        "gamma": reward.get("gamma"),
        "reward_preset": reward.get("name"),
        "use_verifiability": bool(reward.get("use_verifiability", True)),
        "finished": bool(summary) or not _get(config, "method.trainable", True),
        "updates": len(metrics),
        "adv_reject": np.nan if adv_reject is None else float(adv_reject),  # Table 15: on the fixed held-out set
        "adv_reject_train": adversarial_rejection(metrics),  # on the run's own rules, during training
        "math_avg": np.nan,
        "general_avg": np.nan,
        "evaluated": bool(scores),
    }
    row["wall_h"], row["device_h"] = compute_hours(run_dir, metrics, config, summary) if metrics else (0.0, 0.0)
    row.update(scores)
    return row


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every run directory (a directory holding ``config.yaml``) under ``root``, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep directory {root} does not exist")
    dirs = {p.parent for p in root.rglob(rundir.CONFIG) if ".hydra" not in p.parts and rundir.WANDB not in p.parts}
    return sorted(dirs)


def load_sweep(root: str | Path, mode: Optional[str] = None) -> pd.DataFrame:
    """The sweep frame: one row per run directory under ``root``."""
    rows = [load_run_row(d, mode) for d in find_run_dirs(root)]
    if not rows:
        raise FileNotFoundError(f"no run directory (config.yaml) under {root}")
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Cells and tables


@dataclass(frozen=True)
class Stat:
    """A mean ± SD over n paired seeds (sd NaN when n < 2); ``signed`` prints a leading +."""

    mean: float
    sd: float = float("nan")
    n: int = 1
    signed: bool = False
    digits: int = 1


def stat(values: Sequence[float], signed: bool = False, digits: int = 1) -> Stat:
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    if v.size == 0:
        return Stat(float("nan"), float("nan"), 0, signed, digits)
    return Stat(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan"), int(v.size), signed, digits)


def _num(x: float, signed: bool, digits: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


_LATEX = {"&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "–": "--", "±": "$\\pm$", "γ": "$\\gamma$",
          "α": "$\\alpha$", "β": "$\\beta$", "✓": "$\\checkmark$"}


def fmt_cell(c: Any, latex: bool = False) -> str:
    if isinstance(c, Stat):
        m = _num(c.mean, c.signed, c.digits)
        if m == "–":
            return "--" if latex else m
        sd = _num(c.sd, False, c.digits)
        if latex:
            return f"${m} \\pm {sd}$" if sd != "–" else f"${m}$"
        return f"{m} ± {sd}"
    if isinstance(c, float):
        digits = 1 if abs(c) >= 1 or c == 0 else (2 if abs(c) >= 0.1 else 3)  # small compute hours stay visible
        s = _num(c, False, digits)
        return "--" if latex and s == "–" else s
    s = "" if c is None else str(c)
    return "".join(_LATEX.get(ch, ch) for ch in s) if latex else s


@dataclass
class Table:
    """A table in the paper's layout: ``header``, ``rows`` of cells (str, float or Stat), ``notes``."""

    key: str
    title: str
    header: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    sections: dict[int, str] = field(default_factory=dict)  # row index -> section label printed above it

    def to_markdown(self) -> str:
        return render_markdown(f"**{self.title}**", self.header, [[fmt_cell(c) for c in row] for row in self.rows],
                               self.notes, self.sections)

    def to_latex(self) -> str:
        return render_latex(self.title, "ablations/aggregate.py", [fmt_cell(h, latex=True) for h in self.header],
                            [[fmt_cell(c, latex=True) for c in row] for row in self.rows],
                            {i: fmt_cell(s, latex=True) for i, s in self.sections.items()})


def _complete(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that finished training and have evaluation scores (the others are listed in the notes)."""
    return df[df["finished"] & df["evaluated"]]


def _pending_note(df: pd.DataFrame) -> list[str]:
    bad = df[~(df["finished"] & df["evaluated"])]
    if bad.empty:
        return []
    names = ", ".join(f"{r['name']} ({'not finished' if not r['finished'] else 'not evaluated'})"
                      for _, r in bad.iterrows())
    return [f"Left out (incomplete): {names}."]


def _compute_cell(sub: pd.DataFrame) -> float:
    """Device hours when the runs used accelerators, else wall hours (CPU)."""
    if sub.empty:
        return float("nan")
    dev = sub["device_h"].astype(float)
    return float(dev.mean()) if (dev > 0).any() else float(sub["wall_h"].astype(float).mean())


def _compute_header(df: pd.DataFrame) -> str:
    return "GPU-h (ours)" if (df["device_h"].astype(float) > 0).any() else "wall-h (ours, CPU)"


def _check_unique(df: pd.DataFrame, keys: list[str], what: str) -> None:
    dup = df[df.duplicated(keys, keep=False)]
    if not dup.empty:
        raise ValueError(f"{what}: several runs share {keys}: {sorted(dup['run_dir'])}")


# --------------------------------------------------------------------------------------------------
# What an average covers (every table's AVG columns)

PAPER_BACKBONE = "Qwen3-4B-Base"  # Tables 3, 5, 15, 16 and 17 of the paper are on this backbone only
FLAG = "†"


def paper_benchmarks(domain: str) -> list[str]:
    """The benchmarks of the paper's Math AVG (Table 1's seven) or General AVG (Table 2's five)."""
    return [name for name, b in REGISTRY.items() if b.table == domain]


def _titles(names: Sequence[str]) -> str:
    order = {n: i for i, n in enumerate(REGISTRY)}  # the paper's column order
    names = sorted(names, key=lambda n: (order.get(n, len(order)), n))
    return ", ".join(REGISTRY[n].title if n in REGISTRY else n for n in names) or "none"


def average_provenance(df: pd.DataFrame, metrics: Sequence[str]) -> tuple[dict[str, bool], list[str]]:
    """For each AVG metric of a table (``math_avg``, ``general_avg``): whether our column must be flagged
    (a benchmark set other than the paper's, or another backbone than the paper's), and the notes that
    name the backbone(s) and the benchmarks each average covers. ``df``: the runs in the table."""
    flags: dict[str, bool] = {}
    notes: list[str] = []
    backbones = sorted(map(str, df["model"].dropna().unique())) if "model" in df and not df.empty else []
    other_backbone = any(b.rsplit("/", 1)[-1].lower() != PAPER_BACKBONE.lower() for b in backbones)
    for m in metrics:
        if m not in METRIC_NAMES:
            continue
        dom = m.split("_")[0]
        col = f"benchmarks_{dom}"
        sets = sorted({str(x) for x in df[col].dropna()} - {""}) if col in df and not df.empty else []
        paper_set = paper_benchmarks(dom)
        differs = any(sorted(x.split(",")) != sorted(paper_set) for x in sets)
        flags[m] = bool(sets) and (differs or other_backbone)
        name = METRIC_NAMES[m]
        if not sets:
            notes.append(f"{name} (ours): no evaluated run yet.")
            continue
        covered = "; ".join(f"{_titles(x.split(','))} ({len(x.split(','))})" for x in sets)
        text = (f"{name} (ours) on {', '.join(backbones) or 'an unrecorded backbone'}: mean over {covered}. "
                f"{name} (paper) on {PAPER_BACKBONE}: mean over {_titles(paper_set)} ({len(paper_set)}).")
        if len(sets) > 1:
            per_run = ", ".join(f"{r['name']}: {_titles(str(r[col]).split(','))}" for _, r in df.iterrows()
                                if isinstance(r.get(col), str))
            text += f" {FLAG} The runs' averages cover different benchmarks ({per_run}): rows are not comparable."
        elif differs:
            text += f" {FLAG} Not the paper's benchmark set: not comparable with the paper's column."
        if other_backbone:
            text += f" {FLAG} Not the paper's backbone."
        notes.append(text)
    return flags, notes


def label_averages(table: Table, df: pd.DataFrame, metrics: Sequence[str]) -> Table:
    """Flag our AVG columns that are not like for like with the paper's, and say what each covers."""
    ok = _complete(df)
    flags, notes = average_provenance(ok, metrics)
    for m, flagged in flags.items():
        if flagged:
            old = f"{METRIC_NAMES[m]} (ours)"
            table.header = [h.replace(old, f"{METRIC_NAMES[m]} (ours{FLAG})") for h in table.header]
    table.notes = notes + table.notes
    return table


# --------------------------------------------------------------------------------------------------
# Table 3


TABLE3_CELLS = {  # (train_planning, train_evaluation) -> label
    (False, False): "Execution only",
    (True, False): "Planning + Execution",
    (False, True): "Execution + Evaluation",
    (True, True): "Full UnifiedPlayers",
}


def factorial_cells(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """seed × (P, E) matrix of ``metric`` over the fresh-feedback runs (NaN where a cell is missing)."""
    fresh = df[df["feedback"] == "fresh"]
    _check_unique(fresh, ["seed", "train_planning", "train_evaluation"], "Table 3")
    wide = fresh.pivot(index="seed", columns=["train_planning", "train_evaluation"], values=metric)
    for cell in TABLE3_CELLS:
        if cell not in wide.columns:
            wide[cell] = np.nan
    return wide[list(TABLE3_CELLS)].astype(float)


def paired_contrasts(cells: pd.DataFrame) -> dict[str, pd.Series]:
    """Per-seed Planning marginal, Evaluation marginal and difference-in-differences (NaN rows dropped)."""
    y00, y10 = cells[(False, False)], cells[(True, False)]
    y01, y11 = cells[(False, True)], cells[(True, True)]
    return {
        "Planning marginal": (((y10 - y00) + (y11 - y01)) / 2).dropna(),
        "Evaluation marginal": (((y01 - y00) + (y11 - y10)) / 2).dropna(),
        "Interaction": ((y11 - y01) - (y10 - y00)).dropna(),
    }


def fresh_gain(df: pd.DataFrame, metric: str) -> pd.Series:
    """Per-seed Full (fresh) − Full (stale), over the seeds that have both."""
    full = df[df["train_planning"] & df["train_evaluation"]]
    _check_unique(full, ["seed", "feedback"], "Table 3 (fresh vs stale)")
    fresh = full[full["feedback"] == "fresh"].set_index("seed")[metric].astype(float)
    stale = full[full["feedback"] == "stale"].set_index("seed")[metric].astype(float)
    return (fresh - stale).dropna()


def table3(df: pd.DataFrame, metrics: Sequence[str] = ("math_avg", "general_avg")) -> Table:
    """Table 3 (player attribution) with the paper's numbers beside ours."""
    ok = _complete(df)
    cells = {m: factorial_cells(ok, m) for m in metrics}
    contrasts = {m: paired_contrasts(cells[m]) for m in metrics}
    gains = {m: fresh_gain(ok, m) for m in metrics}
    fresh, stale = ok[ok["feedback"] == "fresh"], ok[ok["feedback"] == "stale"]
    header = ["Configuration", "Planning", "Evaluation", *(h for m in metrics for h in COLUMNS[m]),
              _compute_header(ok if not ok.empty else df), "GPU-h (paper)"]

    def paper_stat(p: Sequence[float], m: str, signed: bool = False) -> Stat:
        i = 0 if m == "math_avg" else 2
        return Stat(p[i], p[i + 1], 3, signed)

    rows: list[list[Any]] = []
    for (tp, te), label in TABLE3_CELLS.items():
        row: list[Any] = [label, "Trainable" if tp else "Frozen", "Trainable" if te else "Frozen"]
        for m in metrics:
            row += [stat(cells[m][(tp, te)].tolist()), paper_stat(paper.TABLE3_CONFIGS[label], m)]
        sub = fresh[(fresh["train_planning"] == tp) & (fresh["train_evaluation"] == te)]
        row += [_compute_cell(sub), int(paper.TABLE3_CONFIGS[label][4])]
        rows.append(row)
    first_contrast = len(rows)
    contrast_kind = {"Planning marginal": "Average effect", "Evaluation marginal": "Average effect",
                     "Interaction": "Difference-in-differences"}
    for name, kind in contrast_kind.items():
        row = [name, kind, ""]
        for m in metrics:
            row += [stat(contrasts[m][name].tolist(), signed=True), paper_stat(paper.TABLE3_CONTRASTS[name], m, True)]
        row += ["–", "–"]
        rows.append(row)
    first_control = len(rows)
    row = ["Stale-feedback UnifiedPlayers", "Trainable", "Trainable"]
    full_stale = stale[stale["train_planning"] & stale["train_evaluation"]]
    for m in metrics:
        row += [stat(full_stale[m].astype(float).tolist()), paper_stat(paper.TABLE3_STALE, m)]
    row += [_compute_cell(full_stale), int(paper.TABLE3_STALE[4])]
    rows.append(row)
    row = ["Fresh-feedback gain", "Matched capacity", ""]
    for m in metrics:
        row += [stat(gains[m].tolist(), signed=True), paper_stat(paper.TABLE3_FRESH_GAIN, m, True)]
    row += ["Matched", "Matched"]
    rows.append(row)
    seeds = sorted(int(s) for s in ok["seed"].unique()) if not ok.empty else []
    notes = [f"Ours: mean ± SD over paired seeds {seeds} (n per cell = seeds with a finished, evaluated run; "
             "contrasts per seed, then mean ± SD; '–': undefined, e.g. an SD over one seed). "
             "Paper: Qwen3-4B-Base, three paired seeds, GPU-hours per seed on 8x A100.", *_pending_note(df)]
    t = Table("table3", "Table 3: Player attribution with trainable Execution", header, rows, notes,
              sections={0: "Factorial configurations", first_contrast: "Paired contrasts",
                        first_control: "Coordination control"})
    return label_averages(t, df, metrics)


# --------------------------------------------------------------------------------------------------
# Tables 5, 15, 16, 17


TABLE5_PREDICATES = [  # (label, predicate on a row given the sweep's largest outer_iterations)
    ("w/o Perturbation Engine", lambda r, it: r["perturbation"] == "none" or r["num_rules"] == 0),
    ("Single Verifier (M=1)", lambda r, it: r["num_verifiers"] == 1),
    ("w/o V(q) in Planning reward", lambda r, it: not r["use_verifiability"]),
    ("w/o Diversity Penalty", lambda r, it: r["gamma"] == 0),
    ("Single Iteration", lambda r, it: it > 1 and r["outer_iterations"] == 1),
]


def table5_label(row: pd.Series | dict, max_iterations: int) -> str:
    """The Table 5 row a run belongs to: the one ablation it applies, or the full method."""
    hits = [label for label, pred in TABLE5_PREDICATES if pred(row, max_iterations)]
    if len(hits) > 1:
        raise ValueError(f"{row['run_dir']} applies several Table 5 ablations at once: {hits}")
    return hits[0] if hits else "Full UnifiedPlayers"


def _simple_table(key: str, title: str, df: pd.DataFrame, label_of, order: Sequence[Any], label_header: list[str],
                  label_text, paper_cols, metric_cols: Sequence[str], extra=None, extra_header=(), notes=()) -> Table:
    """Rows = ``order`` (row keys); cells = mean over the runs of that key (seeds averaged); AVG columns labelled."""
    ok = _complete(df).copy()
    ok["_key"] = [label_of(r) for _, r in ok.iterrows()] if not ok.empty else []
    header = label_header + [h for m in metric_cols for h in COLUMNS[m]] + list(extra_header)
    rows = []
    for k in order:
        sub = ok[ok["_key"] == k]
        row: list[Any] = list(label_text(k))
        for m in metric_cols:
            st = stat(sub[m].astype(float).tolist(), digits=2 if m == "adv_reject" else 1)
            row += [st if st.n > 1 else (st.mean if st.n == 1 else float("nan")), paper_cols(k, m)]
        if extra:
            row += extra(k, sub)
        rows.append(row)
    others = ok[~ok["_key"].isin(list(order))] if not ok.empty else ok
    note = list(notes) + _pending_note(df)
    if not others.empty:
        note.append(f"Runs matching no row of this table: {', '.join(others['name'])}.")
    return label_averages(Table(key, title, header, rows, note), df, metric_cols)


def table5(df: pd.DataFrame) -> Table:
    ok = _complete(df)
    max_it = int(ok["outer_iterations"].max()) if not ok.empty else 0
    order = ["Full UnifiedPlayers", *(label for label, _ in TABLE5_PREDICATES)]
    return _simple_table(
        "table5", "Table 5: Component ablations of UnifiedPlayers", df,
        lambda r: table5_label(r, max_it), order, ["Method"], lambda k: [k],
        lambda k, m: paper.TABLE5[k][0 if m == "math_avg" else 1], ["math_avg", "general_avg"],
        notes=[f"Ours: full method at {max_it} outer iteration(s); mean over seeds where several ran."])


def table15(df: pd.DataFrame) -> Table:
    def own_rules(k, sub):
        vals = sub["adv_reject_train"].astype(float).dropna().tolist()
        return [float(np.mean(vals)) if vals else float("nan")]

    ok = _complete(df)
    unmeasured = ok[ok["adv_reject"].astype(float).isna()] if not ok.empty else ok
    notes = ["Adv. Reject (ours): mean ρ_adv (Eq. 11) of the final Evaluation player's valid verifiers on ONE fixed "
             "held-out set (ablations/data/table15_heldout.jsonl: 12 tasks, each perturbed by all five rules), "
             "whatever rules the run trained with (ablations/adv_reject.py). The last column is training's "
             "evaluation/rho_adv over the last outer iteration, on the run's own rules (0 by construction "
             "without rules): not comparable across rows."]
    if not unmeasured.empty:
        notes.append(f"Adv. Reject not measured for: {', '.join(unmeasured['name'])} "
                     "(python -m ablations.adv_reject measure <run dir>).")
    return _simple_table(
        "table15", "Table 15: Effect of perturbation-rule subsets", df, lambda r: r["perturbation"],
        list(paper.TABLE15), ["Perturbation Rules"], lambda k: [paper.TABLE15[k][0]],
        lambda k, m: paper.TABLE15[k][1 if m == "math_avg" else 2], ["math_avg", "adv_reject"],
        extra=own_rules, extra_header=["ρ_adv in training (own rules)"], notes=notes)


def table16(df: pd.DataFrame) -> Table:
    ok = _complete(df)
    return _simple_table(
        "table16", "Table 16: Effect of the Evaluation player's pool size M", df, lambda r: int(r["num_verifiers"]),
        list(paper.TABLE16), ["M"], lambda k: [f"{k} (used)" if k == paper.TABLE16_USED else str(k)],
        lambda k, m: paper.TABLE16[k][0 if m == "math_avg" else 1], ["math_avg", "general_avg"],
        extra=lambda k, sub: [_compute_cell(sub), int(paper.TABLE16[k][2])],
        extra_header=[_compute_header(ok if not ok.empty else df), "GPU-h (paper)"])


def _weights(r: Any) -> tuple[float, float, float]:
    return (round(float(r["alpha"]), 3), round(float(r["beta"]), 3), round(float(r["gamma"]), 3))


def table17(df: pd.DataFrame) -> Table:
    return _simple_table(
        "table17", "Table 17: Sensitivity to the Evaluation reward coefficients (α, β, γ)", df, _weights,
        list(paper.TABLE17), ["Configuration", "α", "β", "γ"], lambda k: [paper.TABLE17[k][0], *map(str, k)],
        lambda k, m: paper.TABLE17[k][1 if m == "math_avg" else 2], ["math_avg", "general_avg"])


# --------------------------------------------------------------------------------------------------
# Table 1 (and 2): every method's eval results, through the harness's own table writer

def table1(root: str | Path, out_dir: Path, backbone: Optional[str] = None) -> str:
    """Tables 1 and 2 from every ``eval/results.json`` under ``root`` (``eval.tables``); returns the markdown."""
    rows, bb = [], backbone
    paths = sorted(Path(root).rglob(f"{rundir.EVAL}/{RESULTS_FILE}"))
    if not paths:
        raise FileNotFoundError(f"no {rundir.EVAL}/{RESULTS_FILE} under {root}: evaluate the runs first")
    for p in paths:
        res = json.loads(p.read_text())
        bb = bb or res.get("backbone")
        rows.extend(rows_from_results(res))
    written = write_tables(rows, bb, Path(out_dir))
    text = written["markdown"].read_text()
    (Path(out_dir) / "table1.md").write_text(text)
    (Path(out_dir) / "table1.tex").write_text(written["latex"].read_text())
    return text


TABLES = {"table3": table3, "table5": table5, "table15": table15, "table16": table16, "table17": table17}


def write_table(table: Table, out_dir: Path, frame: Optional[pd.DataFrame] = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out_dir / f"{table.key}.md", "latex": out_dir / f"{table.key}.tex"}
    paths["markdown"].write_text(table.to_markdown(), encoding="utf-8")
    paths["latex"].write_text(table.to_latex(), encoding="utf-8")
    if frame is not None:
        paths["csv"] = out_dir / f"{table.key}.runs.csv"
        frame.to_csv(paths["csv"], index=False)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description="Aggregate a sweep's run directories into one of the paper's tables")
    ap.add_argument("table", choices=sorted([*TABLES, "table1"]))
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=None, help="output directory (default: the sweep directory)")
    ap.add_argument("--mode", default=None, help="eval mode to read (default: tool when present, else vanilla)")
    ap.add_argument("--backbone", default=None, help="Table 1: the paper backbone whose rows go beside ours")
    args = ap.parse_args(argv)
    out = Path(args.out or args.sweep_dir)
    if args.table == "table1":
        text = table1(args.sweep_dir, out, args.backbone)
        print(text)
        return text
    frame = load_sweep(args.sweep_dir, args.mode)
    table = TABLES[args.table](frame)
    paths = write_table(table, out, frame)
    print(table.to_markdown())
    print(table.to_latex())
    print(f"[aggregate] wrote {', '.join(str(p) for p in paths.values())}")
    return table.to_markdown()


if __name__ == "__main__":
    main()
