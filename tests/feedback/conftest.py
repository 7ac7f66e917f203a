"""Fixtures of the feedback-core tests (trajectory, perturbation, verifier, verdict, rewards, records)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Under --import-mode=importlib test directories are not on sys.path; the tests import their shared
# data module (paper_examples.py) by name.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def sandbox():
    """One warm sandbox for the feedback tests; short timeout so looping checks end fast."""
    from unifiedplayers.sandbox import Sandbox, SandboxConfig

    with Sandbox(SandboxConfig(timeout_s=2, memory_mb=512)) as sb:
        yield sb
