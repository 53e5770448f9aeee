"""H4 (vectorized-training review): the bootstrap at an episode's end, per env a new state
tensor, a batch-1 forward and a read, vs the review's pre-allocated state buffer, vs one
packed batched forward (ours)."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_SIZES
from esper.agent.observation_normalizer import EmaNormalizer
from esper.agent.policy import FactoredRecurrentActorCritic
from esper.env.bootstrap_states import MODES, BootstrapStates
from esper.env.environment import OBS_DIM
from esper.training.trainer import TrainConfig
from harness.findings import (
    About, Case, Finding, Reading, Recording, max_relative_error, register, rounding_tolerance
)
from esper_review.findings.copies import copies_metric
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration, policy_depth


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 16))]


def bootstrap_inputs(num_envs: int, device: torch.device, seed: int) -> dict:
    """What the trainer holds at an episode's end, drawn from `seed`: each env's features as
    a Python list (what the env gives), an observation normaliser with non-trivial
    statistics, the trainer-sized policy (masks not validated, see the finding's notes),
    the carried LSTM state `(h, c)` `[1, N, H]` and the step's masks `{head: [N, K]}` (at
    least one True per row), all on `device`."""
    g = torch.Generator().manual_seed(seed)
    hidden_dim = TrainConfig.hidden_dim
    features = torch.randn(num_envs, OBS_DIM, generator=g).tolist()  # [N][OBS_DIM] floats
    normalizer = EmaNormalizer(OBS_DIM, device)
    normalizer.update(2.0 * torch.randn(64, OBS_DIM, generator=g) + 1.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = FactoredRecurrentActorCritic(OBS_DIM, hidden_dim, validate_masks=False).to(device)
    hidden = tuple(torch.randn(1, num_envs, hidden_dim, generator=g).to(device) for _ in range(2))
    masks = {}
    for head, k in HEAD_SIZES.items():
        mask = torch.rand(num_envs, k, generator=g) < 0.5
        mask[:, 0] = True
        masks[head] = mask.to(device)
    return {"features": features, "normalize": normalizer.normalize, "policy": policy,
            "hidden": hidden, "masks": masks, "device": device}


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """`bootstrap_inputs` and one `BootstrapStates` per variant."""
    n = case["num_envs"]
    return {**bootstrap_inputs(n, device, seed),
            "states": {mode: BootstrapStates(n, OBS_DIM, device, mode) for mode in MODES}}


def _make_call(variant: str, inputs: dict):
    states = inputs["states"][variant]
    args = [inputs[k] for k in ("features", "normalize", "policy", "hidden", "masks")]
    return lambda: states(*args)  # bootstrap values [N] float32 on the host


def policy_forwards(policy: FactoredRecurrentActorCritic, call) -> int:
    """The policy's forwards during one `call()`: calls of its LSTM, one per forward
    (counted by a hook on the module, without the profiler's cost)."""
    calls = []
    handle = policy.lstm.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        call()
    finally:
        handle.remove()
    return len(calls)


_copies = copies_metric(_make_call)


def _extra(variant: str, inputs: dict) -> dict[str, float]:
    forwards = policy_forwards(inputs["policy"], _make_call(variant, inputs))
    return {**_copies(variant, inputs), "policy_forwards": float(forwards)}


register(Finding(
    id="H4-bootstrap-tensor",
    title="Bootstrap values at an episode's end: per env a new tensor, a batch-1 forward and "
          "a read vs a pre-allocated state buffer vs one packed forward",
    claim="For truncated episodes (every episode ends truncated), this creates a new tensor "
          "from a Python list ... for every environment at every episode end",
    ours=("packed",),
    variants=MODES,
    baseline="tensor",
    proposed="copy",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_relative_error,
    # a batch-1 and a batch-N forward take other kernels and round differently (packed);
    # tensor and copy agree exactly: the bound of one forward, in float32 (TF32 on CUDA)
    tolerance=lambda case, device: rounding_tolerance(policy_depth(OBS_DIM), torch.float32,
                                                      device, matmul=True),
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1954-1973 @2df957ed",
        fix="vectorized-training-review.md H4: `env_state.bootstrap_state_buffer = "
            "torch.zeros(1, state_dim, device=device)` once, then per episode end "
            "`bootstrap_state_buffer[0].copy_(torch.as_tensor(post_action_features, "
            "dtype=torch.float32))` before the normalise; the rest unchanged",
        duration_s=(4.0, 10.0),
        notes=(
            "One timed call = the bootstrap values [num_envs] of one episode end, on the host "
            "(esper.env.bootstrap_states, as the trainer computes them): tensor (the original) = "
            "per env torch.tensor([features], device=...), the observation normaliser, a "
            "batch-1 forward of the whole policy (LSTM and all 8 heads, deterministic: "
            "get_action(..., deterministic=True)) with the env's carried LSTM state and masks, "
            "and .item(); copy (the review's fix) = the same with the state copied into a "
            "[1, D] device buffer per env allocated once; packed (ours) = every env's row "
            "written into one staged host buffer (pinned on CUDA), one copy, one batched "
            "value-only forward, one read.",
            "Per call: tensor and copy run N forwards and N host reads (host_syncs on the "
            "CPU counts the .item()s), packed one forward and one read (a .cpu(), which only "
            "CUDA counts as a sync); host_to_device_copies counts the copies (N, N, 1 on CUDA; "
            "0 on the CPU, where nothing moves).",
            "The policy's masks are not validated here. The original's get_action validated "
            "each head's mask with a host read (4 heads at 2df957ed, "
            "tamiyo/policy/action_masks.py:285-297); the trainer's policy does so for its 8 "
            "in every act(), tensor and copy included: 8 more reads per env there.",
            "It happens once per env per episode (25 steps): the review's 'overhead' is per "
            "episode, not per step.",
        ),
    ),
    recording=Recording(
        extra_metrics=_extra,
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # every env's episode ends once a rollout
        headline_case=nearest_trainer_size,
    ),
))
