"""`python -m esper.train`: vectorized recurrent PPO on the synthetic environment.

    python -m esper.train --variants optimized --envs 4 --steps 25 --iterations 20

Exit status (also in `--help`): 0 trained; 2 usage or input error (one line naming the
option, what was expected and what was received), found before training starts; 3
internal error (an unexpected exception, with its traceback); 130 interrupted by Ctrl-C,
143 by SIGTERM (a checkpoint is saved with both signals held off, so it is whole or not
written at all).

Limits: at most `MAX_ENVS` envs, seeds in [0, 2**64), and a rollout (envs x steps) whose
estimated memory (`BYTES_PER_STEP` per step) fits in the machine's (or the GPU's) memory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from esper.training.checkpoint import load_checkpoint, save_checkpoint
from esper.training.trainer import TrainConfig, VectorizedTrainer, resolve_device
from esper.variants import Variants


#: Most envs one run builds. Each env is a host network with its own data set, built in
#: about 2 ms and trained one epoch per step (and on CUDA given its own stream): 4096 build
#: in about 8 s on the 2-core CPU; 10**12 would never finish building.
MAX_ENVS = 4096
#: Memory one rollout step (one env, one step) needs, estimated from a measurement: the
#: buffer stores about 1.3 KiB per step, and the PPO update's full-sequence activations
#: grew the peak resident memory by 22 KiB per step at 16 envs x 128 steps on the CPU.
BYTES_PER_STEP = 24 * 1024
#: Seeds torch and NumPy's SeedSequence both take.
SEED_RANGE = (0, 2**64 - 1)
#: Signals held off while a checkpoint is written.
_HELD = (signal.SIGINT, signal.SIGTERM)


def positive_int(text: str) -> int:
    """argparse type: an int > 0, else an error naming the expected and received value."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive int; got {text}")
    return value


def bounded_int(low: int, high: int):
    """argparse type: an int in [low, high], else an error naming the range and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an int in [{low}, {high}]; got {text}")
        return value

    parse.__name__ = "int"
    return parse


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
    arrives meanwhile is delivered on the way out. (Where there are no signal masks, as on
    Windows, nothing is held.)"""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def check_checkpoint_paths(checkpoint: str | None, resume: str | None) -> None:
    """`ValueError` naming the option, before any work, when `--checkpoint` could not be
    written (empty, a folder, or a location where no file can be created) or `--resume`
    is empty or a folder. A missing `--resume` file is left to `load_checkpoint`."""
    for option, text in (("--checkpoint", checkpoint), ("--resume", resume)):
        if text is not None and not text.strip():
            raise ValueError(f"{option}: expected a file path; got {text!r}")
    if resume is not None and Path(resume).is_dir():
        raise ValueError(f"--resume: expected a checkpoint file; got {resume}, a folder")
    if checkpoint is None:
        return
    path = Path(checkpoint)
    if path.is_dir():
        raise ValueError(f"--checkpoint: expected a file to write; got {checkpoint}, a folder")
    # save_checkpoint creates missing folders: probe the first one that exists, by
    # writing there (permission bits do not tell: root writes anywhere but read-only mounts)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise ValueError(f"--checkpoint: expected a writable location; got {checkpoint} "
                         f"({folder}: {err.strerror or err})") from err


def check_rollout_memory(num_envs: int, max_steps: int, device: torch.device) -> None:
    """`ValueError` when num_envs x max_steps x `BYTES_PER_STEP` exceeds the memory of
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
        raise ValueError(
            f"--envs x --steps: expected a rollout that fits in memory (about "
            f"{BYTES_PER_STEP // 1024} KiB per env step); got {num_envs} x {max_steps} steps, "
            f"about {needed / 2**30:.3g} GiB, more than {where}"
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line; every size is validated here, so bad input exits 2 with usage."""
    parser = argparse.ArgumentParser(
        prog="python -m esper.train", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n  0    trained\n  2    usage or input error (the message names "
               "the option, what was expected and what was received), found before training"
               "\n  3    internal error: an unexpected exception, a bug (the traceback is "
               "printed)\n  130  interrupted (Ctrl-C)\n  143  terminated (SIGTERM)\n"
               "a checkpoint is written with both signals held off: whole, or not at all",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--variants", default="original",
                        help="'original', 'optimized', or axis=value pairs, e.g. "
                             "'gae=scan,reset=mask' (default: original)")
    parser.add_argument("--envs", type=bounded_int(1, MAX_ENVS), default=4,
                        help=f"parallel environments, at most {MAX_ENVS} (default 4)")
    parser.add_argument("--steps", type=positive_int, default=25,
                        help="steps (host epochs) per episode and rollout (default 25); "
                             f"envs x steps x {BYTES_PER_STEP // 1024} KiB must fit in memory")
    parser.add_argument("--iterations", type=positive_int, default=10,
                        help="rollout + update iterations (default 10)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    parser.add_argument("--seed", type=bounded_int(*SEED_RANGE), default=0,
                        help="random seed in [0, 2**64) (default 0)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--checkpoint", default=None, help="save a checkpoint here after each iteration")
    parser.add_argument("--resume", default=None, help="resume from this checkpoint")
    return parser


def _version() -> str:
    """The installed esper-bench version (esper does not import harness, which has its own)."""
    try:
        return importlib.metadata.version("esper-bench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (esper-bench is not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    """Train, printing one metrics line per iteration; returns the exit status.

    Bad input (sizes, seed, variants, device, checkpoint paths, a checkpoint of another
    config or already at `--iterations`) exits with status 2 and a one-line message,
    through `argparse`'s `error`, before training starts; an unexpected exception prints
    its traceback and exits 3 (a bug, not bad input); Ctrl-C exits 130 and SIGTERM 143.
    """
    try:
        with sigterm_raises():
            return _train(argv)
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


def _train(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        variants = Variants.parse(args.variants)
        device = resolve_device(args.device)
        config = TrainConfig(num_envs=args.envs, max_steps=args.steps, seed=args.seed,
                             variants=variants)
        check_rollout_memory(args.envs, args.steps, device)
        check_checkpoint_paths(args.checkpoint, args.resume)
    except ValueError as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = VectorizedTrainer(config, device)
    if args.resume is not None:
        try:
            load_checkpoint(trainer, args.resume)
        except (ValueError, FileNotFoundError) as err:
            parser.error(str(err))
        if trainer.iteration_count >= args.iterations:
            parser.error(f"--resume {args.resume}: the checkpoint is at iteration "
                         f"{trainer.iteration_count}, and --iterations {args.iterations} asks "
                         f"for no more; pass --iterations above {trainer.iteration_count} to "
                         "train further")
    print(f"device {device}, variants {variants.spec()}, threads {torch.get_num_threads()}")
    if device.type == "cpu":
        print("note: on the CPU there are no CUDA streams; the sync axis only matters on CUDA")
    start = trainer.iteration_count
    with tqdm(total=args.iterations, initial=min(start, args.iterations), unit="iter",
              file=sys.stderr) as bar:
        while trainer.iteration_count < args.iterations:
            stats = trainer.iteration()
            tqdm.write(stats.line())
            if args.checkpoint is not None:
                with signals_held():  # whole, or not written: never half a checkpoint
                    save_checkpoint(trainer, args.checkpoint)
            bar.update(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
