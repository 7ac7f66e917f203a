"""Fixtures of the feedback-core tests (trajectory, perturbation, verifier, verdict, rewards, records)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sandbox():
    """One warm sandbox for the feedback tests; short timeout so looping checks end fast."""
    from unifiedplayers.sandbox import Sandbox, SandboxConfig

    with Sandbox(SandboxConfig(timeout_s=2, memory_mb=512)) as sb:
        yield sb
