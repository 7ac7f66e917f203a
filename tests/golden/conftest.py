"""Golden-run tests: one torch thread."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
