"""B4-DRL-03: "zero_tensor.clone() inside loop creates a new tensor on every terminal state"."""

from __future__ import annotations

import torch

from esper.gae import compute_gae
from harness.findings import Case, Finding, register
from harness.review.findings.gae_methods import (
    GAMMA, LAMBDA, build_gae_inputs, gae_args, relative_max_error,
)
from harness.review.findings.trainer_size import nearest_trainer_size


def _cases(quick: bool) -> list[Case]:
    sizes = [(4, 25)] if quick else [(4, 25), (16, 150)]
    return [Case.of(num_envs=e, max_steps=t, dones=d)
            for e, t in sizes for d in ("episode", "random0.05")]


def _make_call(variant: str, inputs: dict):
    args = gae_args(inputs, "step_counts_list")
    return lambda: compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="loop",
                               reset=variant)[0]


def _terminals(variant: str, inputs: dict) -> dict[str, float]:
    # host sync, outside any timed region
    return {"true_terminals": float((inputs["dones"] & ~inputs["truncated"]).sum())}


register(Finding(
    id="B4-DRL-03",
    title="GAE loop reset: zero.clone() vs a precomputed not-done mask",
    claim="zero_tensor.clone() inside loop creates a new tensor on every terminal state - "
          "up to 25 allocations per environment",
    ticket="B4-DRL-03-zero-tensor-clone.md",
    variants=("clone", "mask"),
    baseline="clone",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=build_gae_inputs,
    make_call=_make_call,
    check=relative_max_error,
    tolerance=lambda case: 1e-6,
    extra_metrics=_terminals,
    notes=(
        "Both variants run the per-env loop GAE; only the terminal reset differs. "
        "'episode' rows end truncated (no true terminal, so clone never fires); "
        "'random0.05' rows have true terminals with p=0.05.",
        "Allocations per call come from the profiling pass (profile_memory).",
    ),
))
