"""H1 (vectorized-training review): envs recreated for every batch vs reset from a pool."""

from __future__ import annotations

import weakref

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.config import EnvConfig
from esper.env.pool import EnvBatches
from esper.env.vectorized import VectorizedMorphoEnv
from esper.variants import AXES, Variants
from harness.findings import About, Case, Finding, Reading, Recording, register
from esper_review.findings.fragmentation import fragmentation
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration

VARIANTS = AXES["env_pool"]  # recreate, checkpoint (the review's), pool (ours)
#: batches run before reading the allocator's reserved-minus-allocated bytes (CUDA)
FRAGMENTATION_BATCHES = 20
#: env steps of the trajectory that the correctness check compares
CHECK_STEPS = 3


def _cases(quick: bool) -> list[Case]:
    sizes = (4,) if quick else (4, 16)
    return ([Case.of(num_envs=n, measure="boundary") for n in sizes]
            + [Case.of(num_envs=4, measure="fragmentation")])


def _config(case: Case, seed: int) -> EnvConfig:
    return EnvConfig(num_envs=case["num_envs"], seed=seed)


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One `EnvBatches` per variant, each past its first batch, whose envs have grown a
    seed and trained an epoch: the next boundary has a used env to replace or reset."""
    streams = _streams if device.type == "cuda" else None
    batches = {}
    for variant in VARIANTS:
        pool = EnvBatches(_config(case, seed), device, Variants(env_pool=variant), streams)
        envs, _ = pool.next_batch()
        _run_steps(envs, 1)
        batches[variant] = pool
    return {"batches": batches, "measure": case["measure"], "device": device}


def _streams(num_envs: int, device: torch.device) -> list:
    return [torch.cuda.Stream(device=device) for _ in range(num_envs)]


def _make_call(variant: str, inputs: dict):
    batches = inputs["batches"][variant]
    if inputs["measure"] == "boundary":
        return lambda: batches.next_batch()[0]

    def batch_and_epoch() -> VectorizedMorphoEnv:
        envs, _ = batches.next_batch()
        for env in envs.envs:
            env.launch_epoch()
        return envs

    return batch_and_epoch


_trajectories: "weakref.WeakKeyDictionary[VectorizedMorphoEnv, torch.Tensor]" = (
    weakref.WeakKeyDictionary())


def trajectory(envs: VectorizedMorphoEnv, steps: int = CHECK_STEPS) -> torch.Tensor:
    """`[steps, N, obs_dim + 4]` float64: per step and env the observation, reward and
    metrics after a fixed script of actions (germinate a seed in slot 0, then wait).
    Computed once per envs object (it advances them)."""
    if envs not in _trajectories:
        _trajectories[envs] = _run_steps(envs, steps)
    return _trajectories[envs]


def _run_steps(envs: VectorizedMorphoEnv, steps: int) -> torch.Tensor:
    rows = [torch.cat([envs.observations(), torch.zeros(envs.num_envs, 4)], dim=1)]
    for t in range(steps):
        actions = {h: torch.zeros(envs.num_envs, dtype=torch.int64) for h in HEAD_NAMES}
        actions["op"] += OP_INDEX["GERMINATE"] if t == 0 else OP_INDEX["WAIT"]
        actions["blueprint"] += 2  # a 32-wide MLP seed, drawn from the env's seed generator
        obs, rewards, metrics = envs.step(actions)
        rows.append(torch.cat([obs, rewards[:, None], metrics], dim=1))
    return torch.stack(rows).double()  # steps+1 x [N, D + 4] -> [steps + 1, N, D + 4]


def _check(output: VectorizedMorphoEnv, reference: VectorizedMorphoEnv) -> float:
    """Max difference between the trajectories of the two batches' envs from here."""
    if output is reference:
        return 0.0
    return (trajectory(output) - trajectory(reference)).abs().max().item()


def _fragmentation(variant: str, inputs: dict) -> dict[str, float]:
    """On CUDA: the allocator's reserved minus allocated bytes after
    `FRAGMENTATION_BATCHES` batches of this variant, each a boundary and an epoch, from
    an emptied cache (memory held in the cache but not in use: fragmentation and slack)."""
    if inputs["measure"] != "fragmentation":
        return {}
    return fragmentation(_make_call(variant, inputs), inputs["device"], FRAGMENTATION_BATCHES)


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    if case["measure"] == "fragmentation" and device.type != "cuda":
        return "needs CUDA"
    return None


register(Finding(
    id="H1-env-pooling",
    title="Envs of each batch: recreated vs reset in place from a pool",
    claim="Every batch creates entirely new environments (models, optimizers, CUDA "
          "streams) ... Consider environment pooling where models are reset rather than "
          "recreated",
    variants=VARIANTS,
    baseline="recreate",
    proposed="checkpoint",
    ours=("pool",),
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_check,
    tolerance=lambda case: 0.0,
    skip=_skip,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1103-1107 and 818-894 @2df957ed "
                 "(create_env_state per env per batch: host model, SGD, a new torch.cuda.Stream, "
                 "a new GradScaler, accumulators)",
        fix="the review's 'environment pooling where models are reset rather than recreated', "
            "as its sketch writes it (`checkpoint`): `reset_env_state` restores the host's "
            "weights from a checkpoint (`env_state.model.reset_to_checkpoint()`, here a copy "
            "of each host's state dict taken when the env is made, restored with "
            "load_state_dict) and resets the rest of the env's state; ours (`pool`) draws the "
            "weights again in place and keeps no copy",
        premise="Holds, with one part not reproduced: the original's create_env_state also takes "
                "a governor snapshot (tolaria/governor.py:83-113: the model's state_dict copied to "
                "the CPU, a device-to-host copy and a sync per env per batch) and wires telemetry "
                "callbacks; the host is a CIFAR-10 CNN there, an MLP here.",
        duration_s=(3.0, 8.0),
        notes=(
            "The environment as reviewed: esper.env.pool.EnvBatches hands out each batch's "
            "envs, recreated (new host networks, optimizers, CUDA streams; the data, drawn "
            "once, are shared) or reset in place, their host weights restored from the "
            "checkpoint (env_pool=checkpoint, the review's) or drawn again (env_pool=pool, "
            "ours).",
            "'boundary' rows: one timed call = one batch boundary of num_envs envs; allocations "
            "and bytes per boundary come from the profiling pass.",
            "'fragmentation' rows (CUDA only; 'needs CUDA' here): one call = a boundary and one "
            f"epoch per env; after {FRAGMENTATION_BATCHES} such batches from an emptied cache, "
            "reserved_growth_bytes and live_growth_bytes are what the batches made the "
            "allocator reserve and left in use, reserved_minus_allocated_bytes the process's "
            "cached but unused memory (fragmentation and slack, whoever caused it).",
            f"Check: both batches' envs run the same {CHECK_STEPS}-step script (germinate a seed, "
            "then wait) and must give identical observations, rewards and metrics.",
        ),
    ),
    recording=Recording(
        extra_metrics=_fragmentation,
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one batch of episodes a rollout
        headline_case=nearest_trainer_size,
    ),
))
