"""A signal ends a command in 130 or 143 after its clean-up, whatever it interrupts.

What `harness.exits` must hold against: a signal that the main thread holds off but
another thread receives (torch's OpenMP workers), a library that turns the interrupt
into an error of its own, CPython marking an interrupted `exec` of a string as an
unhandled Ctrl-C (a `python -m` command then died by SIGINT after saying 130), a signal
while the interpreter exits, and one while a command's imports load. The last three
need real `python -m` processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.exits import command, run_module, signals_deferred

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_a_signal_held_by_signals_deferred_raises_after_the_block_even_with_other_threads(
        tmp_path):
    """The kernel gives a signal the main thread blocks to another thread (here a waiting
    Python thread; in a run, torch's OpenMP workers); Python then ran the handler in the
    main thread inside the block. It must wait for the block's end. A process of its own:
    under pytest the signal did not reach the other thread, so the old way passed."""
    done = _python_m(tmp_path, "deferred", """
        import os, signal, threading, time
        from harness.exits import signals_deferred

        stop = threading.Event()
        other = threading.Thread(target=stop.wait)  # a thread that does not block signals
        other.start()
        finished = []
        try:
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + 0.3
                while time.monotonic() < deadline:  # Python code runs, checking for signals
                    pass
                finished.append("the block")
        except KeyboardInterrupt:
            print("KeyboardInterrupt after", finished)
        stop.set()
        other.join()
    """)
    assert done.stdout == "KeyboardInterrupt after ['the block']\n", done.stderr


def _interrupted_then(error: str):
    """A command that is interrupted, and then raises `error` as a library would."""

    @command
    def main(argv=None) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the signal's KeyboardInterrupt lands here
        except KeyboardInterrupt:
            if error == "while unwinding":  # e.g. a profiler's __exit__ that fails halfway
                raise RuntimeError("profiler: stop() called twice")
        raise RuntimeError("the C++ side saw a Python error")  # the chain lost in C++
    return main


@pytest.mark.parametrize("error", ["while unwinding", "with no chain"])
def test_an_error_a_library_raises_as_the_interrupt_unwinds_it_is_still_exit_130(error, capsys):
    # Ctrl-C as an interactive shell leaves it: a job a script starts in the background
    # (a CI runner's, say) begins with SIGINT ignored, which a command leaves alone
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert _interrupted_then(error)([]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert err.startswith("SIGINT: stopped, after cleaning up") and "RuntimeError" in err
    assert "internal error" not in err and "Traceback" not in err


def test_a_command_run_in_this_process_leaves_the_signal_handlers_as_they_were(capsys):
    """`run_module` ignores signals only once the process exits: a caller that goes on
    (the console script called in a test) keeps Ctrl-C."""
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in handled}
    assert run_module("harness.cli", ["--version"]) == 0
    assert capsys.readouterr().out.startswith("esper-bench ")
    assert {signum: signal.getsignal(signum) for signum in handled} == before


def _python_m(tmp_path: Path, module: str, source: str, *args: str,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m module` written from `source` in `tmp_path`, with this checkout importable."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
               **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.integration
def test_ctrl_c_inside_an_exec_of_a_string_is_exit_130_not_death_by_sigint(tmp_path):
    """dataclasses, namedtuple, jinja2 and torch run code made as strings: a Ctrl-C there
    left CPython's mark of an unhandled interrupt, and the process killed itself with
    SIGINT after the command had said 130."""
    done = _python_m(tmp_path, "interrupted_exec", """
        import sys
        from harness.exits import command

        @command
        def main(argv=None):
            exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\n"
                 "for _ in range(10**7): pass")
            return 0

        sys.exit(main())
    """)
    assert done.returncode == 130, done.stderr
    assert done.stderr.startswith("SIGINT: stopped, after cleaning up")


@pytest.mark.integration
def test_a_signal_while_the_interpreter_exits_does_not_change_the_status(tmp_path):
    """Python's exit collects torch's garbage for seconds, with its own handlers gone: a
    Ctrl-C then killed a command that had finished its work (-2 instead of 0)."""
    done = _python_m(tmp_path, "late_signal", """
        import os, signal, sys, time
        from harness.exits import command, run_module

        class SignalAtExit:
            # deleted with __main__'s globals, after Python's signal handlers are gone
            def __del__(self, kill=os.kill, pid=os.getpid(), sleep=time.sleep):
                kill(pid, signal.SIGINT)
                sleep(0.2)

        @command
        def main(argv=None):
            print("done")
            return 0

        if __name__ == "__main__":
            late = SignalAtExit()
            sys.exit(run_module("late_signal"))
    """)
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr


@pytest.mark.integration
def test_ctrl_c_while_harness_run_imports_torch_is_exit_130_and_one_line(tmp_path):
    """The signal lands as `python -m harness.run` starts to import torch (a finder the
    interpreter consults at that import sends it), before the command's code runs."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import os, signal, sys

        class InterruptTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch":
                    sys.meta_path.remove(self)
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, InterruptTorch())
    """))
    environ = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "harness.run", "--list"], cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr == "SIGINT: stopped while loading the command; nothing was done\n"
    assert done.stdout == ""


@pytest.mark.integration
@pytest.mark.parametrize("grace_s, cleaned", [(30.0, True), (0.0, False)])
def test_run_group_interrupted_lets_its_child_clean_up_within_the_grace(tmp_path, grace_s,
                                                                         cleaned):
    """Ctrl-C while `run_group` waits: with a grace, the child's group gets SIGINT and ends
    by itself (a harness command marks its run interrupted); without, it is killed. Either
    way nothing is left running."""
    done = _python_m(tmp_path, "interrupted_group", f"""
        import os, signal, sys, threading, time
        from harness.exits import run_group

        CHILD = (
            "import os, signal, sys, time\\n"
            "def cleanup(signum, frame):\\n"
            "    open('cleaned', 'w').close()\\n"
            "    sys.exit(130)\\n"
            "signal.signal(signal.SIGINT, cleanup)\\n"
            "open('ready', 'w').write(str(os.getpid()))\\n"
            "time.sleep(60)\\n")

        def interrupt_once_ready():
            while not os.path.exists("ready"):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_ready, daemon=True).start()
        try:
            run_group([sys.executable, "-c", CHILD], grace_s={grace_s})
        except KeyboardInterrupt:
            pid = int(open("ready").read())
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            print("interrupted; cleaned:", os.path.exists("cleaned"), "alive:", alive)
    """)
    assert done.stdout == f"interrupted; cleaned: {cleaned} alive: False\n", done.stderr
