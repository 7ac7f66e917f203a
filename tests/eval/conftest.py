"""The harness lives in the repository's ``eval/`` directory, not in the installed package (pytest puts the
repository on the path: ``pythonpath`` in pyproject.toml); their HumanEval ``sandbox`` fixture is here."""
import pytest

from unifiedplayers.sandbox import Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        yield sb
