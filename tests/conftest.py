"""Shared fixtures."""

from __future__ import annotations

import contextlib
import fcntl
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


@contextlib.contextmanager
def _cores_lock(tmp_path_factory, kind: int):
    """`fcntl.flock` of `kind` on a file every xdist worker of this session shares (beside
    their own temporary folders); nothing where the session has one process."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    path = tmp_path_factory.getbasetemp().parent / "cores.lock"
    with open(path, "a") as held:
        fcntl.flock(held, kind)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@pytest.fixture
def cores_alone(tmp_path_factory):
    """For a test that keeps every core busy on purpose (processes spinning beside a run):
    no test that asks for `cores_calm` runs meanwhile on another xdist worker, whose
    words a 2-core machine's spinners could decide (on CI a claim's 5-s run read a 60x
    faster call as inconclusive, its samples swinging 2-5x under some other test's load)."""
    with _cores_lock(tmp_path_factory, fcntl.LOCK_EX):
        yield


@pytest.fixture
def cores_calm(tmp_path_factory):
    """For a test that asserts a word a real run times: it waits for any `cores_alone`
    test to end, and holds one off while it runs (tests asking for this run together)."""
    with _cores_lock(tmp_path_factory, fcntl.LOCK_SH):
        yield
