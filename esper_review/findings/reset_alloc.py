"""B4-DRL-03: "zero_tensor.clone() inside loop creates a new tensor on every terminal state"."""

from __future__ import annotations

import torch

from esper.gae import RESETS, compute_gae
from harness.findings import (
    About, Case, Finding, Reading, Recording, max_relative_error, register, rounding_tolerance
)
from esper_review.findings.fragmentation import fragmentation
from esper_review.findings.gae_methods import GAMMA, LAMBDA, build_gae_inputs, gae_args
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration


#: GAE calls run before reading the allocator's reserved-minus-allocated bytes (CUDA)
FRAGMENTATION_CALLS = 200


def _cases(quick: bool) -> list[Case]:
    sizes = [(4, 25)] if quick else [(4, 25), (16, 150)]
    cases = [Case.of(num_envs=e, max_steps=t, dones=d)
             for e, t in sizes for d in ("episode", "random0.05")]
    # the allocator's state after many calls: a default run's (CUDA only)
    return cases if quick else cases + [
        Case.of(num_envs=4, max_steps=25, dones="random0.05", measure="fragmentation")]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """The GAE inputs (`build_gae_inputs`) and whether this case reads the allocator."""
    params = dict(case.params)
    return {**build_gae_inputs(case, device, seed),
            "fragmentation": params.get("measure") == "fragmentation"}


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    if dict(case.params).get("measure") == "fragmentation" and device.type != "cuda":
        return "needs CUDA"
    return None


def _make_call(variant: str, inputs: dict):
    args = gae_args(inputs, "step_counts_list")
    return lambda: compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="loop",
                               reset=variant)[0]


def _terminals(variant: str, inputs: dict) -> dict[str, float]:
    # host sync, outside any timed region
    out = {"true_terminals": float((inputs["dones"] & ~inputs["truncated"]).sum())}
    if inputs["fragmentation"]:
        out.update(fragmentation(_make_call(variant, inputs), inputs["rewards"].device,
                                 FRAGMENTATION_CALLS))
    return out


register(Finding(
    id="B4-DRL-03",
    title="GAE loop reset: zero.clone() vs a precomputed not-done mask",
    claim="zero_tensor.clone() inside loop creates a new tensor on every terminal state - "
          "up to 25 allocations per environment",
    variants=RESETS,
    baseline="clone",
    proposed="mask",
    cases=_cases,
    build=_build,
    skip=_skip,
    make_call=_make_call,
    check=max_relative_error,
    # the resets change what is stored, not the arithmetic: the bound of one float32 chain
    tolerance=lambda case, device: rounding_tolerance(case["max_steps"], torch.float32, device),
    ours=("assign", "restructured"),
    about=About(
        ticket="B4-DRL-03-zero-tensor-clone.md",
        reviewed="src/esper/simic/agent/rollout_buffer.py:367-416 @599f3895 (the clone at 388 "
                 "once per env, at 409 at each true terminal)",
        fix="Option 3 of the ticket applied to the reviewed lines and no others (`reset=mask`, "
            "esper/gae/loop.py): `done_mask = (dones & ~truncated).float()` per env before its "
            "time loop, the reset at 407-409 removed and line 412 written `last_gae = delta + "
            "gamma * gae_lambda * (1 - done_mask[t]) * last_gae`; the clone per env at 388 stays",
        premise="A clone runs once per env (line 388) and once per true terminal (409: `dones[t] "
                "and not truncated[t]`), not once per terminal step: the DRL cross-review's 'at "
                "most once per env per rollout' holds. In the reviewed trainer there is no true "
                "terminal at all: an episode ends at its time limit with done and truncated "
                "both set (599f3895 src/esper/simic/training/vectorized.py:2754-2755 `done = "
                "epoch == max_epochs; truncated = done`), so 409 never clones there and a call "
                "allocates one clone per env. What the fix removes per step is a host read "
                "(408's `if dones[t] and not truncated[t]`), not an allocation.",
        notes=(
            "All four run the per-env loop GAE (esper.gae.loop); only the terminal reset "
            "differs. clone: the reviewed lines, op for op (tests/esper/gae/test_loop_reads.py "
            "holds the finding's own call to a re-typed copy of the original: the same ops, "
            "host reads and allocations). mask (the ticket's option 3 in those lines): no "
            "branch and no clone at a terminal, but one more tensor per step "
            "(`1 - done_mask[t]`) and three per env (the mask). assign (ours): clone with "
            "`last_gae = zero_tensor` in place of each `zero_tensor.clone()`, the branches and "
            "reads kept: clone vs assign is the allocations alone. restructured (ours): a loop "
            "of its own shape, 2 host reads per step and a not-done trace precomputed once "
            "per call.",
            "Where the measured differences come from: per step of an episode, clone and "
            "assign make 3 host reads (each a host sync on CUDA), mask and restructured 2; per "
            "call clone allocates one clone per env (4 at 4 x 25) plus one per true terminal, "
            "assign no clone at all. 'episode' rows end truncated as the reviewed trainer's do (no true "
            "terminal: 409 never clones); 'random0.05' rows have true terminals with p=0.05. "
            "So clone -> assign is what the ticket's mechanism (allocations) is worth; the "
            "allocations column shows the clones, the host_syncs column the reads.",
            "The ticket's 'in a tight loop, this causes memory fragmentation' is about the "
            "device's caching allocator: the 'fragmentation' row (CUDA only; 'needs CUDA' "
            f"here) reads reserved_growth_bytes and reserved_minus_allocated_bytes after "
            f"{FRAGMENTATION_CALLS} calls of each reset from an emptied cache, on inputs with "
            "true terminals (a clone each). "
            "On the CPU the allocations column counts what the clones add.",
            "Allocations per call come from the profiling pass (profile_memory).",
        ),
    ),
    recording=Recording(
        extra_metrics=_terminals,
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one GAE per update
        headline_case=nearest_trainer_size,
    ),
))
