"""Make the Execution tool probe's set, ``eval/probes/data/execution_tool.jsonl`` (run once; versioned in the repo).

    python -m eval.probes.make_tool_set        # rewrites execution_tool.jsonl and its sha256 in manifest.json

A probe where a tool decides correctness: :data:`N_ITEMS` word problems, each a chain of three to five exact integer
operations on three- to five-digit numbers, where running the arithmetic in Python beats working it out token by
token. The file is a pure function of :data:`SEED`; its sha256 goes into ``manifest.json``. Each line holds ``id``,
``template``, ``question``, ``answer`` (the exact integer, as a string), ``expression`` (``[op, left, right]`` with
``op`` one of ``+ - * //`` and ``pct``, ``[pct, p, x]`` = p % of x; :func:`evaluate`) and ``operations``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any, Callable, Union

DATA_DIR = Path(__file__).resolve().parent / "data"
FILENAME = "execution_tool.jsonl"
SEED = 20260922
N_ITEMS = 50  # as each half of execution.jsonl (50 GSM8K + 50 MMLU): SE <= 7 points per rate

Expr = Union[int, list]


def evaluate(expr: Expr) -> int:
    """The integer value of ``expr``; a division or percentage that is not exact raises ValueError."""
    if isinstance(expr, bool) or not isinstance(expr, (int, list)):
        raise TypeError(f"not an expression: {expr!r}")
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "//":
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not exact")
        return a // b
    if op == "pct":
        if (a * b) % 100:
            raise ValueError(f"{a} % of {b} is not an integer")
        return a * b // 100
    raise ValueError(f"unknown operation {op!r}")


def count_operations(expr: Expr) -> int:
    return 0 if isinstance(expr, int) else 1 + count_operations(expr[1]) + count_operations(expr[2])


def _divisor_between(r: random.Random, n: int, lo: int, hi: int) -> int:
    """A divisor of ``n`` in [lo, hi] drawn uniformly, or 0 when there is none."""
    found = [d for d in range(lo, hi + 1) if n % d == 0]
    return r.choice(found) if found else 0


def _fit(r: random.Random, total: int, divisor: int, lo: int, hi: int) -> int:
    """An amount c in [lo, hi], c < total, with (total − c) divisible by ``divisor`` (0 when none exists)."""
    base = total % divisor
    ks = [k for k in range(0, hi // divisor + 1) if lo <= base + k * divisor <= min(hi, total - 1)]
    return base + r.choice(ks) * divisor if ks else 0


# Templates: (question, expression) from drawn numbers, or None to draw again


def _t_factory(r: random.Random) -> Any:
    a, b, c, e = r.randint(120, 980), r.randint(100, 365), r.randint(100, 999), r.randint(100, 999)
    d = _fit(r, a * b * c, e, 100, 99999)
    if not d:
        return None
    return (f"A factory packs {a} boxes a day for {b} days. Each box holds {c} bolts. {d} of the bolts fail "
            f"inspection and the rest are shared equally among {e} crates. How many bolts go into each crate?",
            ["//", ["-", ["*", ["*", a, b], c], d], e])


def _t_fees(r: random.Random) -> Any:
    a, b, p = r.randint(40, 399) * 25, r.randint(25, 249) * 4, r.randint(11, 89)
    rest = a * b * (100 - p) // 100
    e = _divisor_between(r, rest, 100, 999)
    if not e:
        return None
    total = ["*", a, b]
    return (f"A town has {a} households and each pays {b} dollars in fees a year. {p}% of the money goes to "
            f"road repair and the rest is split equally among {e} parks. How many dollars does each park get?",
            ["//", ["-", total, ["pct", p, total]], e])


def _t_shop(r: random.Random) -> Any:
    a, b, c, d = r.randint(100, 9999), r.randint(100, 999), r.randint(100, 9999), r.randint(100, 999)
    f = r.randint(1000, 99999)
    return (f"A store sold {a} shirts at {b} dollars each and {c} jackets at {d} dollars each, then refunded "
            f"{f} dollars to unhappy customers. How many dollars did it take in after the refunds?",
            ["-", ["+", ["*", a, b], ["*", c, d]], f])


def _t_printer(r: random.Random) -> Any:
    b, c = r.randint(100, 999), r.randint(120, 999)
    step = c // math.gcd(b, c)  # a * b is a multiple of c when a is one of step
    ks = [k for k in range(1, 99999 // step + 1) if 100 <= k * step <= 9999]
    if not ks:
        return None
    a, d = r.choice(ks) * step, r.randint(100, 9999)
    return (f"A printer prints {a} pages an hour for {b} hours. The pages are bound into books of {c} pages "
            f"each, and the library already owns {d} books. How many books does it own after the binding?",
            ["+", ["//", ["*", a, b], c], d])


def _t_savings(r: random.Random) -> Any:
    a, b, p, e = r.randint(40, 399) * 25, r.randint(25, 130) * 4, r.randint(5, 45), r.randint(100, 999)
    saved = a * b * p // 100
    c = _fit(r, saved, e, 1000, 99999)
    if not c:
        return None
    return (f"Lena earns {a} dollars a week for {b} weeks and saves {p}% of it. She spends {c} dollars of her "
            f"savings on equipment and shares the rest equally among {e} charities. How many dollars does each "
            f"charity receive?", ["//", ["-", ["pct", p, ["*", a, b]], c], e])


def _t_warehouse(r: random.Random) -> Any:
    a, b, c, d = r.randint(1000, 9999), r.randint(100, 999), r.randint(100, 999), r.randint(100, 999)
    f, g = r.randint(100, 9999), r.randint(100, 999)
    if c * d >= a * b:
        return None
    return (f"A warehouse holds {a} crates of {b} cans each. It ships out {c} boxes of {d} cans, then receives "
            f"{f} crates of {g} cans each. How many cans does it hold now?",
            ["+", ["-", ["*", a, b], ["*", c, d]], ["*", f, g]])


TEMPLATES: list[Callable[[random.Random], Any]] = [_t_factory, _t_fees, _t_shop, _t_printer, _t_savings, _t_warehouse]


def tool_items(n: int = N_ITEMS, seed: int = SEED) -> list[dict[str, Any]]:
    """``n`` problems, the templates in turn, each drawn again until its numbers fit and its text is new."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(items) < n:
        template = TEMPLATES[len(items) % len(TEMPLATES)]
        drawn = template(rng)
        if drawn is None or drawn[0] in seen:
            continue
        question, expr = drawn
        answer = evaluate(expr)
        if answer <= 0:
            continue
        seen.add(question)
        items.append({"id": f"toolprobe-{len(items):03d}", "template": template.__name__[3:], "question": question,
                      "expression": expr, "operations": count_operations(expr), "answer": str(answer)})
    return items


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_tool_set(out_dir: Path = DATA_DIR) -> str:
    """Write ``execution_tool.jsonl`` into ``out_dir`` and its sha256 into ``out_dir/manifest.json``; returns it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in tool_items()))
    digest = sha256(path)
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"version": 1, "sha256": {}}
    manifest.setdefault("sha256", {})[FILENAME] = digest
    manifest.setdefault("made_by_file", {})[FILENAME] = "python -m eval.probes.make_tool_set"
    manifest.setdefault("seeds", {})[FILENAME] = SEED
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return digest


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    print(f"{args.out / FILENAME}: sha256 {write_tool_set(args.out)}")


if __name__ == "__main__":
    main()
