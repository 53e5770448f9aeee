"""H4 (vectorized-training review): a new tensor per env at each episode end vs a copy
into a pre-allocated buffer."""

from __future__ import annotations

import torch

from esper.env.bootstrap_states import MODES, BootstrapStates
from esper.env.environment import OBS_DIM
from harness.findings import Case, Finding, max_abs_difference, register
from harness.review.findings.copies import copies_metric
from harness.review.findings.trainer_size import nearest_trainer_size


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 16))]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Each env's features at an episode's end as a Python list (what the env gives),
    and one `BootstrapStates` per variant."""
    g = torch.Generator().manual_seed(seed)
    n = case["num_envs"]
    features = torch.randn(n, OBS_DIM, generator=g).tolist()  # [N][OBS_DIM] floats
    return {"features": features, "device": device,
            "states": {mode: BootstrapStates(n, OBS_DIM, device, mode) for mode in MODES}}


def _make_call(variant: str, inputs: dict):
    states, features = inputs["states"][variant], inputs["features"]
    return lambda: states(features)



register(Finding(
    id="H4-bootstrap-tensor",
    title="Bootstrap states at an episode's end: a new tensor per env vs a pre-allocated buffer",
    claim="For truncated episodes (every episode ends truncated), this creates a new tensor "
          "from a Python list ... for every environment at every episode end",
    ticket="vectorized-training-review.md",
    variants=MODES,
    baseline="tensor",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 0.0,
    extra_metrics=copies_metric(_make_call),
    duration_s=(1.0, 3.0),
    notes=(
        "One timed call = the raw bootstrap states [num_envs, obs_dim] of one episode end "
        "on the run's device, from each env's feature list (esper.env.bootstrap_states, as the "
        "trainer builds them): tensor = torch.tensor([features], device=...) per env, then "
        "one cat; copy = rows written into a host buffer allocated once (pinned on CUDA), "
        "moved in one copy into a device buffer allocated once.",
        "host_to_device_copies counts the copies of one call (0 on the CPU: nothing moves).",
        "It happens once per env per episode (25 steps): the review's 'overhead' is per "
        "episode, not per step.",
    ),
))
