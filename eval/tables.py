"""Scores tables laid out like the paper's Table 1 (math) and Table 2 (general), in markdown and LaTeX.

Rows are methods; the three tick columns are Tool / External teacher / Learned verifier; then one
column per benchmark and AVG. The paper's rows of the same backbone are printed beside ours (ours
right under the paper row of the same method, marked "(ours)"); where the paper has no row for our
backbone or method only our rows appear. AVG over a row with missing benchmarks is the mean of the
ones present, marked ``*``. The best value per column is in bold, as in the paper.

Also a command: ``python -m eval.tables RESULTS.json [RESULTS.json ...] --out DIR`` merges the rows of
several evaluation runs into one pair of tables.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from eval import paper_numbers as paper
from eval.benchmarks import REGISTRY


@dataclass
class ScoreRow:
    label: str  # method name, e.g. "Vanilla", "Tool-augmented", "UnifiedPlayers"
    scores: dict[str, float]  # paper column title -> points
    ticks: tuple[int, int, int] = (0, 0, 0)
    source: str = "ours"  # "ours" | "paper"
    offline: dict[str, float] = field(default_factory=dict)  # offline subsets: title -> points


TABLES = {
    "math": ("Table 1: mathematical reasoning", paper.MATH_COLUMNS, paper.TABLE1),
    "general": ("Table 2: general-domain reasoning", paper.GENERAL_COLUMNS, paper.TABLE2),
}


def default_ticks(label: str, mode: str) -> tuple[int, int, int]:
    """Tool / External teacher / Learned verifier ticks of a row: the paper's for a method it lists
    (they do not depend on the backbone), else just whether tools were used."""
    for name, ticks, _, _ in paper.TABLE1["Qwen3-4B-Base"]:
        if name == label:
            return ticks
    return (1 if mode == "tool" else 0, 0, 0)


def _avg(values: Sequence[Optional[float]]) -> tuple[Optional[float], bool]:
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None, False
    return sum(present) / len(present), len(present) < len(values)


def _rows_for(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> list[tuple[str, tuple, list, Optional[float], bool, str]]:
    """(label, ticks, values, avg, partial, source) in display order."""
    _, columns, table = TABLES[kind]
    paper_rows = table.get(backbone or "", [])
    out = []
    placed = set()
    for name, ticks, scores, avg in paper_rows:
        out.append((name, ticks, list(scores), avg, False, "paper"))
        for i, row in enumerate(ours):
            if row.label == name:
                values = [row.scores.get(c) for c in columns]
                a, partial = _avg(values)
                out.append((row.label, row.ticks, values, a, partial, "ours"))
                placed.add(i)
    for i, row in enumerate(ours):
        if i not in placed:
            values = [row.scores.get(c) for c in columns]
            if all(v is None for v in values):
                continue
            a, partial = _avg(values)
            out.append((row.label, row.ticks, values, a, partial, "ours"))
    return out


def _fmt(v: Optional[float]) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _best(rows, ncols: int) -> list[Optional[float]]:
    best = []
    for j in range(ncols + 1):
        vals = [(r[2] + [r[3]])[j] for r in rows]
        vals = [v for v in vals if v is not None and not math.isnan(v)]
        best.append(max(vals) if vals else None)
    return best


def markdown_table(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> str:
    title, columns, table = TABLES[kind]
    rows = _rows_for(kind, ours, backbone)
    header = ["Method", *paper.TICK_COLUMNS, *columns, "AVG"]
    lines = [f"**{title}** ({backbone or 'no backbone'})", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    best = _best(rows, len(columns))
    for label, ticks, values, avg, partial, source in rows:
        cells = [f"{label} ({source})"] + ["✓" if t else "✗" for t in ticks]
        for j, v in enumerate(values + [avg]):
            s = _fmt(v) + ("*" if j == len(values) and partial else "")
            cells.append(f"**{s}**" if v is not None and v == best[j] and len(rows) > 1 else s)
        lines.append("| " + " | ".join(cells) + " |")
    if not table.get(backbone or ""):
        lines.append("")
        lines.append(f"The paper reports no {kind} row for backbone {backbone!r}; only our rows are shown.")
    if any(r[4] for r in rows):
        lines.append("")
        lines.append("\\* AVG over the benchmarks evaluated in this run only.")
    return "\n".join(lines) + "\n"


def _tex_escape(s: str) -> str:
    return s.replace("&", "\\&").replace("%", "\\%").replace("_", "\\_").replace("#", "\\#")


def latex_table(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> str:
    title, columns, _ = TABLES[kind]
    rows = _rows_for(kind, ours, backbone)
    best = _best(rows, len(columns))
    spec = "l" + "c" * 3 + "c" * len(columns) + "c"
    out = [
        "% " + title + " (generated by eval/tables.py; needs \\usepackage{booktabs,amssymb})",
        "\\begin{tabular}{" + spec + "}",
        "\\toprule",
        "Model Name & Tool & Ext. & Ver. & " + " & ".join(_tex_escape(c) for c in columns) + " & AVG \\\\",
        "\\midrule",
        f"\\multicolumn{{{len(columns) + 5}}}{{l}}{{\\textit{{{_tex_escape(backbone or 'ours')}}}}} \\\\",
    ]
    for label, ticks, values, avg, partial, source in rows:
        cells = [_tex_escape(label) + (" (ours)" if source == "ours" else "")]
        cells += ["$\\checkmark$" if t else "$\\times$" for t in ticks]
        for j, v in enumerate(values + [avg]):
            s = _fmt(v).replace("–", "--") + ("$^*$" if j == len(values) and partial else "")
            cells.append(f"\\textbf{{{s}}}" if v is not None and v == best[j] and len(rows) > 1 else s)
        out.append(" & ".join(cells) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out) + "\n"


def offline_markdown(ours: Sequence[ScoreRow]) -> str:
    titles = sorted({t for r in ours for t in r.offline})
    if not titles:
        return ""
    lines = ["**Offline subsets** (not paper columns; for smoke checks only)", "",
             "| Method | " + " | ".join(titles) + " |", "|" + "---|" * (len(titles) + 1)]
    for r in ours:
        if r.offline:
            lines.append(f"| {r.label} (ours) | " + " | ".join(_fmt(r.offline.get(t)) for t in titles) + " |")
    return "\n".join(lines) + "\n"


def rows_from_results(results: dict) -> list[ScoreRow]:
    """ScoreRows of one ``results.json`` written by ``eval.run`` (one row per mode)."""
    rows = []
    for mode, info in results["modes"].items():
        scores, offline = {}, {}
        for name, res in info["benchmarks"].items():
            bench = REGISTRY[name]
            if bench.table == "offline":
                offline[bench.title] = res["score"]
            else:
                scores[bench.paper_column or bench.title] = res["score"]
        rows.append(ScoreRow(label=info["label"], scores=scores, ticks=tuple(info["ticks"]), offline=offline))
    return rows


def write_tables(rows: Sequence[ScoreRow], backbone: Optional[str], out_dir: Path) -> dict[str, Path]:
    """Write ``scores.md`` and ``scores.tex`` (both tables) into ``out_dir``."""
    md = "\n".join([markdown_table("math", rows, backbone), markdown_table("general", rows, backbone),
                    offline_markdown(rows)])
    tex = "\n".join([latex_table("math", rows, backbone), latex_table("general", rows, backbone)])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scores.md").write_text(md, encoding="utf-8")
    (out_dir / "scores.tex").write_text(tex, encoding="utf-8")
    return {"markdown": out_dir / "scores.md", "latex": out_dir / "scores.tex"}


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results.json files written by python -m eval.run")
    ap.add_argument("--out", required=True, help="directory for scores.md and scores.tex")
    ap.add_argument("--backbone", default=None, help="paper backbone to print beside ours (default: the first run's)")
    args = ap.parse_args(argv)
    rows, backbone = [], args.backbone
    for path in args.results:
        res = json.loads(Path(path).read_text())
        backbone = backbone or res.get("backbone")
        rows.extend(rows_from_results(res))
    paths = write_tables(rows, backbone, Path(args.out))
    print(paths["markdown"].read_text())


if __name__ == "__main__":
    main()
