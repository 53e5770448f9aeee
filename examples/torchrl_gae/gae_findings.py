"""The claim: "Switch our GAE loop to TorchRL's GAE module: ~4x faster."

Measured by esper-bench (`python -m harness.run`, which imports this module because
pyproject.toml names it): our loop (`my_rl.gae`) against TorchRL's `GAE` module and its
two functional forms, on the same rollouts, after checking every variant against the
loop computed in float64.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.objectives.value import GAE
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate, vec_generalized_advantage_estimate,
)

from harness import About, Case, Finding, max_abs_difference, register
from my_rl.gae import gae

GAMMA, LMBDA = 0.99, 0.95


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case.of(num_envs=4, num_steps=1024), Case.of(num_envs=64, num_steps=1024)]
    return [Case.of(num_envs=num_envs, num_steps=num_steps)
            for num_envs in (4, 64) for num_steps in (128, 1024)]


def build(case: Case, device: torch.device, seed: int) -> dict:
    """A rollout from `seed`: every tensor `[num_envs, num_steps, 1]`, episodes ending at
    random (2% of steps), the TensorDict the GAE module reads, and the module itself."""
    generator = torch.Generator().manual_seed(seed)
    shape = (case["num_envs"], case["num_steps"], 1)
    done = torch.rand(shape, generator=generator) < 0.02
    rollout = {
        "state_value": torch.randn(shape, generator=generator),
        "next_state_value": torch.randn(shape, generator=generator),
        "reward": torch.randn(shape, generator=generator),
        "done": done,
        "terminated": done.clone(),  # no time limits: every end is a true terminal
    }
    rollout = {name: tensor.to(device) for name, tensor in rollout.items()}
    batch = TensorDict({"state_value": rollout["state_value"],
                        "next": {"state_value": rollout["next_state_value"],
                                 "reward": rollout["reward"], "done": rollout["done"],
                                 "terminated": rollout["terminated"]}},
                       batch_size=shape[:2], device=device)
    module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    return {"rollout": rollout, "batch": batch, "module": module}


def make_call(variant: str, inputs: dict):
    """The timed call of `variant`; each returns the advantage `[num_envs, num_steps, 1]`."""
    r = inputs["rollout"]
    args = (GAMMA, LMBDA, r["state_value"], r["next_state_value"], r["reward"], r["done"],
            r["terminated"])
    if variant == "ours":
        return lambda: gae(*args)[0]
    if variant == "torchrl_module":
        module, batch = inputs["module"], inputs["batch"]
        return lambda: module(batch)["advantage"]
    if variant == "torchrl_functional":
        return lambda: generalized_advantage_estimate(*args)[0]
    return lambda: vec_generalized_advantage_estimate(*args)[0]


def reference(inputs: dict) -> torch.Tensor:
    """Our loop in float64: what every variant must agree with."""
    r = {name: t.double() if t.is_floating_point() else t for name, t in inputs["rollout"].items()}
    return gae(GAMMA, LMBDA, r["state_value"], r["next_state_value"], r["reward"], r["done"],
               r["terminated"])[0]


register(Finding(
    id="GAE-torchrl",
    title="GAE: our loop vs TorchRL's GAE module and functional forms",
    claim="Switch our GAE loop to TorchRL's GAE module: ~4x faster",
    variants=("ours", "torchrl_module", "torchrl_functional", "torchrl_vec"),
    baseline="ours",
    cases=cases,
    build=build,
    make_call=make_call,
    reference=reference,
    check=max_abs_difference,
    tolerance=1e-4,
    about=About(
        ticket="a code review comment",
        notes=("Inputs are float32 [num_envs, num_steps, 1]; the reference is our loop in "
               "float64.",
               "torchrl_module is GAE(value_network=None) on a TensorDict holding the values. "
               "Built with vectorized left at None, it runs the loop (torchrl_functional), "
               "whatever its docstring says: the counters show it (no host syncs)."),
    ),
))
