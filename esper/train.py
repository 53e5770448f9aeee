"""`python -m esper.train`: vectorized recurrent PPO on the synthetic environment.

    python -m esper.train --variants ours --envs 4 --steps 25 --iterations 20

Exit status (also in `--help`): 0 trained; 2 usage or input error: one line,
`python -m esper.train: error: ...`, naming the option, file or field, what was expected
and what was received, found before training starts (a checkpoint that cannot be written
later, a full disk, is one too); 3 internal error (an unexpected exception: its traceback,
then one line; an update whose losses went NaN: one line naming what did); 130 interrupted
by Ctrl-C, 143 by SIGTERM (a checkpoint is saved with both signals held off, and
atomically: it is whole or not written at all).

Progress: one metrics line per iteration on stdout. On stderr, a live progress bar when
stderr is a terminal; otherwise (a log file, a pipe) plain lines without carriage
returns, `progress: iteration 3/10 (30%), 4.2 s, about 9.8 s left`, after the first
iteration, then at most every `PROGRESS_EVERY_S` seconds, and after the last.

Limits: at most `MAX_ENVS` envs, seeds in [0, 2**64), at most as many threads as CPUs,
and a rollout (envs x steps) whose estimated memory (`BYTES_PER_STEP` per step) fits in
the machine's (or the GPU's) memory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import signal
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO

import torch
from tqdm import tqdm

from esper.agent.ppo import NonFiniteUpdateError
from esper.checks import parse_int
from esper.training.checkpoint import (
    CheckpointError,
    is_checkpoint,
    read_checkpoint,
    remove_orphans,
    restore_checkpoint,
    save_checkpoint,
)
from esper.training.trainer import TrainConfig, VectorizedTrainer, resolve_device
from esper.variants import PRESETS, Variants

PROG = "python -m esper.train"
#: Most envs one run builds. Each env is a host network with its own data set, built in
#: about 2 ms and trained one epoch per step (and on CUDA given its own stream): 4096 build
#: in about 8 s on the 2-core CPU; 10**12 would never finish building.
MAX_ENVS = 4096
#: Memory one rollout step (one env, one step) needs, estimated from a measurement: the
#: buffer stores about 1.3 KiB per step, and the PPO update's full-sequence activations
#: grew the peak resident memory by 22 KiB per step at 16 envs x 128 steps on the CPU.
BYTES_PER_STEP = 24 * 1024
#: Seeds torch and NumPy's SeedSequence both take: [0, 2**64).
SEED_RANGE = (0, 2**64)
#: Most torch threads: this machine's CPUs. More only compete for them, and
#: `torch.set_num_threads` accepts up to 2**31 - 1 and then fails to start them.
MAX_THREADS = os.cpu_count() or 1
#: Seconds between plain progress lines (stderr not a terminal).
PROGRESS_EVERY_S = 30.0
#: Signals held off while a checkpoint is written.
_HELD = (signal.SIGINT, signal.SIGTERM)


class UsageError(Exception):
    """Bad input (an option, a file): exit 2 with this one-line message, no traceback."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors (an unknown option, a missing value) are
    `UsageError`s, one line, instead of argparse's usage block and its own exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that the
    same `finally` blocks clean up. `signum` says which signal (as a caller's own
    KeyboardInterrupt subclass may, for the exit status)."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (unless someone set its handler: nohup's
    SIG_IGN or an embedding program's own stays). The previous handler comes back after."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM off while inside (a checkpoint being written); one that
    arrives meanwhile is delivered on the way out. Held by a handler that only notes it,
    not by the main thread's signal mask: the kernel hands a signal the main thread blocks
    to another thread (torch's workers), and Python then runs the handler in the main
    thread all the same, inside the block. (Outside the main thread, nothing is held.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    for signum in _HELD:
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


# ------------------------------------------------------------------------------ options

@dataclass(frozen=True)
class Options:
    """The command line, checked: every value as the run uses it."""

    variants: Variants
    envs: int
    steps: int
    iterations: int
    device: torch.device
    seed: int
    threads: int | None
    checkpoint: Path | None
    resume: Path | None


def build_parser() -> Parser:
    """The command line; values are read as text here and checked by `parse_options`."""
    parser = Parser(
        prog=PROG, description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n  0    trained\n  2    usage or input error (one line naming "
               "the option, file or field, what was expected and what was received)\n  3    "
               "internal error: an unexpected exception, a bug (the traceback is printed), or "
               "an update that went NaN (one line naming what did)\n  130  interrupted (Ctrl-C)"
               "\n  143  terminated (SIGTERM)\na checkpoint is written atomically with both "
               "signals held off: whole, or not at all\n\nprogress: a live bar on stderr when "
               "it is a terminal; otherwise plain lines, no carriage returns",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--variants", default="original",
                        help="a preset ('original', 'reviews' or 'ours') or axis=value "
                             "pairs, e.g. 'gae=scan,reset=mask' (default: original)")
    parser.add_argument("--envs", default="4",
                        help=f"parallel environments, 1 to {MAX_ENVS} (default 4)")
    parser.add_argument("--steps", default="25",
                        help="steps (host epochs) per episode and rollout, >= 1 (default 25); "
                             f"envs x steps x {BYTES_PER_STEP // 1024} KiB must fit in memory")
    parser.add_argument("--iterations", default="10",
                        help="rollout + update iterations, >= 1 (default 10)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    parser.add_argument("--seed", default="0", help="random seed in [0, 2**64) (default 0)")
    parser.add_argument("--threads", default=None,
                        help="torch CPU threads, 1 to this machine's CPU count (default: "
                             "torch's choice)")
    parser.add_argument("--checkpoint", default=None,
                        help="save a checkpoint here after each iteration (a new file, or a "
                             "checkpoint to replace)")
    parser.add_argument("--resume", default=None, help="resume from this checkpoint")
    return parser


def _option(option: str, err: Exception) -> UsageError:
    """A library's ValueError, said about the option it came from."""
    return UsageError(f"{option}: {err}")


def parse_options(argv: list[str] | None) -> Options:
    """The command line as `Options`, or a `UsageError` naming the first bad option:
    nothing is built or written before every option has been checked."""
    args = build_parser().parse_args(argv)
    for name, value in vars(args).items():
        # `--envs=--`: argparse 3.11 reads an empty list ('--' ends the options), 3.12 the
        # string '--'; both are one answer, never a file named '--'
        if value == "--" or (value is not None and not isinstance(value, str)):
            raise UsageError(f"--{name}: expected one value; got {value!r}")
    if not args.variants.strip():
        raise UsageError(f"--variants: expected a preset ({', '.join(PRESETS)}) or axis=value "
                         f"pairs; got {args.variants!r}")
    try:
        variants = Variants.parse(args.variants)
    except ValueError as err:
        raise _option("--variants", err) from None
    try:
        envs = parse_int("--envs", args.envs, below=MAX_ENVS + 1)
        steps = parse_int("--steps", args.steps)
        iterations = parse_int("--iterations", args.iterations)
        seed = parse_int("--seed", args.seed, *SEED_RANGE)
        threads = (None if args.threads is None
                   else parse_int("--threads", args.threads, below=MAX_THREADS + 1))
    except ValueError as err:  # each message starts with its option
        raise UsageError(str(err)) from None
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as err:  # RuntimeError: torch's 'cuda:x' parser
        raise _option("--device", err) from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"--device: expected cuda:N with N below this machine's "
                         f"{torch.cuda.device_count()} GPUs; got {args.device!r}")
    check_rollout_memory(envs, steps, device)
    checkpoint, resume = check_checkpoint_paths(args.checkpoint, args.resume)
    return Options(variants, envs, steps, iterations, device, seed, threads, checkpoint, resume)


def _path(option: str, text: str | None) -> Path | None:
    if text is None:
        return None
    if not text.strip():
        raise UsageError(f"{option}: expected a file path; got {text!r}")
    if "\0" in text:
        raise UsageError(f"{option}: expected a path without NUL characters; got {text!r}")
    return Path(text)


def _stat(option: str, path: Path) -> os.stat_result | None:
    """`path`'s status, None where nothing is there; UsageError where it cannot be told
    (a name too long, a loop of links, a folder on the way that cannot be searched)."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a file on the way: nothing can be there
        return None
    except OSError as err:
        raise UsageError(f"{option}: expected a path that can be checked; got {path} "
                         f"({err.strerror or err})") from None


def check_checkpoint_paths(checkpoint: str | None, resume: str | None
                           ) -> tuple[Path | None, Path | None]:
    """The two paths, before any work, or a `UsageError` naming the option when
    `--checkpoint` could not or should not be written (empty; a folder, a device, a pipe;
    an existing file that is not a checkpoint, which it would overwrite; a location where
    no file can be created) or `--resume` is empty or names no regular file."""
    checkpoint_path, resume_path = _path("--checkpoint", checkpoint), _path("--resume", resume)
    if resume_path is not None:
        status = _stat("--resume", resume_path)
        if status is None:
            raise UsageError(f"--resume: expected a checkpoint file; got {resume}, which does "
                             "not exist")
        if stat.S_ISDIR(status.st_mode):
            raise UsageError(f"--resume: expected a checkpoint file; got {resume}, a folder")
        if not stat.S_ISREG(status.st_mode):
            raise UsageError(f"--resume: expected a checkpoint file; got {resume}, not a "
                             "regular file")
    if checkpoint_path is None:
        return None, resume_path
    status = _stat("--checkpoint", checkpoint_path)
    if status is not None:
        if stat.S_ISDIR(status.st_mode):
            raise UsageError(f"--checkpoint: expected a file to write; got {checkpoint}, a folder")
        if not stat.S_ISREG(status.st_mode):
            raise UsageError(f"--checkpoint: expected a file to write; got {checkpoint}, not "
                             "a regular file")
        if not is_checkpoint(checkpoint_path):
            raise UsageError(f"--checkpoint: expected a new file or a checkpoint to replace; "
                             f"got {checkpoint}, an existing file that is not a checkpoint "
                             "(it would be overwritten)")
    # save_checkpoint creates missing folders: probe the first one that exists, by
    # writing there (permission bits do not tell: root writes anywhere but read-only mounts)
    folder = checkpoint_path.parent
    while _stat("--checkpoint", folder) is None and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"--checkpoint: expected a writable location; got {checkpoint} "
                         f"({folder} is not a folder)")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise UsageError(f"--checkpoint: expected a writable location; got {checkpoint} "
                         f"({folder}: {err.strerror or err})") from err
    return checkpoint_path, resume_path


def check_rollout_memory(num_envs: int, max_steps: int, device: torch.device) -> None:
    """`UsageError` when num_envs x max_steps x `BYTES_PER_STEP` exceeds the memory of
    `device` (the GPU's, or the machine's physical memory; no check where unknown)."""
    if device.type == "cuda":
        available = torch.cuda.get_device_properties(device).total_memory
        where = f"the GPU's {available / 2**30:.1f} GiB"
    else:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not a POSIX system that says
            return
        where = f"this machine's {available / 2**30:.1f} GiB"
    needed = num_envs * max_steps * BYTES_PER_STEP
    if needed > available:
        raise UsageError(
            f"--envs x --steps: expected a rollout that fits in memory (about "
            f"{BYTES_PER_STEP // 1024} KiB per env step); got {num_envs} x {max_steps} steps, "
            f"about {needed / 2**30:.3g} GiB, more than {where}"
        )


def _version() -> str:
    """The installed esper-bench version (esper does not import harness, which has its own)."""
    try:
        return importlib.metadata.version("esper-bench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (esper-bench is not installed: pip install -e .)"


# ------------------------------------------------------------------------------ progress

def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # not a file, or a closed one
        return False


class Progress:
    """Iteration progress on `stream`: tqdm's live bar where `stream` is a terminal;
    elsewhere plain lines, no carriage return: after the first iteration of this run,
    then when `every_s` seconds have passed since the last line, and after the last."""

    def __init__(self, total: int, done: int, stream: TextIO,
                 every_s: float = PROGRESS_EVERY_S) -> None:
        self.total, self.done, self.stream, self.every_s = total, done, stream, every_s
        self.live = _is_terminal(stream)
        self.bar = (tqdm(total=total, initial=done, unit="iter", file=stream)
                    if self.live else None)
        self._start = self._last = time.monotonic()
        self._first = done

    def write(self, line: str) -> None:
        """A line on stdout: above the live bar, or flushed at once (a log read live)."""
        if self.bar is not None:
            tqdm.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def update(self) -> None:
        """One more iteration done."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.monotonic()
        ran = self.done - self._first
        if ran == 1 or self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            elapsed = now - self._start
            left = elapsed / ran * (self.total - self.done)
            print(f"progress: iteration {self.done}/{self.total} "
                  f"({100 * self.done // self.total}%), {elapsed:.1f} s, about {left:.1f} s left",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------ the command

def main(argv: list[str] | None = None) -> int:
    """Train, printing one metrics line per iteration; returns the exit status.

    Bad input (sizes, seed, threads, variants, device, checkpoint paths and contents, a
    checkpoint of another config or already at `--iterations`) returns 2 after one line
    on stderr, before training starts; so does a checkpoint that cannot be written later.
    An update that went NaN returns 3 after one line naming what did; any other
    unexpected exception prints its traceback and returns 3 (a bug, not bad input);
    Ctrl-C returns 130 and SIGTERM 143. `--help` and `--version` exit 0 (SystemExit).
    """
    try:
        with sigterm_raises():
            return _train(argv)
    except UsageError as err:
        print(f"{PROG}: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except NonFiniteUpdateError as err:  # training went wrong, not the input: say what did
        print(f"{PROG}: internal error (exit 3): {one_line(str(err))}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM as Terminated
        signum = getattr(err, "signum", signal.SIGINT)
        print("interrupted (Ctrl-C)" if signum == signal.SIGINT
              else f"terminated ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except Exception:  # a bug: the traceback, and exit 3, apart from bad input's 2
        traceback.print_exc()
        print(f"internal error (exit 3): an unexpected exception in esper.train "
              f"(esper-bench {_version()}); the traceback above says where", file=sys.stderr)
        return 3


def one_line(text: str) -> str:
    """`text` with every character that is not printable escaped (`\\n`, `\\r`, `\\x1e`,
    an undecodable byte's `\\udcff`): a message quotes paths and values as received, and
    it must stay one line, whatever they hold."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _remove_orphans(*paths: Path | None) -> None:
    """Delete what writers killed mid-write left beside these checkpoints, one line each."""
    for path in dict.fromkeys(p for p in paths if p is not None):
        for orphan in remove_orphans(path):
            pid = orphan.name.rsplit(".", 2)[1]
            print(one_line(f"removed {orphan}: a temporary checkpoint file of writer {pid}, "
                           "which is no longer running"), file=sys.stderr)


def _train(argv: list[str] | None) -> int:
    options = parse_options(argv)
    _remove_orphans(options.checkpoint, options.resume)
    state = None
    if options.resume is not None:  # the file's own problems, before the envs are built
        try:
            state = read_checkpoint(options.resume, options.device)
        except CheckpointError as err:
            raise _option("--resume", err) from None
    if options.threads:
        torch.set_num_threads(options.threads)
    config = TrainConfig(num_envs=options.envs, max_steps=options.steps, seed=options.seed,
                         variants=options.variants)
    trainer = VectorizedTrainer(config, options.device)
    if state is not None:
        try:
            notes = restore_checkpoint(trainer, state, options.resume)
        except CheckpointError as err:
            raise _option("--resume", err) from None
        for note in notes:
            print(f"note: {one_line(note)}", file=sys.stderr)
        if trainer.iteration_count >= options.iterations:
            raise UsageError(f"--resume {options.resume}: the checkpoint is at iteration "
                             f"{trainer.iteration_count}, and --iterations {options.iterations} "
                             f"asks for no more; pass --iterations above "
                             f"{trainer.iteration_count} to train further")
    print(f"device {options.device}, variants {options.variants.spec()}, "
          f"threads {torch.get_num_threads()}", flush=True)
    if options.device.type == "cpu":
        print("note: on the CPU there are no CUDA streams; the sync axis only matters on CUDA",
              flush=True)
    progress = Progress(options.iterations, trainer.iteration_count, sys.stderr)
    try:
        while trainer.iteration_count < options.iterations:
            stats = trainer.iteration()
            progress.write(stats.line())
            if options.checkpoint is not None:
                _save(trainer, options.checkpoint)
            progress.update()
    finally:
        progress.close()
    return 0


def _save(trainer: VectorizedTrainer, path: Path) -> None:
    try:
        with signals_held():  # whole, or not written: never half a checkpoint
            save_checkpoint(trainer, path)
    except OSError as err:  # the location changed since the start: full, gone, read-only
        raise UsageError(f"--checkpoint: expected a writable location; got {path}, where "
                         f"iteration {trainer.iteration_count}'s checkpoint could not be "
                         f"written ({err.strerror or err}); the previous one, if any, is "
                         "unchanged") from err


if __name__ == "__main__":
    sys.exit(main())
