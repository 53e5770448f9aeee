"""Save and resume a `VectorizedTrainer`: policy, optimiser, normalisers, RNG, LSTM state."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch

from esper.training.trainer import VectorizedTrainer

#: 2: the reward normaliser's state (None when it is off)
FORMAT_VERSION = 2


def save_checkpoint(trainer: VectorizedTrainer, path: str | Path) -> None:
    """Write atomically (temp file + rename), so a crash never leaves half a checkpoint."""
    path = Path(path)
    state = {
        "format_version": FORMAT_VERSION,
        "identity": trainer.config.identity(),
        "variants": trainer.config.variants.spec(),
        "iteration": trainer.iteration_count,
        "policy": trainer.policy.state_dict(),
        "optimizer": trainer.agent.optimizer.state_dict(),
        "normalizer": trainer.normalizer.state_dict(),
        "reward_normalizer": (trainer.reward_normalizer.state_dict()
                              if trainer.reward_normalizer is not None else None),
        "sampler": trainer.sampler.get_state(),
        "torch_rng": torch.get_rng_state(),
        "hidden": tuple(h.cpu() for h in trainer.hidden),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _mismatches(saved: dict, current: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _mismatches(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: checkpoint has {a!r}, this run has {b!r}")
    return out


def load_checkpoint(trainer: VectorizedTrainer, path: str | Path) -> None:
    """Restore `trainer` in place, mapped to its device.

    Raises `ValueError` for a file that is not a checkpoint of this format, or naming every
    field where the checkpoint's config differs.
    """
    try:
        # weights_only: a checkpoint holds tensors and plain containers, and loading one
        # must not run arbitrary pickled code
        state = torch.load(path, map_location=trainer.device, weights_only=True)
    except (pickle.UnpicklingError, KeyError, RuntimeError, EOFError) as err:
        # what torch.load raises for a file that is not a torch checkpoint at all
        # torch.load's first line only: the rest of its message advises weights_only=False,
        # which would run whatever code an unknown file holds
        first = next(iter(str(err).strip().splitlines()), "")
        if "weights_only" in first:
            first = "not a weights-only torch file"
        raise ValueError(
            f"resume {path}: expected a checkpoint written by save_checkpoint; got a file "
            f"torch.load cannot read ({type(err).__name__}: {first})"
        ) from err
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(
            f"resume {path}: format_version: expected {FORMAT_VERSION}; got {version!r}"
        )
    problems = _mismatches(state["identity"], trainer.config.identity())
    if problems:
        raise ValueError(f"resume {path}: config mismatch: " + "; ".join(problems))
    trainer.policy.load_state_dict(state["policy"])
    trainer.agent.optimizer.load_state_dict(state["optimizer"])
    trainer.normalizer.load_state_dict(
        {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state["normalizer"].items()}
    )
    if trainer.reward_normalizer is not None:
        trainer.reward_normalizer.load_state_dict(state["reward_normalizer"])
    trainer.sampler.set_state(state["sampler"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    trainer.hidden = tuple(h.to(trainer.device) for h in state["hidden"])
    trainer.iteration_count = state["iteration"]
