"""The optimizers of one environment: SGD for the host and one SGD per live seed.

As in the reviewed system (src/esper/simic/training/vectorized.py @2df957ed): the host's
SGD (lr, momentum, weight decay: 844-846) is made with the env and lives the whole
episode; each slot with a live seed gets an SGD of its own (the seed lr, momentum, no
weight decay: 970-981) and keeps it, momentum included, through every stage it trains in
(TRAINING, BLENDING and FOSSILIZED: "Seeds can continue training through
BLENDING/PROBATIONARY/FOSSILIZED", 960-969), until the slot is emptied or regrown (the
optimizer is dropped when a seed is pruned or germinated: 1828, 1849, 2023). Each batch
zeroes every gradient, runs one backward, steps the host, then each seed in slot order
(983-985, 1031-1039).

Two reviewed choices act here:

- C1, `Variants.scaler`, under mixed precision (`EnvConfig.amp`): one GradScaler
  `shared` by all optimizers (the original: `scaler.step` for each, then one
  `scaler.update()`), or one per optimizer (`per_optimizer`). PyTorch's GradScaler checks
  each optimizer's gradients for inf/NaN on its own, so a shared scaler skips only the
  step of the optimizer whose gradients overflowed, but its one `update()` halves the
  scale for all of them. With one backward pass all gradients carry the host scaler's
  scale; a seed with a scaler of its own has its gradients rescaled to that scaler's
  scale before its step (a power of two: exact).
- C3, `Variants.seed_clip`: seed optimizers stepped as they are (`none`, the original)
  or after `clip_grad_norm_(seed parameters, EnvConfig.seed_clip_norm)` (`clip`); under
  mixed precision the gradients are unscaled first.

A latent bug of the original is not copied: under mixed precision it calls
`scaler.step` on every live seed's optimizer, and PyTorch raises "No inf checks were
recorded for this optimizer" for one none of whose parameters got a gradient. Here such
an optimizer is stepped without the scaler (a no-op without gradients), the guard the
original added later (vectorized.py:1456-1465 @599f3895). Every live seed of this
environment is in the forward pass, so none is without gradients; the guard keeps a
future one from crashing.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from esper.checks import check_device
from esper.variants import AXES

Tensor = torch.Tensor
HOST = "host"


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype of mixed precision on `device`: float16 on CUDA (the reviewed
    system's), and on the CPU float16 where this torch's CPU autocast runs it, else
    bfloat16. The original has no mixed precision on the CPU."""
    if device.type == "cuda" or _cpu_autocast_runs_float16():
        return torch.float16
    return torch.bfloat16


_cpu_float16: bool | None = None


def _cpu_autocast_runs_float16() -> bool:
    global _cpu_float16
    if _cpu_float16 is None:
        with torch.autocast("cpu", dtype=torch.float16):
            out = torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2))
        _cpu_float16 = out.dtype == torch.float16
    return _cpu_float16


class EnvOptimizers:
    """SGD for the host parameters and for each live seed, with the env's AMP scalers.

    Args:
        host_params: the host network's parameters.
        lr, momentum, weight_decay: the host's SGD (`EnvConfig.lr`, `.momentum`,
            `.weight_decay`).
        scaler: mixed precision's GradScaler arrangement (a `Variants.scaler` value), or
            None without mixed precision.
        device: where the GradScalers work (its type: `cuda` or `cpu`).
        seed_clip_norm: max gradient norm of each seed's parameters, or None (no clip).

    Seeds are added with `add_seed` and dropped with `drop_seed`; an optimizer lives
    until it is dropped, so its momentum does.
    """

    def __init__(self, host_params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, scaler: str | None = None,
                 device: torch.device | str = "cpu", seed_clip_norm: float | None = None
                 ) -> None:
        if scaler is not None and scaler not in AXES["scaler"]:
            raise ValueError(f"scaler: expected None or one of {AXES['scaler']}; got {scaler!r}")
        self.host = torch.optim.SGD(list(host_params), lr=lr, momentum=momentum,
                                    weight_decay=weight_decay)
        self.seeds: dict[str, torch.optim.SGD] = {}
        """Seed optimizers by name (`slot<i>`), in slot order."""
        self._seed_params: dict[str, list[Tensor]] = {}
        self._arrangement = scaler
        self._device = check_device("EnvOptimizers: device", device)
        self.scalers: dict[str, torch.amp.GradScaler] | None = (
            None if scaler is None else make_scalers(self._device, scaler, ()))
        """Mixed precision's GradScalers by name (`shared`, or `host` and `slot<i>`)."""
        self.seed_clip_norm = seed_clip_norm
        self.grad_norms: list | None = None
        """When a list, each seed step appends `(name, norm)`: the seed's gradient norm
        before any clipping, a 0-d device tensor (measurement; costs a norm)."""
        self.overflows: list | None = None
        """When a list, under mixed precision each scaled step appends `(name, found)`:
        1.0 when its scaler found an inf/NaN in that optimizer's gradients and skipped
        the step, else 0.0, a 0-d float device tensor (measurement; read without a sync)."""

    @property
    def optimizers(self) -> dict[str, torch.optim.SGD]:
        """Every optimizer by name, in stepping order: `host`, then the seeds."""
        return {HOST: self.host, **self.seeds}

    def add_seed(self, name: str, params: Iterable[Tensor], lr: float, momentum: float) -> None:
        """A new SGD (no state) for seed `name`, replacing any it had; under
        `per_optimizer` a new GradScaler with it."""
        params = list(params)
        self.seeds[name] = torch.optim.SGD(params, lr=lr, momentum=momentum)
        self.seeds = dict(sorted(self.seeds.items()))  # slot order, as the original's slots_to_step
        self._seed_params[name] = params
        if self._arrangement == "per_optimizer":
            self.scalers[name] = new_scaler(self._device)

    def drop_seed(self, name: str) -> None:
        """Forget seed `name`'s optimizer (and its own scaler); nothing if it has none."""
        self.seeds.pop(name, None)
        self._seed_params.pop(name, None)
        if self._arrangement == "per_optimizer":
            self.scalers.pop(name, None)

    def set_seed_lr(self, name: str, lr: float) -> None:
        """Change seed `name`'s learning rate, keeping its momentum."""
        for group in self.seeds[name].param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def backward_and_step(self, loss: Tensor) -> None:
        """Backward `loss` (scaled under mixed precision), then step host, then seeds."""
        if self.scalers is None:
            loss.backward()
            self.host.step()
            for name, optimizer in self.seeds.items():
                self._clip(name)
                optimizer.step()
            return
        host_scaler = self._scaler(HOST)
        host_scaler.scale(loss).backward()
        self._scaled_step(HOST, self.host, host_scaler)
        stepped = {id(host_scaler): host_scaler}
        for name, optimizer in self.seeds.items():
            if not any(p.grad is not None for p in self._seed_params[name]):
                optimizer.step()  # without gradients a no-op; scaler.step would raise
                continue
            scaler = self._scaler(name)
            if scaler is not host_scaler:
                self._rescale(name, scaler, host_scaler)
            if self.seed_clip_norm is not None or self.grad_norms is not None:
                scaler.unscale_(optimizer)
                self._clip(name)
            self._scaled_step(name, optimizer, scaler)
            stepped[id(scaler)] = scaler
        for scaler in stepped.values():  # shared: one update for all; else one each
            scaler.update()

    def _scaled_step(self, name: str, optimizer: torch.optim.SGD,
                     scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)  # skips this optimizer's step if its grads are not finite
        if self.overflows is not None:
            # What `step` itself reads to decide the skip: PyTorch has no public
            # per-optimizer flag. The dict holds one 0/1 tensor per device.
            found = scaler._found_inf_per_device(optimizer).values()
            self.overflows.append((name, torch.stack(list(found)).sum()))

    def _scaler(self, name: str) -> torch.amp.GradScaler:
        return self.scalers.get(name, self.scalers.get("shared"))

    def _rescale(self, name: str, scaler, host_scaler) -> None:
        """Gradients scaled by the host scaler's scale -> by this seed's scaler's scale."""
        one = torch.ones((), device=self._seed_params[name][0].device)
        ratio = scaler.scale(one) / host_scaler.scale(one)  # a power of two, on the device
        for param in self._seed_params[name]:
            if param.grad is not None:
                param.grad.mul_(ratio)

    def _clip(self, name: str) -> None:
        params = [p for p in self._seed_params[name] if p.grad is not None]
        if not params:
            return
        if self.seed_clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.seed_clip_norm)
        elif self.grad_norms is not None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:
            return
        if self.grad_norms is not None:
            self.grad_norms.append((name, norm.detach()))


def make_scalers(device: torch.device, arrangement: str, seed_names: Sequence[str]) -> dict:
    """GradScalers for mixed precision: `{"shared": one}` or one per optimizer name
    (`"host"` and each of `seed_names`)."""
    if arrangement == "shared":
        return {"shared": new_scaler(device)}
    return {name: new_scaler(device) for name in (HOST, *seed_names)}


def new_scaler(device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler with PyTorch's defaults (initial scale 2**16, halved at an inf/NaN,
    doubled after 2000 clean steps) for `device`'s type."""
    return torch.amp.GradScaler(device.type)
