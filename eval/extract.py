"""The program of a HumanEval completion (Appendix G.2). Answers of the other benchmarks are extracted by
:mod:`unifiedplayers.feedback.answers`, so that the diagnostic pool grades exactly as the harness does."""
from __future__ import annotations

import re
from typing import Optional

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|```)", re.S)


def code_blocks(text: str, langs: tuple[str, ...] = ("python", "py", "python3", "")) -> list[str]:
    """Contents of the closed fenced code blocks of ``text`` whose language id is in ``langs``."""
    return [m.group(2) for m in _FENCE_RE.finditer(text) if m.group(1).lower() in langs]


def humaneval_program(prompt: str, completion: str, entry_point: str) -> str:
    """The program to test for a HumanEval problem: the last fenced Python block defining ``entry_point`` (in tool
    mode the model may test and then fix its function), after the prompt's lines before its ``def`` (imports,
    helpers); else, as in the original protocol, ``prompt + completion`` cut at the first line that leaves the
    function (a top-level statement other than a ``def``, decorator or comment)."""
    blocks = code_blocks(completion)
    for block in reversed(blocks):
        if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", block, flags=re.M):
            header = prompt.split(f"def {entry_point}", 1)[0]
            return header + "\n" + block.rstrip() + "\n"
    return prompt + (blocks[0] if blocks else _cut_at_top_level(completion))


def _cut_at_top_level(completion: str) -> str:
    """Keep the completion up to the first non-indented line that is not code of the function (a fence ends it)."""
    kept = []
    for line in completion.split("\n"):
        if line and not line[0].isspace() and not line.startswith(("def ", "@", "#")):
            break
        kept.append(line)
    return "\n".join(kept)
