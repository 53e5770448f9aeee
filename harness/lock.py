"""One writer per folder: the lock a command takes before it writes into a folder.

A run folder (`harness.run`, new or `--resume`), a reports folder (`harness.report`) and
the folder of a file the gate writes (`--update-baseline`, `--json`) each have at most one
writer at a time. Before writing, a command takes the folder's lock:

    with hold(folder, "--resume 20261124-031403-cpu"):   # the input, in the user's words
        ...                                             # write into folder

The lock is an advisory `flock` on `folder/.esper-bench.lock`, a small JSON file naming
its holder (pid, command line, host, since when). A second writer gets `FolderLocked`
(a UsageError: exit 2) naming the holder's pid and command, before it has changed
anything. Readers never take the lock, so they never wait.

The kernel drops an flock when its holder's process ends, however it ends: a holder
killed by SIGKILL leaves its file behind (stale, naming a process that is gone), and the
next writer takes the lock over and says so on stderr, naming the process that was
killed. A holder that ends normally, or by Ctrl-C or SIGTERM, removes the file. Holds
of one folder nest within a process (a run that renders its report while holding its
run folder, a test that resumes a run it made).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.exits import UsageError

LOCK_FILE = ".esper-bench.lock"
#: file systems without flock (some network or FUSE mounts): written without a lock, said
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class FolderLocked(UsageError):
    """Another process is writing the folder (exit 2); its holder is named."""


@dataclass
class _Held:
    fd: int | None
    """The lock file's descriptor (None where the file system has no locks)."""
    path: Path
    depth: int = 1


#: folder (absolute, resolved) -> this process's hold on it
_HELD: dict[Path, _Held] = {}


def holder_of(folder: Path) -> dict | None:
    """What the lock file of `folder` says of its holder (pid, command, host, since), or
    None when there is none or it cannot be read. Its holder may have been killed since."""
    try:
        document = json.loads((Path(folder) / LOCK_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None


def describe_holder(holder: dict | None) -> str:
    """`pid 1234 (python -m harness.run --resume r) on host h since 12:03:04 UTC`."""
    if holder is None:
        return "a process that has not recorded itself yet"
    elsewhere = holder.get("host") not in (None, socket.gethostname())
    host = f" on host {holder['host']}" if elsewhere else ""
    since = f", since {holder['since']}" if holder.get("since") else ""
    return f"pid {holder.get('pid')} ({holder.get('command') or 'command unknown'}){host}{since}"


def _command_line() -> str:
    """This process's command as typed: `python -m harness.run --resume r`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:  # python -m NAME
        program = f"python -m {spec.name.removesuffix('.__main__')}"
    elif sys.argv and sys.argv[0] in ("-c", ""):  # python -c CODE: the code is not kept
        program = "python -c"
    else:
        program = Path(sys.argv[0]).name
    return " ".join([program, *sys.argv[1:]])


def _open_locked(path: Path, what: str) -> int | None:
    """A descriptor of `path` holding its exclusive flock; FolderLocked naming the holder
    when another process holds it; None where the file system has no locks."""
    for _ in range(100):  # a holder that releases removes the file: lock the one at the path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise UsageError(f"{what}: cannot write in {path.parent} "
                             f"({err.strerror or err}); choose a folder you can write") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderLocked(
                f"{what}: {path.parent} is being written by another process, "
                f"{describe_holder(holder_of(path.parent))}; one writer at a time: wait for "
                "it to end (or stop it), then run this again") from None
        except OSError as err:
            os.close(fd)
            if err.errno in _NO_LOCKS:
                print(f"note: {path.parent}: this file system cannot lock files "
                      f"({err.strerror}); nothing stops a second writer here", file=sys.stderr)
                return None
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file was removed by the holder releasing it: lock the new one
    raise FolderLocked(f"{what}: {path.parent}: its lock file kept changing; another "
                       "process is writing there: run this again when it has finished")


def _acquire(folder: Path, what: str) -> _Held:
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{what}: cannot create {folder} ({err.strerror or err})") from err
    fd = _open_locked(path, what)
    if fd is None:
        return _Held(None, path)
    stale = os.read(fd, 64 * 1024)
    if stale.strip():  # a holder that was killed could not remove its file
        try:
            left = json.loads(stale)
        except (UnicodeDecodeError, json.JSONDecodeError):
            left = None
        print(f"note: {folder}: took over the lock of {describe_holder(left)}, which ended "
              "without releasing it (killed); what it wrote is kept", file=sys.stderr)
    since = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    mine = json.dumps({"pid": os.getpid(), "command": _command_line(),
                       "host": socket.gethostname(), "since": since})
    os.ftruncate(fd, 0)
    os.pwrite(fd, mine.encode(), 0)
    return _Held(fd, path)


def _release(held: _Held) -> None:
    if held.fd is None:
        return
    # remove the file while still holding it: a writer that opened it meanwhile sees the
    # file gone after its flock and locks a fresh one (`_open_locked`)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(held.path)
    os.close(held.fd)


@contextlib.contextmanager
def hold(folder: Path | None, what: str) -> Iterator[None]:
    """Hold `folder`'s writer lock while inside (created if missing); None: no folder,
    nothing to hold. `what` names the input the folder came from, in the user's words
    (`--out results`, `--resume latest`), for the message of `FolderLocked`."""
    if folder is None:
        yield
        return
    key = Path(os.path.abspath(folder)).resolve()
    held = _HELD.get(key)
    if held is not None:
        held.depth += 1
    else:
        held = _HELD[key] = _acquire(key, what)
    try:
        yield
    finally:
        held.depth -= 1
        if held.depth == 0:
            del _HELD[key]
            _release(held)
