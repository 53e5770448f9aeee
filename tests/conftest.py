"""Shared fixtures."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """Every test leaves SIGINT, SIGTERM and SIGHUP as it found them: a handler one test
    left behind would change how a later test's command answers a signal, and that test,
    not this one, would fail."""
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in watched}
    yield
    changed = {signal.Signals(signum).name: (before[signum], signal.getsignal(signum))
               for signum in watched if signal.getsignal(signum) != before[signum]}
    assert not changed, f"signal handlers left changed (before, after): {changed}"


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module: tiny GEMMs gain nothing from intra-op threads
    and stall on a busy machine; timings are comparable across runs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def outside_the_repository(tmp_path_factory):
    """The current folder: an empty folder of a user's, outside this repository (whose
    pyproject.toml names the review's findings module, which would be loaded too). The
    modules under tests/ still import, here (pytest put the repository on sys.path) and
    in the processes a test starts (PYTHONPATH). Restored by hand, not by monkeypatch,
    whose undo of a test's registry edits must not wait for this fixture."""
    before, path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(tmp_path_factory.mktemp("user-project"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), path) if p)
    yield Path.cwd()
    os.chdir(before)
    if path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = path
