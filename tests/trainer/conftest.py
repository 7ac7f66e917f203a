"""Trainer tests: one torch thread (their shared helpers are ``tests.trainer.trainer_helpers``)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny model is far faster on one thread, and so is the whole suite on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
