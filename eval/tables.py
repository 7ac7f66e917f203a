"""Scores tables laid out like the paper's Table 1 (math) and Table 2 (general), in markdown and LaTeX.

Rows are methods; the tick columns are Tool / External teacher / Learned verifier; then one column per benchmark
and AVG. The paper's rows of one ``backbone`` are printed beside ours: a row of ours on that backbone goes right
under the paper row of its method, a row on another backbone after them, in a group of its own ("Rows keep their
backbone" in eval/README.md). A partial AVG is marked ``*``; the best value per column and backbone group is bold.

``python -m eval.tables RESULTS.json [RESULTS.json ...] --out DIR`` merges the rows of several evaluation runs.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from eval import paper_numbers as paper
from unifiedplayers.data.benchmarks import REGISTRY


# conf/method name -> the row label of Tables 1 and 2
METHOD_LABELS = {
    "vanilla": "Vanilla", "tool_augmented": "Tool-augmented", "absolute_zero": "Absolute Zero",
    "r_zero": "R-Zero", "socratic_zero": "Socratic-Zero", "agent0": "Agent0", "unifiedplayers": "UnifiedPlayers",
}


@dataclass
class ScoreRow:
    label: str  # method name, e.g. "Vanilla", "Tool-augmented", "UnifiedPlayers"
    scores: dict[str, float]  # paper column title -> points
    ticks: tuple[int, int, int] = (0, 0, 0)
    source: str = "ours"  # "ours" | "paper"
    offline: dict[str, float] = field(default_factory=dict)  # offline subsets: title -> points
    backbone: Optional[str] = None  # the model the row ran on (None: unknown, taken as the table's)


def same_backbone(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two model names are one backbone (``Qwen/Qwen3-4B-Base`` and ``qwen3-4b-base`` are)."""
    if a is None or b is None:
        return False
    return a.rsplit("/", 1)[-1].strip().lower() == b.rsplit("/", 1)[-1].strip().lower()


def _row_backbone(row: ScoreRow, table_backbone: Optional[str]) -> Optional[str]:
    return row.backbone if row.backbone is not None else table_backbone


TABLES = {
    "math": ("Table 1: mathematical reasoning", paper.MATH_COLUMNS, paper.TABLE1),
    "general": ("Table 2: general-domain reasoning", paper.GENERAL_COLUMNS, paper.TABLE2),
}


def default_ticks(label: str, mode: str) -> tuple[int, int, int]:
    """Tool / External teacher / Learned verifier ticks of one of our rows. Tool: whether this evaluation
    used the sandbox (its mode), so a row never claims a tool it did not have; the other two: the
    paper's for a method it lists (they do not depend on the backbone), else none."""
    tool = 1 if mode == "tool" else 0
    for name, ticks, _, _ in paper.TABLE1["Qwen3-4B-Base"]:
        if name == label:
            return (tool, ticks[1], ticks[2])
    return (tool, 0, 0)


def _avg(values: Sequence[Optional[float]]) -> tuple[Optional[float], bool]:
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None, False
    return sum(present) / len(present), len(present) < len(values)


def _rows_for(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> list[tuple]:
    """(label, ticks, values, avg, partial, source, row backbone) in display order (module docstring)."""
    _, columns, table = TABLES[kind]
    paper_rows = table.get(backbone or "", [])
    out = []
    placed = set()

    def ours_row(row: ScoreRow) -> tuple:
        values = [row.scores.get(c) for c in columns]
        a, partial = _avg(values)
        return (row.label, row.ticks, values, a, partial, "ours", _row_backbone(row, backbone))

    for name, ticks, scores, avg in paper_rows:
        out.append((name, ticks, list(scores), avg, False, "paper", backbone))
        for i, row in enumerate(ours):
            if row.label == name and same_backbone(_row_backbone(row, backbone), backbone):
                out.append(ours_row(row))
                placed.add(i)
    for i, row in enumerate(ours):
        if i not in placed and not all(row.scores.get(c) is None for c in columns):
            out.append(ours_row(row))
    return out


def _source_text(source: str, row_backbone: Optional[str], backbone: Optional[str]) -> str:
    if source == "paper" or row_backbone is None or same_backbone(row_backbone, backbone):
        return source
    return f"{source}, {row_backbone}"


def _fmt(v: Optional[float]) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _best(rows, ncols: int) -> dict[str, list[Optional[float]]]:
    """Per backbone group (normalised name), the best value of each column and of AVG."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault((r[6] or "").rsplit("/", 1)[-1].lower(), []).append(r)
    best: dict[str, list[Optional[float]]] = {}
    for g, members in groups.items():
        col = []
        for j in range(ncols + 1):
            # a partial AVG (over fewer benchmarks, marked *) does not compete with full ones
            vals = [(r[2] + [r[3]])[j] for r in members if not (j == ncols and r[4])]
            vals = [v for v in vals if v is not None and not math.isnan(v)]
            col.append(max(vals) if vals and len(members) > 1 else None)
        best[g] = col
    return best


def _is_best(best, row, j: int, v: Optional[float]) -> bool:
    if j == len(row[2]) and row[4]:
        return False
    b = best[(row[6] or "").rsplit("/", 1)[-1].lower()][j]
    return v is not None and b is not None and v == b


def _notes(kind: str, rows, backbone: Optional[str]) -> list[str]:
    _, columns, table = TABLES[kind]
    notes = []
    if not table.get(backbone or ""):
        notes.append(f"The paper reports no {kind} row for backbone {backbone!r}; only our rows are shown.")
    others = sorted({r[6] for r in rows if r[5] == "ours" and r[6] and not same_backbone(r[6], backbone)})
    if others and table.get(backbone or ""):
        notes.append(f"Our rows marked with another backbone ({', '.join(others)}) did not run on {backbone}: "
                     f"the paper's {backbone} rows are for reference, not a comparison.")
    for r in rows:
        if r[4]:  # a partial AVG
            present = [c for c, v in zip(columns, r[2]) if v is not None and not math.isnan(v)]
            notes.append(f"\\* {r[0]} ({_source_text(r[5], r[6], backbone)}): AVG over {', '.join(present)} only, "
                         f"not the paper's {len(columns)} ({', '.join(columns)}).")
    return notes


def render_markdown(heading: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = (),
                    sections: Optional[dict[int, str]] = None) -> str:
    """A markdown table of already formatted cells under ``heading``, then the ``notes``, one per line. ``sections``
    maps a row index to a label printed in a row of its own above that row (at ``len(rows)``: after the last row).
    Shared with the ablations' tables (``ablations.aggregate.Table``)."""
    sections = sections or {}
    lines = [heading, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i in range(len(rows) + 1):
        if i in sections:
            lines.append(f"| *{sections[i]}* |" + " |" * (len(header) - 1))
        if i < len(rows):
            lines.append("| " + " | ".join(rows[i]) + " |")
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines) + "\n"


def render_latex(title: str, generator: str, header: Sequence[str], rows: Sequence[Sequence[str]],
                 sections: Optional[dict[int, str]] = None, comments: Sequence[str] = ()) -> str:
    """A booktabs ``tabular`` of already formatted LaTeX cells under a comment naming ``title`` and ``generator``,
    followed by ``comments`` as ``%`` lines; ``sections`` as in :func:`render_markdown` (an italic spanning label,
    after a rule unless it is the first)."""
    sections = sections or {}
    n = len(header)
    out = [
        f"% {title} (generated by {generator}; needs \\usepackage{{booktabs,amssymb}})",
        "\\begin{tabular}{l" + "c" * (n - 1) + "}",
        "\\toprule",
        " & ".join(header) + " \\\\",
        "\\midrule",
    ]
    for i in range(len(rows) + 1):
        if i in sections:
            if i:
                out.append("\\midrule")
            out.append(f"\\multicolumn{{{n}}}{{l}}{{\\textit{{{sections[i]}}}}} \\\\")
        if i < len(rows):
            out.append(" & ".join(rows[i]) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    out += ["% " + c for c in comments]
    return "\n".join(out) + "\n"


def _body(kind: str, rows: list[tuple], backbone: Optional[str], latex: bool) -> list[list[str]]:
    """The formatted cells of ``rows`` (:func:`_rows_for`), in markdown or LaTeX."""
    best = _best(rows, len(TABLES[kind][1]))
    body = []
    for row in rows:
        label, ticks, values, avg, partial, source, row_bb = row
        if latex:
            tag = "" if source == "paper" else f" ({_tex_escape(_source_text(source, row_bb, backbone))})"
            cells = [_tex_escape(label) + tag] + ["$\\checkmark$" if t else "$\\times$" for t in ticks]
        else:
            cells = [f"{label} ({_source_text(source, row_bb, backbone)})"] + ["✓" if t else "✗" for t in ticks]
        for j, v in enumerate(values + [avg]):
            s = _fmt(v).replace("–", "--") if latex else _fmt(v)
            s += ("$^*$" if latex else "*") if j == len(values) and partial else ""
            bold = f"\\textbf{{{s}}}" if latex else f"**{s}**"
            cells.append(bold if _is_best(best, row, j, v) else s)
        body.append(cells)
    return body


def markdown_table(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> str:
    title, columns, table = TABLES[kind]
    rows = _rows_for(kind, ours, backbone)
    header = ["Method", *paper.TICK_COLUMNS, *columns, "AVG"]
    ours_bb = sorted({r[6] for r in rows if r[5] == "ours" and r[6]})
    heading = (f"**{title}** (paper rows: {backbone if table.get(backbone or '') else 'none'}; "
               f"our rows: {', '.join(ours_bb) or '–'})")
    return render_markdown(heading, header, _body(kind, rows, backbone, False), _notes(kind, rows, backbone))


def _tex_escape(s: str) -> str:
    return s.replace("&", "\\&").replace("%", "\\%").replace("_", "\\_").replace("#", "\\#")


def latex_table(kind: str, ours: Sequence[ScoreRow], backbone: Optional[str]) -> str:
    title, columns, _ = TABLES[kind]
    rows = _rows_for(kind, ours, backbone)
    header = ["Model Name", "Tool", "Ext.", "Ver.", *(_tex_escape(c) for c in columns), "AVG"]
    comments = [n.replace("\\*", "*") for n in _notes(kind, rows, backbone)]
    return render_latex(title, "eval/tables.py", header, _body(kind, rows, backbone, True),
                        sections={0: _tex_escape(backbone or "ours")}, comments=comments)


def offline_markdown(ours: Sequence[ScoreRow]) -> str:
    titles = sorted({t for r in ours for t in r.offline})
    if not titles:
        return ""
    body = []
    for r in ours:
        if r.offline:
            tag = f"ours, {r.backbone}" if r.backbone else "ours"
            body.append([f"{r.label} ({tag})", *(_fmt(r.offline.get(t)) for t in titles)])
    return render_markdown("**Offline subsets** (not paper columns; for smoke checks only)", ["Method", *titles], body)


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
        rows.append(ScoreRow(label=info["label"], scores=scores, ticks=tuple(info["ticks"]), offline=offline,
                             backbone=results.get("model")))
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
