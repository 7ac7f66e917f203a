"""The run directory's one module (``unifiedplayers.rundir``): its JSONL reader and repair, and that every file of a
run is named there only (a second definition of a name is how a reader and a writer drift apart)."""
from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest

from unifiedplayers import rundir

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
# Where runs are written or read: the package, the evaluation and the ablations.
READERS = [p for folder in ("src/unifiedplayers", "eval", "ablations") for p in sorted((ROOT / folder).rglob("*.py"))
           if p != ROOT / "src/unifiedplayers/rundir.py"]
FILE_NAMES = {v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str) and "." in v}


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_whole_lines_are_read_in_order_and_blank_lines_skipped(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"update": 0}\n\n{"update": 1}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [m["update"] for m in rundir.read_jsonl(path)] == [0, 1]
        assert rundir.read_jsonl(tmp_path / "absent.jsonl", missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        rundir.read_jsonl(tmp_path / "absent.jsonl")


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"update": 0}\n{"update": 1, "to')
    with pytest.warns(RuntimeWarning, match="torn last line"):
        assert rundir.read_jsonl(path) == [{"update": 0}]


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"update": 0}\n{"update": 1}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [m["update"] for m in rundir.read_jsonl(path)] == [0, 1]


@pytest.mark.parametrize("bad", ['{"update": 1, "to', "[1, 2]"])
def test_a_bad_line_before_the_last_is_corruption_named_by_its_line(tmp_path, bad):
    path = _write(tmp_path / "m.jsonl", '{"update": 0}\n' + bad + '\n{"update": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: not a JSON object"):
        rundir.read_jsonl(path)


def test_repair_cuts_a_torn_tail_and_completes_a_whole_one(tmp_path):
    torn = _write(tmp_path / "torn.jsonl", '{"a": 1}\n{"a": ')
    with pytest.warns(RuntimeWarning, match="torn"):
        rundir.repair_tail(torn)
    assert torn.read_text() == '{"a": 1}\n'
    whole = _write(tmp_path / "whole.jsonl", '{"a": 1}\n{"a": 2}')
    rundir.repair_tail(whole)
    assert whole.read_text() == '{"a": 1}\n{"a": 2}\n'
    with open(whole, "a") as f:
        f.write(json.dumps({"a": 3}) + "\n")
    assert [m["a"] for m in rundir.read_jsonl(whole)] == [1, 2, 3]


@pytest.mark.parametrize("text, keep, left, dropped", [
    ("a\nb\nc\n", 3, "a\nb\nc\n", 0),  # exactly the lines it holds: untouched
    ("a\nb\nc\n", 2, "a\nb\n", 1),
    ("a\nb\nc\n", 1, "a\n", 2),
    ("a\nb\nc\n", 0, "", 3),
    ("a\n\nc\n", 2, "a\n\n", 1),  # a blank line is a line
    ("a\nb\nc", 2, "a\nb\n", 0),  # a torn last line is cut, but not counted as dropped
    ("a\nb\nc", 1, "a\n", 1),
    ("c", 0, "", 0),
    ("", 0, "", 0),
])
def test_truncate_keeps_the_first_complete_lines_by_hand(tmp_path, text, keep, left, dropped):
    path = _write(tmp_path / "m.jsonl", text)
    assert rundir.truncate_lines(path, keep) == dropped
    assert path.read_text() == left
    assert rundir.count_lines(path) == keep


@pytest.mark.parametrize("text, keep, lines", [("a\nb\nc\n", 4, 3), ("a\nb\nc", 3, 2), ("", 1, 0)])
def test_truncate_refuses_more_lines_than_the_file_holds(tmp_path, text, keep, lines):
    path = _write(tmp_path / "m.jsonl", text)
    with pytest.raises(ValueError, match=f"has {lines} complete lines but the run state counts {keep}"):
        rundir.truncate_lines(path, keep)
    assert path.read_text() == text  # left as it was


def test_truncate_a_missing_file(tmp_path):
    assert rundir.truncate_lines(tmp_path / "m.jsonl", 0) == 0
    assert not (tmp_path / "m.jsonl").exists()
    with pytest.raises(ValueError, match="missing but the run state counts 1 lines"):
        rundir.truncate_lines(tmp_path / "m.jsonl", 1)


def test_checkpoint_paths():
    assert str(rundir.block_checkpoint(2, "execution")) == "checkpoints/iter2/execution"
    assert str(rundir.resume_checkpoint("planning", "b")) == "checkpoints/resume/planning-b"
    assert rundir.PUBLISHED == "checkpoints/published"


def _literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module, docstrings aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(node, clean=False) is not None}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_other_module_spells_a_run_file_name():
    """``"state.pt"`` written anywhere but in rundir.py is a second definition (messages and f-strings aside)."""
    found = [f"{path.relative_to(ROOT)}:{line}: {value!r}" for path in READERS for line, value in _literals(path)
             if value in FILE_NAMES]
    assert not found, "use the names of unifiedplayers.rundir:\n" + "\n".join(found)
