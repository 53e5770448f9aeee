"""How a harness command ends: exit codes, `--version`, input errors, signals, child processes.

Every command exits with one of these codes, listed in its `--help`, so that CI can tell
a finding from a crash:

    0  pass (or: done)
    1  the command's own check failed: a regression, a variant that fails, a target missed
    2  usage or input error: one line naming the option or file, what was expected and
       what was received (no traceback)
    3  internal error: an unexpected exception, a bug; the traceback is printed
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM, 129 by SIGHUP, after cleaning up

`command` wraps a command's `main(argv) -> int` to keep that contract: `UsageError` ->
2, an unexpected exception -> traceback and 3, SIGTERM and SIGHUP raised as `Terminated`
(a KeyboardInterrupt) so that every `finally` and `with` block cleans up as on Ctrl-C;
an error a library raises as a signal unwinds it is still the signal's 130 or 143
(`interruption`). `run_module` is a `python -m` command's whole body: a signal while
its imports load is 130, one while the interpreter exits is ignored (`ignore_signals`).
`add_version` and `epilog` give the parser its `--version` and exit-code list.

For inputs and outputs: `read_json` (a file's JSON, or a UsageError naming the file and
whether it is missing, not UTF-8, empty or truncated) and `check_writable` /
`check_writable_folder` (fail before the work, not after it). For cleanup: `run_group`
(a child in its own process group, killed with everything it started on any way out)
and `signals_deferred` (a cleanup that a second signal must not cut short).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

PASS, FAILED, USAGE, INTERNAL = 0, 1, 2, 3
DISTRIBUTION = "esper-bench"
#: signals that `command` turns into `Terminated` (SIGINT already raises KeyboardInterrupt)
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class UsageError(Exception):
    """Bad input (an option, a file, a revision): exit 2, one line, no traceback.

    The message names what was wrong, what was expected and what was received, and
    where there is one, the command that fixes it.
    """


class Nonsense(RuntimeError):
    """A number the command was about to print makes no sense (a word against its own
    interval, a floor a call beats): a bug of the harness, exit 3, said plainly."""

    def __init__(self, what: str, problems: Sequence[str]) -> None:
        super().__init__(f"{what}: refused to print numbers that make no sense: "
                         + "; ".join(problems))
        self.problems = list(problems)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt.

    A KeyboardInterrupt so that code which cleans up after Ctrl-C (`subprocess.run`
    killing its child, `finally` blocks) does the same after a termination signal.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def version() -> str:
    """The installed esper-bench version (importlib.metadata)."""
    import importlib.metadata  # here, not above: it would double the import of this module

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed: pip install -e .)"


def add_version(parser) -> None:
    """`--version`: prints `PROG VERSION` and exits 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")


def epilog(done: str = "pass", failed: str | None = None) -> str:
    """The exit-code list for a parser's epilog (use argparse.RawDescriptionHelpFormatter).

    `done` says what 0 means; `failed` what 1 means, or None where the command never fails
    a check of its own.
    """
    lines = ["exit status:", f"  0    {done}"]
    if failed is not None:
        lines.append(f"  1    {failed}")
    lines += [
        f"  {USAGE}    usage or input error (the message names the option or file, what was "
        "expected and what was received)",
        f"  {INTERNAL}    internal error: an unexpected exception, a bug (the traceback is printed)",
        "  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); 129 hung up (SIGHUP); "
        "each after cleaning up",
    ]
    return "\n".join(lines)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


#: the signals `signals_raise` turned into exceptions while the current command ran
_received: list[int] = []


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While inside, SIGINT raises KeyboardInterrupt and SIGTERM and SIGHUP `Terminated`
    in the main thread, each noted (`interruption`).

    A signal whose handler is not Python's default (SIG_IGN under nohup, a handler someone
    installed) is left alone; the previous handlers come back on the way out.
    """
    if not _in_main_thread():  # signal handlers can only be set from the main thread
        yield
        return

    def raise_interrupt(signum, frame):
        _received.append(signum)
        raise KeyboardInterrupt

    def raise_terminated(signum, frame):
        _received.append(signum)
        raise Terminated(signum)

    previous = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupt)
    for signum in TERMINATING:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, raise_terminated)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while inside: a cleanup that must not be cut short.

    A signal that arrives meanwhile is delivered (and raises) on the way out. It is held
    by a handler that only notes it, not by the thread's signal mask: the kernel hands a
    signal the main thread blocks to another thread (torch's OpenMP workers), and Python
    then runs the handler in the main thread all the same, inside the block.
    """
    if not _in_main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, *TERMINATING):
        handler = signal.getsignal(signum)
        if handler is not None and handler is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])


def loading() -> contextlib.AbstractContextManager[None]:
    """While modules with C++ extensions load (torch, matplotlib, numba: seconds), a
    signal waits for the end (`signals_deferred`): raised in Python code that the
    extension's C++ called, a KeyboardInterrupt ended the process with "terminate called
    after throwing an instance of 'pybind11::error_already_set'" (SIGABRT, 134)."""
    return signals_deferred()


def interruption(err: BaseException) -> KeyboardInterrupt | None:
    """The interruption behind `err`, or None: `err` itself when it is a KeyboardInterrupt
    (Ctrl-C, or SIGTERM/SIGHUP as `Terminated`); one in its chain of causes and contexts
    (a library's clean-up that raised while the interrupt unwound it: a profiler stopped
    halfway); else, when a signal reached this command (`signals_raise`), that signal: a
    library's C++ code may turn the KeyboardInterrupt raised in a Python callback into an
    error of its own, with no chain left to follow."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    if _received:
        return KeyboardInterrupt() if _received[0] == signal.SIGINT else Terminated(_received[0])
    return None


def forget_interrupted_eval() -> None:
    """Clear CPython's mark of an unhandled KeyboardInterrupt, once one has been handled.

    CPython (3.11 at least) marks a KeyboardInterrupt that leaves an `exec` or `eval` of a
    string (dataclasses, namedtuple, jinja2 and torch make code that way, while they
    import or render) as unhandled even when a caller handles it; a `python -m` process
    then ends by killing itself with SIGINT instead of exiting with its status (130, or
    what the command returned). The next `exec` of a string clears the mark.
    """
    exec("None")


def ignore_signals() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP from now on: for a process whose command has
    returned its status and which is only exiting. Python's exit (collecting the
    garbage of torch and the other libraries) takes seconds, and with its own handlers
    gone by then, a signal during it killed the process (-2 instead of its status);
    ignored, it cannot change a result already made."""
    if not _in_main_thread():
        return
    for signum in (signal.SIGINT, *TERMINATING):
        signal.signal(signum, signal.SIG_IGN)


def command(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap a command's `main(argv) -> int` in the exit-code contract (module docstring)."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        _received.clear()
        try:
            with signals_raise(), pipe_safe_stdout():
                return main(argv)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return USAGE
        except Nonsense as err:  # a bug, found before it was printed: no traceback needed
            print(f"internal error (exit {INTERNAL}): {err}", file=sys.stderr)
            return INTERNAL
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM/SIGHUP as Terminated
            return _stopped(err)
        except Exception as err:
            stopped = interruption(err)
            if stopped is not None:  # a library raised its own error as the signal unwound it
                return _stopped(stopped, f" ({type(err).__name__} as it stopped: {err})")
            # a bug: say so, with the traceback, and exit 3 (not 1: no finding)
            traceback.print_exc()
            print(f"internal error (exit {INTERNAL}): an unexpected exception in "
                  f"{main.__module__} ({DISTRIBUTION} {version()}), not a finding about the "
                  "code under test; the traceback above says where", file=sys.stderr)
            return INTERNAL

    return run


def _stopped(err: KeyboardInterrupt, detail: str = "") -> int:
    """Say that the command was stopped by a signal; its exit status, 128 + the signal."""
    forget_interrupted_eval()
    signum = getattr(err, "signum", signal.SIGINT)
    print(f"{signal.Signals(signum).name}: stopped, after cleaning up (temporary folders, "
          f"worktrees, child processes){detail}", file=sys.stderr)
    return 128 + signum


def run_module(name: str, argv: list[str] | None = None) -> int:
    """Import the command module `name` and call its `main(argv)`: a `__main__`'s whole
    body, which then only exits with the status returned. Ctrl-C while the module's
    imports load (matplotlib, torch: seconds) ends the command once they have loaded
    (`loading`), exit 130 with one line, not a traceback from an import (SIGTERM: 143).
    Once `main` has returned, signals are ignored as the process exits (`ignore_signals`):
    the status stands."""
    try:
        try:
            with signals_raise(), loading():
                module = importlib.import_module(name)
        except KeyboardInterrupt as err:
            forget_interrupted_eval()
            signum = getattr(err, "signum", signal.SIGINT)
            print(f"{signal.Signals(signum).name}: stopped while loading the command; nothing "
                  "was done", file=sys.stderr)
            return 128 + signum
        return module.main(argv)
    except KeyboardInterrupt as err:  # one that came as `main` returned
        return _stopped(err)
    finally:  # once the process exits (Python's exit runs the last registered first), not
        # now: a caller that goes on (a test calling a command) keeps its signals
        atexit.register(ignore_signals)


class _PipeSafe:
    """A text stream that, once its reader has gone (`command | head`), drops what is
    written instead of raising BrokenPipeError: the command finishes its work (results,
    the report) whatever happens to its printout."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def pipe_safe_stdout() -> Iterator[None]:
    """While inside, standard output survives a reader that closes the pipe; on the way
    out, a broken pipe's stdout is pointed at /dev/null so that Python's own final flush
    stays quiet."""
    original = sys.stdout
    safe = _PipeSafe(original)
    sys.stdout = safe
    try:
        yield
    finally:
        safe.flush()
        sys.stdout = original
        if safe._gone:
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, original.fileno())
                os.close(devnull)


# ------------------------------------------------------------------------------ input files

def read_json(path: Path, fix: str = "") -> object:
    """The JSON document in `path`; UsageError naming the file and what is wrong with it.

    Tells an empty or truncated file (the text ends before the document does), text that
    is not UTF-8 and a path that cannot be read apart. `fix` ("recreate it with ...") is
    appended to the message.
    """
    suffix = f"; {fix}" if fix else ""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as err:
        raise UsageError(f"{path}: no such file{suffix}") from err
    except IsADirectoryError as err:
        raise UsageError(f"{path}: expected a JSON file; got a folder{suffix}") from err
    except OSError as err:
        raise UsageError(f"{path}: cannot be read ({err.strerror or err}){suffix}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: expected UTF-8 JSON text; got byte 0x{raw[err.start]:02x} "
                         f"at offset {err.start}, not UTF-8 (a binary or corrupt file){suffix}") from err
    if not text.strip():
        raise UsageError(f"{path}: expected a JSON document; the file is empty{suffix}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        why = ("; it looks truncated (the text ends inside a string, object or list)"
               if _ends_inside(text) else "")
        raise UsageError(f"{path}: not valid JSON: {err.msg} (line {err.lineno}, column "
                         f"{err.colno}){why}{suffix}") from err


def _ends_inside(text: str) -> bool:
    """Whether JSON `text` stops inside a string or with an object or list still open:
    what a file cut short by a full disk or a killed writer looks like."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if escaped:  # the character after a backslash in a string
            escaped = False
        elif in_string:
            escaped = char == "\\"
            in_string = char != '"'
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return in_string or depth > 0


def elided(text: str, most: int = 100) -> str:
    """`text`, or its start and end around '...' when it is longer than `most`: a value
    quoted in a one-line message."""
    return text if len(text) <= most else f"{text[:most * 3 // 5]}...{text[-most * 3 // 10:]}"


def too_long(path: Path) -> str | None:
    """What makes `path` too long for the file system (a name over its NAME_MAX, or the
    whole over PATH_MAX once made absolute), said for a message; None when it fits."""
    absolute = os.path.abspath(path)
    existing = Path(absolute)
    while not os.path.isdir(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # no such limits to ask for: the common ones
        name_max, path_max = 255, 4096
    shown = elided(str(path))
    longest = max((len(os.fsencode(part)) for part in Path(absolute).parts), default=0)
    if longest > name_max:
        return (f"{shown!r}, a path with a name of {longest} bytes; this file system takes "
                f"names of at most {name_max} (too long)")
    if len(os.fsencode(absolute)) >= path_max:
        return (f"{shown!r}, a path of {len(os.fsencode(absolute))} bytes; this file system "
                f"takes paths of fewer than {path_max} (too long)")
    return None


def check_writable(path: Path, option: str) -> None:
    """UsageError, before any work is done, when the file `path` cannot be written.

    Probes the folder that would hold it (its first existing ancestor, where folders
    would be created) by creating and deleting a file there: permissions alone do not
    tell (root may write anywhere but /proc, a read-only mount refuses everyone).
    """
    check_fits(path, option)
    if path.is_dir():
        raise UsageError(f"{option}: expected a file to write; got {path}, a folder")
    _probe(path.parent, path, option, "a file in a folder")


def check_writable_folder(folder: Path, option: str) -> None:
    """UsageError, before any work is done, when files cannot be written into `folder`
    (an existing folder, or one that would be created): it is a file, it lies under a
    file, or its first existing ancestor refuses a new file."""
    check_fits(folder, option)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option}: expected a folder; got {folder}, a file")
    _probe(folder, folder, option, "a folder")


def check_fits(path: Path, option: str) -> None:
    """UsageError naming `option` when `path` is too long for the file system (before
    anything asks the file system about it: it answers with OSError ENAMETOOLONG)."""
    long = too_long(path)
    if long is not None:
        raise UsageError(f"{option}: expected a path the file system can hold; got {long}")


def _probe(folder: Path, path: Path, option: str, expected: str) -> None:
    """Create and delete a file in `folder`'s first existing ancestor; UsageError if refused."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{option}: expected {expected}; got {path} ({folder} is not a folder)")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise UsageError(f"{option}: expected a writable location; got {path} "
                         f"({folder}: {err.strerror or err})") from err


# -------------------------------------------------------------------------- child processes

def die_with_parent(parent: int | None, started_by: str) -> None:
    """No child process outlives the command that started it (`started_by`, "the run",
    "the gate", ...), even one killed outright: on Linux the kernel kills this process
    when its parent dies (PR_SET_PDEATHSIG); a parent that died before that was set shows
    as a parent pid other than `parent`, and this process exits at once."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        sys.exit(f"{started_by} that started this process (pid {parent}) is gone")


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state, field 3, first),
    or None where the process is gone or /proc cannot say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def kill_group(process: subprocess.Popen) -> None:
    """Kill the process group `process` leads (it and anything it started), then reap it."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has already exited
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_group(args: Sequence[str], grace_s: float = 0.0,
              **popen: object) -> subprocess.CompletedProcess:
    """`subprocess.run(args, capture_output=True, text=True)` in a process group of its own.

    Whatever way this returns or raises (an exception, Ctrl-C, SIGTERM as `Terminated`),
    the child and every process it started are killed: nothing is left running. With
    `grace_s` > 0, a way out by an exception first sends the group SIGINT and gives it up
    to `grace_s` seconds to end by itself (a harness command then cleans up and marks its
    run interrupted, rather than leaving it killed).
    """
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        if grace_s > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=grace_s)
        raise
    finally:
        kill_group(process)
    return subprocess.CompletedProcess(list(args), process.returncode, stdout, stderr)
