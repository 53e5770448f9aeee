"""Rollout-buffer audit 4.3: the buffer's `[num_envs, max_steps, ...]` layout "may not be
the most cache-friendly layout" for batched evaluation; "consider `[max_steps, num_envs,
...]`". Both layouts timed where they differ: the per-step writes of a rollout, and the
read into what the batch-first LSTM evaluates."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from harness.findings import Case, Finding, max_abs_difference, register
from esper_review.findings.trainer_size import nearest_trainer_size
from esper_review.findings.measured_noise import between_runs

VARIANTS = ("env_major", "time_major")
STATE_DIM, HIDDEN, LAYERS = 218, 128, 1


def _cases(quick: bool) -> list[Case]:
    # the writes at 16 x 150 (2,400 adds a call, 15 s of a default run) read as the
    # trainer's 4 x 25 does: the same work per add, so only the read scales up
    cases = [Case.of(num_envs=4, max_steps=25, part=part) for part in ("read", "writes")]
    return cases if quick else cases + [Case.of(num_envs=16, max_steps=150, part="read")]


def field_shapes() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every field `RolloutBuffer.add` writes, by name: (shape of one step, dtype)."""
    fields = {"states": ((STATE_DIM,), torch.float32)}
    for head in HEAD_NAMES:
        fields[f"actions/{head}"] = ((), torch.int64)
        fields[f"log_probs/{head}"] = ((), torch.float32)
        fields[f"masks/{head}"] = ((HEAD_SIZES[head],), torch.bool)
    for name in ("values", "rewards", "bootstrap_values"):
        fields[name] = ((), torch.float32)
    for name in ("dones", "truncated"):
        fields[name] = ((), torch.bool)
    for name in ("hidden_h", "hidden_c"):
        fields[name] = ((LAYERS, HIDDEN), torch.float32)
    return fields


class Storage:
    """The buffer's fields in one layout: `env_major` `[n, m, ...]` (the reviewed buffer's,
    written at `[env, step]`) or `time_major` `[m, n, ...]` (written at `[step, env]`)."""

    def __init__(self, layout: str, num_envs: int, max_steps: int, device: torch.device) -> None:
        self.layout = layout
        outer = (num_envs, max_steps) if layout == "env_major" else (max_steps, num_envs)
        self.tensors = {name: torch.zeros(*outer, *shape, dtype=dtype, device=device)
                        for name, (shape, dtype) in field_shapes().items()}

    def write_rollout(self, steps: list[list[tuple]]) -> "Storage":
        """steps[t][env] = one add()'s values, in `field_shapes` order: written one cell
        per field, as add writes them (`self.states[env_id, step] = ...`)."""
        tensors = list(self.tensors.values())
        env_major = self.layout == "env_major"
        for t, envs in enumerate(steps):
            for env, values in enumerate(envs):
                index = (env, t) if env_major else (t, env)
                for tensor, value in zip(tensors, values):
                    tensor[index] = value
        return self

    def batch_first(self) -> dict[str, torch.Tensor]:
        """What evaluate reads: every field `[n, m, ...]` (batch first, as the policy's
        LSTM takes it) and the step-0 hidden states `[L, n, H]`, as get_batched_sequences
        returns them on the buffer's device: env-major fields as they are, time-major
        ones transposed into new contiguous tensors."""
        if self.layout == "env_major":
            out = dict(self.tensors)
            first = {k: out[k][:, 0] for k in ("hidden_h", "hidden_c")}  # [n, L, H]
        else:
            out = {k: t.transpose(0, 1).contiguous() for k, t in self.tensors.items()}  # [m, n, ...] -> [n, m, ...]
            first = {k: self.tensors[k][0] for k in ("hidden_h", "hidden_c")}  # [n, L, H]
        for name, hidden in first.items():
            out[f"initial_{name}"] = hidden.transpose(0, 1).contiguous()  # [n, L, H] -> [L, n, H]
        return out

    def env_major_view(self) -> dict[str, torch.Tensor]:
        """The fields as `[n, m, ...]` views (no copy): for comparing layouts."""
        if self.layout == "env_major":
            return dict(self.tensors)
        return {k: t.transpose(0, 1) for k, t in self.tensors.items()}


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Each step's values as add() gets them (tensors on `device`, Python numbers), and one
    storage per layout; for the read, both storages hold that rollout already."""
    n, m = case["num_envs"], case["max_steps"]
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(m):
        envs = []
        for _ in range(n):
            values = []
            for shape, dtype in field_shapes().values():
                if dtype == torch.bool:
                    value = torch.rand(shape, generator=g) < 0.5
                elif dtype == torch.int64:
                    value = torch.randint(0, 3, shape, generator=g)
                else:
                    value = torch.randn(shape, generator=g)
                # one-element fields as Python numbers, the rest as tensors on the device
                values.append(value.item() if not shape else value.to(device))
            envs.append(tuple(values))
        steps.append(envs)
    storages = {layout: Storage(layout, n, m, device) for layout in VARIANTS}
    if case["part"] == "read":
        for storage in storages.values():
            storage.write_rollout(steps)
    return {"steps": steps, "storages": storages, "part": case["part"]}


def _make_call(variant: str, inputs: dict):
    storage, steps = inputs["storages"][variant], inputs["steps"]
    if inputs["part"] == "writes":
        return lambda: storage.write_rollout(steps)
    return storage.batch_first


def _difference(output, reference) -> float:
    """Largest difference between two layouts' contents, read as `[n, m, ...]`."""
    if isinstance(output, Storage):
        output, reference = output.env_major_view(), reference.env_major_view()
    if output.keys() != reference.keys():
        return float("inf")
    return max(max_abs_difference(output[k], reference[k]) for k in reference)


register(Finding(
    id="AUDIT-4.3-buffer-layout",
    between_runs=between_runs("AUDIT-4.3-buffer-layout"),
    title="Buffer layout: env-major [num_envs, max_steps, ...] vs time-major [max_steps, num_envs, ...]",
    claim="the [num_envs, max_steps, ...] layout ... for batched network evaluation in "
          "get_batched_sequences ... may not be the most cache-friendly layout; consider "
          "[max_steps, num_envs, ...] for network evaluation",
    ticket="rollout-buffer-audit.md",
    variants=VARIANTS,
    baseline="env_major",
    proposed="time_major",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_difference,
    tolerance=lambda case: 0.0,
    reviewed="src/esper/simic/tamiyo_buffer.py:144, 172-173 (`[n, m, ...]` storage), "
             "231-252 (add's writes at [env_id, step_idx]), 356-381 (get_batched_sequences: "
             "the fields as stored) @181a4c41",
    fix="Audit 4.3: 'If profiling shows memory bandwidth issues, consider [max_steps, "
        "num_envs, ...] for network evaluation' (`time_major`: the same fields stored "
        "[m, n, ...], written at [step, env], transposed back to [n, m, ...] for evaluate)",
    premise="The network that evaluates the batch takes it batch first: its LSTM is "
            "`nn.LSTM(..., batch_first=True)` (src/esper/simic/tamiyo_network.py:83 "
            "@181a4c41; src/esper/simic/agent/network.py:79-84 @2df957ed; ours "
            "esper/agent/policy.py), so `[num_envs, max_steps, ...]` is the layout "
            "evaluate reads with no copy, and a time-major buffer needs a transpose and a "
            "copy of every field before each evaluate (or a time-major network, which is "
            "not the reviewed one).",
    notes=(
        "part=read: one timed call = the batch as evaluate reads it on the buffer's device "
        "(as get_batched_sequences returns it, no transfer): env_major returns the fields "
        "as stored and copies the step-0 hidden states into [L, n, H] (the original's "
        "permute + contiguous); time_major copies each of the 32 fields into a new "
        "contiguous [n, m, ...] tensor (transpose + contiguous), while its step-0 hidden "
        "states, one contiguous [n, L, H] row, need no copy with one LSTM layer.",
        "part=writes: one timed call = one rollout's per-step writes, num_envs x max_steps "
        "add()s of the 32 fields the buffer stores (state [218], 8 actions, 8 log-probs, "
        "8 masks [K], value, reward, bootstrap value, done, truncated, hidden h and c "
        "[1, 128]), one indexed copy each, at [env, step] or [step, env]: the same number "
        "of copies of the same rows, only the stride between consecutive steps differs. "
        "The add()'s checks are not part of it (AUDIT-5.1-add-checks times them).",
        "Both layouts must hold the same values, read as [n, m, ...].",
    ),
))
