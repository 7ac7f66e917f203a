"""Outer-loop tests: the shared scripted engine (tests/players/scripted.py) importable by name, and one
torch thread (the tiny model gains nothing from more, and a loaded 2-core machine loses a lot)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "players"))
sys.path.insert(0, str(Path(__file__).parent))  # toy_reward


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
