"""Golden-run tests: the comparison, the scripted engine and the stub Teacher importable by name, one torch thread."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # golden_compare
sys.path.insert(0, str(Path(__file__).parents[1] / "players"))  # scripted
sys.path.insert(0, str(Path(__file__).parents[1] / "methods"))  # stub_teacher


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
