"""`python -m esper.train`: vectorized recurrent PPO on the synthetic environment.

    python -m esper.train --variants optimized --envs 4 --steps 25 --iterations 20

Exit status (also in `--help`): 0 trained; 2 usage or input error (one line naming the
option, what was expected and what was received); 3 internal error (an unexpected
exception, with its traceback); 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import traceback

import torch
from tqdm import tqdm

from esper.checkpoint import load_checkpoint, save_checkpoint
from esper.trainer import TrainConfig, VectorizedTrainer, resolve_device
from esper.variants import Variants


def positive_int(text: str) -> int:
    """argparse type: an int > 0, else an error naming the expected and received value."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive int; got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line; every size is validated here, so bad input exits 2 with usage."""
    parser = argparse.ArgumentParser(
        prog="python -m esper.train", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n  0    trained\n  2    usage or input error (the message names "
               "the option, what was expected and what was received)\n  3    internal error: "
               "an unexpected exception, a bug (the traceback is printed)\n  130  interrupted "
               "(Ctrl-C)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--variants", default="original",
                        help="'original', 'optimized', or axis=value pairs, e.g. "
                             "'gae=scan,reset=mask' (default: original)")
    parser.add_argument("--envs", type=positive_int, default=4, help="parallel environments (default 4)")
    parser.add_argument("--steps", type=positive_int, default=25,
                        help="steps (host epochs) per episode and rollout (default 25)")
    parser.add_argument("--iterations", type=positive_int, default=10,
                        help="rollout + update iterations (default 10)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
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

    Bad input (sizes, variants, device, a checkpoint of another config) exits with status 2
    and a one-line message, through `argparse`'s `error`; an unexpected exception prints
    its traceback and exits 3 (a bug, not bad input); Ctrl-C exits 130.
    """
    try:
        return _train(argv)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
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
    except ValueError as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = VectorizedTrainer(config, device)
    if args.resume:
        try:
            load_checkpoint(trainer, args.resume)
        except (ValueError, FileNotFoundError) as err:
            parser.error(str(err))
    print(f"device {device}, variants {variants.spec()}, threads {torch.get_num_threads()}")
    if device.type == "cpu":
        print("note: on the CPU there are no CUDA streams; the sync axis only matters on CUDA")
    start = trainer.iteration_count
    with tqdm(total=args.iterations, initial=min(start, args.iterations), unit="iter",
              file=sys.stderr) as bar:
        while trainer.iteration_count < args.iterations:
            stats = trainer.iteration()
            tqdm.write(stats.line())
            if args.checkpoint:
                save_checkpoint(trainer, args.checkpoint)
            bar.update(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
