"""`harness.run` in a real child process without paying its imports each time.

The fault-injection tests stop runs with real signals at random moments, many times. A
`forkserver` that has imported harness (and torch) once forks each child from that
state, so a child starts measuring in milliseconds instead of seconds. The child is an
ordinary process: SIGINT, SIGTERM and SIGKILL reach it as they would reach
`python -m harness.run`; its stderr goes to a file the test reads as it grows.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys

import harness.run  # noqa: F401 (preloaded by the fork server)

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload([__name__, "harness.run"])


def _main(argv: list[str], stderr_path: str) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    for name in ("SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    err = open(stderr_path, "w", buffering=1)
    os.dup2(err.fileno(), 2)
    sys.stderr = err
    sys.stdout = open(os.devnull, "w")
    sys.exit(harness.run.main(argv))


def start(argv: list[str], stderr_path: str) -> multiprocessing.Process:
    """Start `harness.run.main(argv)` in a forked child; its exit code is `exitcode`
    (negative: killed by that signal)."""
    process = CONTEXT.Process(target=_main, args=(argv, stderr_path))
    process.start()
    return process
