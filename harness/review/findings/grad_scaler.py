"""C1 (vectorized-training review): one GradScaler shared by the host and seed optimizers
vs one per optimizer, under mixed precision."""

from __future__ import annotations

import dataclasses

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.env.optimizers import amp_dtype
from esper.variants import Variants
from harness.findings import Case, Finding, max_abs_difference, register
from harness.measure.stats import wilson_interval
from harness.measure.timing import pinned_threads
from harness.review.findings.trainer_size import nearest_trainer_size

VARIANTS = ("shared", "per_optimizer")
#: optimizer steps of each stability run, and the steps whose gradients get an inf
STEPS = 24
INJECT_AT = (3, 8, 13, 18)
TARGETS = ("host", "seed")


def _cases(quick: bool) -> list[Case]:
    return [Case.of(train_batches=2)]


def germinated_env(config: EnvConfig, variant: str, device: torch.device) -> MorphoEnv:
    """A mixed-precision env with one training seed (slot 0): a host and a seed optimizer."""
    env = MorphoEnv(dataclasses.replace(config, amp=True), 0, device,
                    Variants(scaler=variant))
    action = {h: 0 for h in HEAD_NAMES}
    action.update(op=OP_INDEX["GERMINATE"], blueprint=2)  # a 32-wide MLP seed in slot 0
    env.apply_action(action)
    return env


def _build(case: Case, device: torch.device, seed: int) -> dict:
    config = EnvConfig(num_envs=1, train_batches=case["train_batches"], seed=seed)
    return {"envs": {v: germinated_env(config, v, device) for v in VARIANTS},
            "config": config, "device": device}


def _make_call(variant: str, inputs: dict):
    return inputs["envs"][variant].launch_epoch  # one epoch: train_batches steps of both


def parameters_of(env: MorphoEnv, which: str) -> list[torch.Tensor]:
    return list((env.host_network if which == "host" else env.slots[0].module).parameters())


def scaler_of(env: MorphoEnv, which: str) -> torch.amp.GradScaler:
    return env.scalers.get("shared") or env.scalers["host" if which == "host" else "slot0"]


def stability_run(config: EnvConfig, variant: str, device: torch.device, target: str,
                  steps: int = STEPS, inject_at: tuple[int, ...] = INJECT_AT) -> dict[str, int]:
    """`steps` single-batch epochs of a fresh germinated env; at each step of `inject_at`
    one gradient entry of `target`'s optimizer ("host" or "seed") is set to inf during
    backward. Counts, over the injected steps, the target's skipped steps and the other
    optimizer's skipped steps and scale changes (a skip: its parameters did not move)."""
    env = germinated_env(dataclasses.replace(config, train_batches=1), variant, device)
    other = "seed" if target == "host" else "host"
    step = {"k": -1}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        if step["k"] not in inject_at:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad

    handle = parameters_of(env, target)[0].register_hook(poison)
    counts = {"injected": 0, "target_skipped": 0, "other_skipped": 0, "other_scale_changed": 0}
    try:
        for k in range(steps):
            step["k"] = k
            before = {w: [p.detach().clone() for p in parameters_of(env, w)] for w in TARGETS}
            scale_before = scaler_of(env, other).get_scale()  # host sync: measurement only
            env.launch_epoch()
            if k not in inject_at:
                continue
            moved = {w: any(not torch.equal(b, p) for b, p in zip(before[w], parameters_of(env, w)))
                     for w in TARGETS}
            counts["injected"] += 1
            counts["target_skipped"] += not moved[target]
            counts["other_skipped"] += not moved[other]
            counts["other_scale_changed"] += scaler_of(env, other).get_scale() != scale_before
    finally:
        handle.remove()
    return counts


def _stability(variant: str, inputs: dict) -> dict[str, float]:
    """Per target optimizer: how often an inf in its gradients skipped it, skipped the
    other optimizer, or changed the other optimizer's scale (with a Wilson interval)."""
    out: dict[str, float] = {}
    for target in TARGETS:
        with pinned_threads(1):  # counts do not depend on threads; one is fastest when busy
            counts = stability_run(inputs["config"], variant, inputs["device"], target)
        prefix = f"inf_in_{target}_"
        out[prefix + "injected"] = float(counts["injected"])
        out[prefix + "skipped_it"] = float(counts["target_skipped"])
        out[prefix + "skipped_other"] = float(counts["other_skipped"])
        out[prefix + "changed_other_scale"] = float(counts["other_scale_changed"])
        low, high = wilson_interval(counts["other_scale_changed"], counts["injected"])
        out[prefix + "changed_other_scale_rate"] = counts["other_scale_changed"] / counts["injected"]
        out[prefix + "changed_other_scale_rate_low"] = low
        out[prefix + "changed_other_scale_rate_high"] = high
    return out


CPU_AMP = str(amp_dtype(torch.device("cpu"))).removeprefix("torch.")

register(Finding(
    id="C1-grad-scaler",
    title="Mixed precision: one GradScaler shared by host and seed optimizers vs one each",
    claim="If one optimizer step skips due to NaN/Inf gradients, the scaler still updates "
          "its scale factor based on that failure, which can cause the subsequent optimizer "
          "steps to also be affected inconsistently",
    ticket="vectorized-training-review.md",
    variants=VARIANTS,
    baseline="shared",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 0.0,
    extra_metrics=_stability,
    answer=("inf_in_host_changed_other_scale_rate", "inf_in_seed_changed_other_scale_rate"),
    duration_s=(3.0, 3.0),
    notes=(
        "The environment as reviewed: mixed precision (EnvConfig.amp) and separate SGD "
        "optimizers for the host and each training seed (esper.env.optimizers); "
        f"on CUDA float16 autocast with GradScaler('cuda'), on this torch's CPU "
        f"GradScaler('cpu') with {CPU_AMP} autocast.",
        "One timed call = one epoch (train_batches steps of both optimizers) of an env "
        "with one training seed; the check: both arrangements give identical metrics when "
        "no gradient overflows.",
        f"The stability answer: in {STEPS} single-batch steps from a fresh env, one "
        f"gradient entry of the host's (inf_in_host_*) or the seed's (inf_in_seed_*) "
        f"optimizer is set to inf at steps {', '.join(map(str, INJECT_AT))}. Counted at "
        "those steps: the poisoned optimizer skipped (skipped_it), the other optimizer "
        "skipped (skipped_other), the other optimizer's loss scale changed "
        "(changed_other_scale, and its rate with a 95% Wilson interval). Counts are exact.",
    ),
))
