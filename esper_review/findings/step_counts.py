"""B4-PT-05: "step_counts is a Python list, not a tensor - ... requires CPU-GPU round
trips", timed where the bookkeeping costs something: each add() that counts a step up,
and the count tensor that `get_batched_sequences` builds once per update."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.env.mask_batch import masks_to_device
from esper.rollout.buffer import RolloutBuffer
from esper.variants import AXES, Variants
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from esper_review.findings.copies import copies_metric
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration

STATE_DIM, HIDDEN = 218, 128
VARIANTS = AXES["step_counts"]


def _cases(quick: bool) -> list[Case]:
    sizes = [(4, 25)] if quick else [(4, 25), (16, 150)]
    return [Case.of(num_envs=e, max_steps=t) for e, t in sizes]


def rollout_steps(num_envs: int, max_steps: int, device: torch.device, seed: int) -> list:
    """Every step of one rollout, prepared in advance: per step, its action masks as the
    envs give them (`{head: [N, K]}` on the host), one add()'s arguments per env without
    masks (states and hidden states on `device`, as the policy leaves them), and on the
    CPU each env's mask rows (views, taken here once: there is no transfer)."""
    g = torch.Generator().manual_seed(seed)
    steps = []
    for t in range(max_steps):
        host_masks = {h: torch.ones(num_envs, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
        adds = [dict(
            env_id=env,
            state=torch.randn(STATE_DIM, generator=g).to(device),
            actions={h: int(torch.randint(0, k, (), generator=g)) for h, k in HEAD_SIZES.items()},
            log_probs={h: float(-torch.rand((), generator=g)) for h in HEAD_NAMES},
            value=float(torch.randn((), generator=g)),
            reward=float(torch.randn((), generator=g)),
            done=t == max_steps - 1,
            hidden_h=torch.randn(1, 1, HIDDEN, generator=g).to(device),
            hidden_c=torch.randn(1, 1, HIDDEN, generator=g).to(device),
            truncated=t == max_steps - 1,
            bootstrap_value=float(torch.randn((), generator=g)),
        ) for env in range(num_envs)]
        cpu_rows = ([{h: m[env] for h, m in host_masks.items()} for env in range(num_envs)]
                    if device.type == "cpu" else None)
        steps.append((host_masks, adds, cpu_rows))
    return steps


def fill(buffer: RolloutBuffer, steps: list) -> None:
    """One rollout into `buffer`, as the trainer adds it with `masks=packed`: per step, the
    step's masks reach the device in one transfer (on CUDA), then one add() per env."""
    buffer.reset()
    for host_masks, adds, cpu_rows in steps:
        if cpu_rows is None:
            masks = masks_to_device(host_masks, buffer.device)
            rows = [{h: m[env] for h, m in masks.items()} for env in range(len(adds))]
        else:
            rows = cpu_rows
        for add, env_masks in zip(adds, rows):
            buffer.add(**add, masks=env_masks)


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One buffer per variant on `device` (as the trainer keeps it: on the agent's device)
    and the rollout each call adds into it."""
    num_envs, max_steps = case["num_envs"], case["max_steps"]
    steps = rollout_steps(num_envs, max_steps, device, seed)
    buffers = {kind: RolloutBuffer(num_envs, max_steps, STATE_DIM, lstm_hidden_dim=HIDDEN,
                                   device=device, variants=Variants(step_counts=kind))
               for kind in VARIANTS}
    return {"buffers": buffers, "device": device, "steps": steps}


def _make_call(variant: str, inputs: dict):
    buffer, device, steps = inputs["buffers"][variant], inputs["device"], inputs["steps"]

    def rollout_and_update_read():
        fill(buffer, steps)  # reset(), then every add(): each counts its env's step up
        return buffer.get_batched_sequences(device)

    return rollout_and_update_read


def _max_difference(output: dict, reference: dict) -> float:
    """Largest difference over every tensor of two `get_batched_sequences` dicts."""
    pairs = []
    for key, value in output.items():
        if isinstance(value, dict):
            pairs += [(t, reference[key][head]) for head, t in value.items()]
        else:
            pairs.append((value, reference[key]))
    return max(max_abs_difference(out, ref) for out, ref in pairs)


register(Finding(
    id="B4-PT-05",
    title="Buffer step counts at the update: Python list vs CPU tensor vs cached tensor",
    claim="step_counts is a Python list, not a tensor - prevents vectorized operations and "
          "requires CPU-GPU round trips",
    variants=VARIANTS,
    baseline="list",
    proposed="tensor",
    ours=("numpy_view",),
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_max_difference,
    tolerance=lambda case: 0.0,
    about=About(
        ticket="B4-PT-05-step-counts-list.md",
        reviewed="src/esper/simic/agent/rollout_buffer.py:255-345 (add: `step_idx = "
                 "self.step_counts[env_id]` at 295, `self.step_counts[env_id] = step_idx + 1` at "
                 "345), 506-511 (reset) and 445-504 (get_batched_sequences: `torch.tensor("
                 "self.step_counts, device=device)` at 458, the valid mask at 459-460, then 33 "
                 "`.to(device)` of tensors already there) @599f3895",
        fix="The ticket's first fix as written (`tensor`): `torch.zeros(num_envs, "
            "dtype=torch.int32, device='cpu')`, `self.step_counts[env_idx] += 1` in each add "
            "(which also reads its step back from the tensor), `self.step_counts.to(device, "
            "non_blocking=True)` for the valid mask. Its second option, a list with a cached "
            "int32 tensor rebuilt when a dirty flag is set (`cached`), is another row; ours "
            "(`numpy_view`) is an int64 tensor read and counted up through a NumPy view of its "
            "memory: no aten op per add.",
        premise="The ticket's 'CPU-GPU round trips' are one conversion per update: the "
                "original builds the count tensor once (line 458) and reads the list as Python "
                "ints everywhere else (GAE 376, normalize_advantages 423 and 439: slices, no "
                "tensor). The '30+ tensor.to() transfers' the cross-reviews say dominate it "
                "move nothing: the buffer lives on the agent's device (ppo.py:318-325 "
                "@599f3895), so each `.to(device)` returns its tensor.",
        notes=(
            "One timed call = what the bookkeeping takes part in once per iteration: reset(), "
            "one rollout's add() calls (num_envs x max_steps, each reading its step and "
            "counting it up: list and cached in Python, tensor by tensor ops, numpy_view "
            "through NumPy) and get_batched_sequences(device) of the full buffer on the run's "
            "device, as PPOAgent's update calls it once (the buffer's tensors returned as they "
            "are, the count tensor, the valid mask). The adds' writes are the same in every "
            "row; the cached row rebuilds its tensor once, after the adds set its dirty flag.",
            "The counts are read elsewhere once per update too: the loop GAE reads a tensor's "
            "per env (a host read each; a list's, no read) and normalize_advantages reads the "
            "list by row slices, as the original (tests/esper/rollout/test_step_counts.py "
            "holds it to a re-typed copy), a tensor by masked sums. Those are not in this "
            "call: B4-CR-03 and B4-DRL-03 time the GAE.",
            "On the CPU the count tensor moves nowhere; on CUDA host_to_device_copies counts "
            "the transfer: list and cached copy the list (a blocking copy from pageable "
            "memory), tensor and numpy_view copy their CPU tensor non-blocking.",
            "Every variant must produce identical batches (the list variant is the reference).",
        ),
    ),
    recording=Recording(
        extra_metrics=copies_metric(_make_call),
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one rollout and one update
        headline_case=nearest_trainer_size,
    ),
))
