"""The docs match the code: every Markdown page a reader follows (README.md, CONTRIBUTING.md, docs/, the READMEs of
eval/, benchmarks/, experiments/ and examples/) is read for what it quotes in backticks, and

- every ``make <target>`` exists in Makefile or mk/*.mk (as ``make -p`` lists them);
- every Hydra override ``key=value`` / ``key.sub=value`` whose first key is one of the config's composes, with the
  other overrides of the same backticked span, over ``experiment=tiny`` (``eval=smoke`` for eval.run's keys);
- every repository path (a token with a ``/`` under a top-level folder of the repository, or a file name ending
  in .py, .yaml, .sh, .md, .json, .cff, .toml) exists, relative to the repository, the page, or the package;
- no page names an issue number of the project's tracker.

Allowed: run outputs (``runs/...``, the names a run writes), placeholders (``<...>``, ``DIR``, ``N``), and the
deliberately wrong settings that docs/troubleshooting.md shows failing.
"""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / "src" / "unifiedplayers"


def doc_pages() -> list[Path]:
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    pages += [REPO / d / "README.md" for d in ("eval", "benchmarks", "experiments")]
    pages += sorted((REPO / "examples").glob("**/README.md"))
    return [p for p in pages if p.exists()]


PAGES = doc_pages()
PAGE_IDS = [str(p.relative_to(REPO)) for p in PAGES]

# Settings the docs show failing on purpose (docs/troubleshooting.md): override -> what it illustrates.
DELIBERATELY_WRONG = {
    "schedule.planing_updates=2": "a misspelled key names the right one",
    "+schedule.planing_updates=1": "a +key past the schema",
    "+foo=1": "a +key past the schema",
    "+method.extra.x=1": "an unknown method setting",
}

# File names a run or a command writes (not files of the repository).
RUN_OUTPUTS = {
    "summary.json", "summary.md", "results.json", "scores.md", "scores.tex", "figure1.json", "figure1_ablation.json",
    "table1.md", "table3.md", "config.yaml", "gpu_check.json", "launch.log",
}



@functools.lru_cache(maxsize=None)
def root_keys() -> tuple[frozenset[str], frozenset[str]]:
    """The first keys of training's config (its top-level keys and conf/ groups) and those only eval.run has."""
    from eval.config import register_eval_configs

    from unifiedplayers.config import compose

    register_eval_configs()
    groups = {d.name for d in (REPO / "conf").iterdir() if d.is_dir()}
    train = set(compose(["experiment=tiny"]).keys()) | (groups - {"eval"})
    evaluate = set(compose(["eval=smoke"], config_name="evaluate").keys()) | {"eval"}
    return frozenset(train), frozenset(evaluate - train)

OVERRIDE = re.compile(r"^([+~]?)([a-z_][a-z0-9_]*)((?:\.[a-z0-9_]+)*)=(.+)$")
MAKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*=(.*)$", re.S)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, N, URL, G_T
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)
PATH_SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".md", ".json", ".cff", ".toml")
TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} - {"runs"}
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def code_spans(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every inline code span (outside fenced blocks)."""
    spans = []
    for lineno, line in enumerate(FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).splitlines(), 1):
        spans += [(lineno, s) for s in re.findall(r"`([^`]+)`", line)]
    return spans


def fenced_lines(text: str) -> list[tuple[int, str]]:
    out = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        out += [(first + i, line) for i, line in enumerate(m.group(0).splitlines())]
    return out


def tokens(span: str) -> list[str]:
    """Shell words of a span; a make variable's value (``ARGS="a=b c=d"``) is split into its own words."""
    try:
        words = shlex.split(span)
    except ValueError:
        words = span.split()
    out = []
    for w in words:
        m = MAKE_VAR.match(w)
        out += tokens(m.group(1)) if m and "=" in m.group(1) else [w]
    return out


@functools.lru_cache(maxsize=None)
def make_targets() -> frozenset[str]:
    dump = subprocess.run(["make", "-pRrq", "-C", str(REPO), ":"], capture_output=True, text=True).stdout
    return frozenset(re.findall(r"^([a-zA-Z0-9][\w.-]*):(?!=)", dump, re.M))


# ---------------------------------------------------------------------------------------------- extraction
def named_targets(text: str) -> list[tuple[int, str]]:
    found = []
    for lineno, chunk in [*code_spans(text), *fenced_lines(text)]:
        found += [(lineno, t) for t in re.findall(r"(?<![\w./-])make\s+([a-z][a-z0-9_-]*)(?![\w<{*-])", chunk)]
    return found


def override_sets(text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, root, overrides)`` per backticked span that quotes overrides: ``root`` is the entry point whose
    config they belong to (``config``: training, ``evaluate``: eval.run); a value ``a|b`` gives one set per
    alternative."""
    out = []
    for lineno, span in code_spans(text):
        found = []
        train_keys, eval_only_keys = root_keys()
        for word in tokens(span):
            word = word.rstrip(":,;")  # an override quoted inside a message: `sandbox.timeout_s=0.0: need > 0`
            m = OVERRIDE.match(word)
            if not m or m.group(2) not in train_keys | eval_only_keys or word in DELIBERATELY_WRONG:
                continue
            value = m.group(4)
            key = word[: len(word) - len(value) - 1]
            alternatives = value.split("|") if "|" in value and "[" not in value else [value]
            alternatives = [v for v in alternatives if v and "<" not in v and "..." not in v and not PLACEHOLDER.match(v)]
            if alternatives:
                found.append([f"{key}={v}" for v in alternatives])
        if not found:
            continue
        root = "evaluate" if any(o[0].lstrip("+~").split(".")[0].split("=")[0] in eval_only_keys for o in found) \
            else "config"
        width = max(len(alts) for alts in found)
        for i in range(width):
            out.append((lineno, root, tuple(alts[min(i, len(alts) - 1)] for alts in found)))
    return out


def repo_paths(text: str) -> list[tuple[int, str]]:
    """Tokens of backticked spans that name a file or folder of the repository."""
    out = []
    for lineno, span in code_spans(text):
        for word in span.split():
            word = word.strip("\"',;:()")
            word = word.split("::")[0]  # a pytest node id names its file
            if (not word or word.startswith(("runs/", ".", "-", "/", "~", "$")) or "=" in word
                    or any(c in word for c in "<>*{}[]|$") or "..." in word or "://" in word):
                continue
            if "/" in word:
                first = word.split("/")[0]
                if first in TOP_LEVEL or word.rstrip("/").endswith(PATH_SUFFIXES):
                    out.append((lineno, word))
            elif word.endswith(PATH_SUFFIXES) and re.match(r"^[\w.-]+$", word):
                out.append((lineno, word))
    return out


@functools.lru_cache(maxsize=None)
def repo_file_names() -> frozenset[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True).stdout.split()
    return frozenset(Path(p).name for p in listed)


def path_exists(word: str, page: Path) -> bool:
    if "/" not in word:
        return word in repo_file_names() or word in RUN_OUTPUTS
    rel = word.rstrip("/")
    return any((base / rel).exists() for base in (REPO, page.parent, PACKAGE_DIR, PACKAGE_DIR.parent))


@functools.lru_cache(maxsize=None)
def composes(root: str, overrides: tuple[str, ...]) -> str:
    """'' when the overrides compose, else the error's first line."""
    from unifiedplayers.config import compose

    keys = {o.lstrip("+~").split("=")[0] for o in overrides}
    try:
        if root == "evaluate":
            from eval.config import register_eval_configs

            register_eval_configs()
            base = [] if "eval" in keys else ["eval=smoke"]
            compose([*base, *overrides], config_name="evaluate")
        else:
            base = [] if "experiment" in keys else ["experiment=tiny"]
            compose([*base, *overrides])
    except Exception as exc:  # noqa: BLE001 - any composition error is the finding
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return ""


# ---------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_make_target_named_exists(page):
    missing = [f"{page.name}:{line}: make {t}" for line, t in named_targets(page.read_text(encoding="utf-8"))
               if t not in make_targets()]
    assert not missing, "targets not in Makefile or mk/*.mk:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_quoted_override_composes(page):
    failed = []
    for line, root, overrides in override_sets(page.read_text(encoding="utf-8")):
        error = composes(root, overrides)
        if error:
            failed.append(f"{page.name}:{line}: `{' '.join(overrides)}`: {error}")
    assert not failed, "overrides that do not compose:\n" + "\n".join(failed)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_quoted_repository_path_exists(page):
    missing = [f"{page.name}:{line}: {word}" for line, word in repo_paths(page.read_text(encoding="utf-8"))
               if not path_exists(word, page)]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_page_names_an_issue_number(page):
    found = [f"{page.name}:{n}: {m.group(0)}" for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in ISSUE.finditer(line)]
    assert not found, "a reader cannot look these up:\n" + "\n".join(found)


def test_the_readers_catch_what_they_look_for():
    text = ("Run `make run ARGS=\"schedule.feedback=fresh|stale run_dir=runs/x\"` and read `conf/nope.yaml`, "
            "`eval/README.md`, `planning/U`.\n```bash\nmake nope-target\n```\n")
    assert ("nope-target" in [t for _, t in named_targets(text)]) and "run" in [t for _, t in named_targets(text)]
    assert [o for _, _, o in override_sets(text)] == [("schedule.feedback=fresh", "run_dir=runs/x"),
                                                      ("schedule.feedback=stale", "run_dir=runs/x")]
    assert [w for _, w in repo_paths(text)] == ["conf/nope.yaml", "eval/README.md"]
    assert not path_exists("conf/nope.yaml", REPO / "README.md") and path_exists("eval/README.md", REPO / "README.md")
    assert ISSUE.search("as issue 22 asked") and ISSUE.search("issue #7") and not ISSUE.search("an issue with it")
