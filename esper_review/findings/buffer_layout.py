"""Rollout-buffer audit 4.3: the buffer's `[num_envs, max_steps, ...]` layout "may not be
the most cache-friendly layout" for batched evaluation; "consider `[max_steps, num_envs,
...]` for network evaluation". Both layouts timed like with like: the network evaluating
the batch in the buffer's own layout (a batch-first LSTM on env-major fields, a time-major
LSTM on time-major ones), the batch read as the reviewed get_batched_sequences reads it,
and the per-step writes of a rollout."""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.agent.policy import FactoredRecurrentActorCritic, MaskedCategorical
from harness.findings import About, Case, Finding, Reading, max_abs_difference, register
from esper_review.findings.step_counts import rollout_steps
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration

VARIANTS = ("env_major", "time_major")
STATE_DIM, HIDDEN, LAYERS = 218, 128, 1
#: get_batched_sequences' fields, in its order (599f3895 rollout_buffer.py:466-497)
BATCH_FIELDS = ("states", *(f"actions/{h}" for h in HEAD_NAMES),
                *(f"log_probs/{h}" for h in HEAD_NAMES), "values", "rewards", "advantages",
                "returns", *(f"masks/{h}" for h in HEAD_NAMES), "hidden_h", "hidden_c")


def _cases(quick: bool) -> list[Case]:
    # the writes at 16 x 150 (2,400 adds a call, 15 s of a default run) read as the
    # trainer's 4 x 25 does: the same work per add, so only the read scales up
    cases = [Case.of(num_envs=4, max_steps=25, part=part)
             for part in ("evaluate", "read", "writes")]
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


class Laid(NamedTuple):
    """A call's tensors and the layout they are in (what the check reads them as)."""

    layout: str
    tensors: dict[str, torch.Tensor]


class Storage:
    """The buffer's fields in one layout: `env_major` `[n, m, ...]` (the reviewed buffer's,
    written at `[env, step]`) or `time_major` `[m, n, ...]` (written at `[step, env]`);
    `advantages` and `returns` beside what add writes, and the step counts (a list)."""

    def __init__(self, layout: str, num_envs: int, max_steps: int, device: torch.device) -> None:
        self.layout = layout
        self.max_steps = max_steps
        outer = (num_envs, max_steps) if layout == "env_major" else (max_steps, num_envs)
        shapes = {**field_shapes(), "advantages": ((), torch.float32),
                  "returns": ((), torch.float32)}
        self.tensors = {name: torch.zeros(*outer, *shape, dtype=dtype, device=device)
                        for name, (shape, dtype) in shapes.items()}
        self.step_counts = [0] * num_envs

    def write_rollout(self, steps: list[list[dict]]) -> "Storage":
        """steps[t][env] = one add()'s arguments: written one cell per field at
        `[env, t]` or `[t, env]`, as the reviewed add writes them (599f3895
        rollout_buffer.py:308-345, in its order: `state.detach()`, the actions, log-probs,
        value, reward, done, truncated and bootstrap value as given, `mask.detach().bool()`,
        `hidden.detach().squeeze(1)`), then the step counted."""
        fields = self.tensors
        env_major = self.layout == "env_major"
        for t, envs in enumerate(steps):
            for env, add in enumerate(envs):
                index = (env, t) if env_major else (t, env)
                fields["states"][index] = add["state"].detach()
                for head in HEAD_NAMES:
                    fields[f"actions/{head}"][index] = add["actions"][head]
                for head in HEAD_NAMES:
                    fields[f"log_probs/{head}"][index] = add["log_probs"][head]
                for name, key in (("values", "value"), ("rewards", "reward"), ("dones", "done"),
                                  ("truncated", "truncated"),
                                  ("bootstrap_values", "bootstrap_value")):
                    fields[name][index] = add[key]
                for head in HEAD_NAMES:
                    fields[f"masks/{head}"][index] = add["masks"][head].detach().bool()
                fields["hidden_h"][index] = add["hidden_h"].detach().squeeze(1)
                fields["hidden_c"][index] = add["hidden_c"].detach().squeeze(1)
                self.step_counts[env] = t + 1
        return self

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The batch as get_batched_sequences reads it (599f3895 rollout_buffer.py:454-504,
        tamiyo_buffer.py:344-382 @181a4c41), in this storage's layout: the valid mask
        from the counts, each field `.to(device, non_blocking=...)` as stored, the step-0
        hidden states `[L, n, H]` by `permute(1, 0, 2).contiguous()` of the `[n, L, H]`
        slice (`[:, 0]` env-major, `[0]` time-major). The valid mask is `[n, m]` or
        `[m, n]`, by the same ops."""
        env_major = self.layout == "env_major"
        counts = torch.tensor(self.step_counts, device=device).unsqueeze(1 if env_major else 0)
        steps = torch.arange(self.max_steps, device=device).unsqueeze(0 if env_major else 1)
        valid_mask = steps < counts
        nb = device.type == "cuda"
        out = {name: self.tensors[name].to(device, non_blocking=nb) for name in BATCH_FIELDS}
        out["valid_mask"] = valid_mask
        for name in ("hidden_h", "hidden_c"):
            hidden = self.tensors[name]
            first = hidden[:, 0, :, :] if env_major else hidden[0, :, :, :]  # [n, L, H]
            out[f"initial_{name}"] = first.permute(1, 0, 2).contiguous().to(device, non_blocking=nb)
        return out

    def env_major_view(self) -> dict[str, torch.Tensor]:
        """The fields as `[n, m, ...]` views (no copy): for comparing layouts."""
        if self.layout == "env_major":
            return dict(self.tensors)
        return {k: t.transpose(0, 1) for k, t in self.tensors.items()}


def evaluate_batch(policy: FactoredRecurrentActorCritic, batch: dict) -> dict[str, torch.Tensor]:
    """The policy's evaluate (esper.agent.policy `evaluate`, from the stored step-0 state,
    no episode end inside a row) on a batch in the layout its LSTM takes: per head the
    log-probability of the stored action and the normalised entropy, and the values, each
    `[n, m]` batch first or `[m, n]` time-major. The masks are not validated (no host
    read); the policy's input checks, which assume batch-first inputs, are left out for
    both layouts."""
    encoded = policy.encoder(batch["states"])
    out, _ = policy.lstm(encoded, (batch["initial_hidden_h"], batch["initial_hidden_c"]))
    features = policy.lstm_norm(out)
    outputs = {}
    for head in HEAD_NAMES:
        dist = MaskedCategorical(policy.heads[head](features), batch[f"masks/{head}"],
                                 validate=False)
        outputs[f"log_probs/{head}"] = dist.log_prob(batch[f"actions/{head}"])
        outputs[f"entropy/{head}"] = dist.entropy()
    outputs["values"] = policy.value_head(features).squeeze(-1).float()
    return outputs


def _policies(seed: int, device: torch.device) -> dict[str, FactoredRecurrentActorCritic]:
    """The trainer-sized policy (batch-first, as reviewed) and its time-major twin: the
    same weights, its LSTM taking `[T, B, H]` (`batch_first=False`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = FactoredRecurrentActorCritic(STATE_DIM, HIDDEN, LAYERS).to(device)
    twin = copy.deepcopy(policy)
    twin.lstm.batch_first = False
    return {"env_major": policy, "time_major": twin}


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Each step's add() arguments per env (`rollout_steps`: tensors on `device`, Python
    numbers, the step's masks on `device`), and one storage per layout; for the read and
    the evaluation, both storages hold that rollout already."""
    n, m = case["num_envs"], case["max_steps"]
    steps = []
    for host_masks, adds, _ in rollout_steps(n, m, device, seed):
        masks = {h: t.to(device) for h, t in host_masks.items()}
        steps.append([{**add, "masks": {h: t[env] for h, t in masks.items()}}
                      for env, add in enumerate(adds)])
    storages = {layout: Storage(layout, n, m, device) for layout in VARIANTS}
    if case["part"] != "writes":
        for storage in storages.values():
            storage.write_rollout(steps)
    inputs = {"steps": steps, "storages": storages, "part": case["part"], "device": device}
    if case["part"] == "evaluate":
        inputs["policies"] = _policies(seed, device)
    return inputs


def _make_call(variant: str, inputs: dict):
    storage, steps, device = inputs["storages"][variant], inputs["steps"], inputs["device"]
    if inputs["part"] == "writes":
        return lambda: storage.write_rollout(steps)
    if inputs["part"] == "read":
        return lambda: Laid(variant, storage.read(device))
    policy = inputs["policies"][variant]
    return lambda: Laid(variant, evaluate_batch(policy, storage.read(device)))


def _as_env_major(laid: Laid) -> dict[str, torch.Tensor]:
    """A call's tensors as `[n, m, ...]` (time-major ones transposed; the step-0 hidden
    states are `[L, n, H]` in both)."""
    if laid.layout == "env_major":
        return laid.tensors
    return {k: t if k.startswith("initial_") else t.transpose(0, 1)
            for k, t in laid.tensors.items()}


def _difference(output, reference) -> float:
    """Largest difference between two layouts' contents or outputs, read as `[n, m, ...]`."""
    if isinstance(output, Storage):
        output, reference = output.env_major_view(), reference.env_major_view()
    else:
        output, reference = _as_env_major(output), _as_env_major(reference)
    if output.keys() != reference.keys():
        return float("inf")
    return max(max_abs_difference(output[k], reference[k]) for k in reference)


register(Finding(
    id="AUDIT-4.3-buffer-layout",
    title="Buffer layout: env-major [num_envs, max_steps, ...] vs time-major [max_steps, num_envs, ...]",
    claim="the [num_envs, max_steps, ...] layout ... for batched network evaluation in "
          "get_batched_sequences ... may not be the most cache-friendly layout; consider "
          "[max_steps, num_envs, ...] for network evaluation",
    variants=VARIANTS,
    baseline="env_major",
    proposed="time_major",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_difference,
    tolerance=lambda case: 0.0,
    about=About(
        ticket="rollout-buffer-audit.md",
        reviewed="src/esper/simic/tamiyo_buffer.py:144, 172-173 (`[n, m, ...]` storage), "
                 "231-252 (add's writes at [env_id, step_idx]), 356-381 (get_batched_sequences: "
                 "the fields as stored) @181a4c41",
        fix="Audit 4.3: 'If profiling shows memory bandwidth issues, consider [max_steps, "
            "num_envs, ...] for network evaluation' (`time_major`: the same fields stored "
            "[m, n, ...], written at [step, env], read as stored, and evaluated by the same "
            "network with a time-major LSTM, `batch_first=False`, the same weights)",
        premise="The network that evaluates the batch takes it batch first: its LSTM is "
                "`nn.LSTM(..., batch_first=True)` (src/esper/simic/tamiyo_network.py:83 "
                "@181a4c41; src/esper/simic/agent/network.py:79-84 @2df957ed; ours "
                "esper/agent/policy.py), so `[num_envs, max_steps, ...]` is the layout "
                "evaluate reads with no copy; a time-major buffer needs either a transpose and "
                "a copy of every field before each evaluate or a time-major network, which is "
                "not the reviewed one (measured here: the audit's 'for network evaluation').",
        notes=(
            "part=evaluate (the headline): one timed call = the batch read as below, then the "
            "policy's evaluate forward over it (encoder, LSTM from the stored step-0 state, "
            "layer norm, 8 masked heads' log-probs and entropies, the value head; "
            "esper.agent.policy, trainer-sized: 218 features, LSTM 128), with gradients as "
            "the update runs it: env_major with the reviewed batch-first LSTM, time_major "
            "with the same weights in a time-major LSTM. Each row evaluates its own layout: "
            "no copy to the other one on either side.",
            "part=read: one timed call = the batch as get_batched_sequences reads it on the "
            "buffer's device (the reviewed lines, no transfer: every field returned as "
            "stored, the valid mask, the step-0 hidden states permuted into [L, n, H] and "
            "made contiguous), in each layout.",
            "part=writes: one timed call = one rollout's per-step writes, num_envs x max_steps "
            "add()s of the 32 fields the buffer stores (state [218], 8 actions, 8 log-probs, "
            "value, reward, done, truncated, bootstrap value, 8 masks [K], hidden h and c "
            "[1, 128]), as the reviewed add writes them, at [env, step] or [step, env]: the "
            "same copies of the same rows, only the stride between consecutive steps differs. "
            "The add()'s checks are not part of it (AUDIT-5.1-add-checks times them).",
            "Both layouts must hold, read and evaluate to the same values, read as "
            "[n, m, ...].",
        ),
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one rollout and one update
        headline_case=nearest_trainer_size,
    ),
))
