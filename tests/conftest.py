"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module: tiny GEMMs gain nothing from intra-op threads
    and stall on a busy machine; timings are comparable across runs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
