"""Outer-loop tests: one torch thread (the tiny model gains nothing from more, and a loaded 2-core machine loses
a lot)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
