"""The measured seconds of each test file, which ``make test`` uses to hand the heaviest files to its xdist workers
first (tests/conftest.py): with ``--dist loadfile`` a file runs whole on one worker, and a heavy file started last
leaves the other worker idle until it ends.

    make test PYTEST_ARGS=--durations=0 | tee /tmp/suite.log
    python tests/file_seconds.py /tmp/suite.log          # rewrites tests/file_seconds.json

A file missing from the table (a new one) counts as :data:`DEFAULT_SECONDS`; a stale table only costs balance,
never a test.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
DEFAULT_SECONDS = 1.0
_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:call|setup|teardown)\s+(tests/[^:\s]+\.py)::")


def per_file(log: str) -> dict[str, float]:
    """``{test file: seconds}`` summed over the ``--durations=0`` lines (setup, call and teardown) of a pytest log."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        match = _LINE.match(line)
        if match:
            out[match.group(2)] = out.get(match.group(2), 0.0) + float(match.group(1))
    return out


def load(path: Path = TABLE) -> dict[str, float]:
    """The table, or {} when it is missing or unreadable."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    seconds = per_file(Path(argv[0]).read_text())
    if not seconds:
        print(f"{argv[0]}: no --durations=0 lines (run pytest with --durations=0)", file=sys.stderr)
        return 1
    TABLE.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=0) + "\n")
    print(f"{TABLE}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
