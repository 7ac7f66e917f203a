"""Trainer tests: make the shared helper module (trainer_helpers.py) importable by name."""
from __future__ import annotations

import sys
from pathlib import Path

# Under --import-mode=importlib test directories are not on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny model is far faster on one thread, and so is the whole suite on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
