"""L1 (vectorized-training review): the validation forward under torch.inference_mode()
(the reviewed code's) vs torch.no_grad()."""

from __future__ import annotations

import dataclasses

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.variants import AXES, Variants
from harness.findings import About, Case, Finding, Reading, register
from esper_review.findings.trainer_size import ENV_STEPS, nearest_trainer_size, per_iteration

MODES = AXES["validation"]


def _cases(quick: bool) -> list[Case]:
    default = EnvConfig.val_size
    return [Case.of(val_size=n) for n in ((default,) if quick else (default, 8 * default))]


def germinate(env: MorphoEnv, slot: int) -> None:
    """Grow a seed (a 32-wide MLP, blueprint 2) in `slot`: host-side, as an action does."""
    action = {h: 0 for h in HEAD_NAMES}
    action.update(op=OP_INDEX["GERMINATE"], slot=slot, blueprint=2)
    env.apply_action(action)


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One env per mode from one seed (the same weights and data), a seed grown in its
    first slot so that validation runs through a seed module as well as the host."""
    config = dataclasses.replace(EnvConfig(), num_envs=1, val_size=case["val_size"], seed=seed)
    envs = {}
    for mode in MODES:
        env = MorphoEnv(config, 0, device, Variants(validation=mode))
        germinate(env, 0)
        envs[mode] = env
    return envs


def _make_call(variant: str, envs: dict):
    return envs[variant].process_val_batch  # (val_loss, correct, total) on the device


def values_difference(output: tuple, reference: tuple) -> float:
    """max |output - reference| over (val_loss, correct, total)."""
    return max(abs(float(o) - float(r)) for o, r in zip(output, reference))


register(Finding(
    id="L1-inference-mode",
    title="The validation forward: torch.inference_mode() vs torch.no_grad()",
    claim="This correctly uses inference_mode() for validation, which is more efficient "
          "than no_grad(). Good practice",
    variants=MODES,
    baseline="inference_mode",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=values_difference,
    tolerance=lambda case: 0.0,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1070-1076 @2df957ed",
        duration_s=(3.0, 6.0),
        notes=(
            "One timed call = one env's validation forward (MorphoEnv.process_val_batch, the "
            "reviewed process_val_batch's lines 1063-1076 op for op: the host and one seed "
            "over val_size examples, cross-entropy and the correct count) under the grad "
            "mode of Variants.validation: inference_mode (the original's, the default) or "
            "no_grad.",
            "The review's observation holds where no_grad is slower than inference_mode "
            "(a ratio above 1); 'same' means the difference is within the margin.",
            "Check: both modes give the same validation loss and count, bit for bit.",
        ),
    ),
    reading=Reading(
        per_iteration=per_iteration(ENV_STEPS),  # one validation per env step
        headline_case=nearest_trainer_size,
    ),
))
