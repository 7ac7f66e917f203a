"""The harness lives in the repository's ``eval/`` directory, not in the installed package; the tests' shared
helper (eval_compose.py) sits in this folder, and their HumanEval ``sandbox`` fixture is here."""
import sys
from pathlib import Path

import pytest

from unifiedplayers.sandbox import Sandbox, SandboxConfig

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# Under --import-mode=importlib test directories are not on sys.path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        yield sb
