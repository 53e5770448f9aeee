"""The optimizers of one environment: SGD for the host and one SGD per training seed.

As in the reviewed system, the host and each seed slot that trains (TRAINING or
BLENDING) have their own optimizer, stepped host first, then seeds. Two reviewed
choices act here:

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

Plain SGD keeps no state, so rebuilding the optimizers after a structural change (a
seed germinated, pruned, fossilized) loses nothing; the scalers live on across rebuilds
within an episode and are replaced at `reset`.
"""

from __future__ import annotations

from typing import Sequence

import torch

Tensor = torch.Tensor
HOST = "host"


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype of mixed precision on `device`: float16 on CUDA (the reviewed
    system's), and on the CPU float16 where this torch's CPU autocast runs it, else
    bfloat16."""
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
    """SGD for the host parameters and for each training seed, with the env's AMP scalers.

    Args:
        host_params: the host network's parameters.
        seeds: `(name, parameters, lr)` per training seed slot (e.g. `("slot1", ...)`).
        lr: the host's learning rate.
        scalers: name -> GradScaler when mixed precision is on (`make_scalers`), else None.
        seed_clip_norm: max gradient norm of each seed's parameters, or None (no clip).
        grad_norms: when a list, each seed step appends `(name, norm)`, the seed's gradient
            norm before any clipping as a 0-d device tensor (measurement; costs a norm).
    """

    def __init__(self, host_params: Sequence[Tensor], seeds: Sequence[tuple[str, list, float]],
                 lr: float, scalers: dict | None = None, seed_clip_norm: float | None = None,
                 grad_norms: list | None = None) -> None:
        self.optimizers: dict[str, torch.optim.SGD] = {
            HOST: torch.optim.SGD(list(host_params), lr=lr)}
        self._seed_params: dict[str, list[Tensor]] = {}
        for name, params, seed_lr in seeds:
            self.optimizers[name] = torch.optim.SGD(params, lr=seed_lr)
            self._seed_params[name] = list(params)
        self.scalers = scalers
        self.seed_clip_norm = seed_clip_norm
        self.grad_norms = grad_norms

    def zero_grad(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def backward_and_step(self, loss: Tensor) -> None:
        """Backward `loss` (scaled under mixed precision), then step host, then seeds."""
        if self.scalers is None:
            loss.backward()
            for name, optimizer in self.optimizers.items():
                if name != HOST:
                    self._clip(name)
                optimizer.step()
            return
        host_scaler = self._scaler(HOST)
        host_scaler.scale(loss).backward()
        stepped = {}
        for name, optimizer in self.optimizers.items():
            scaler = self._scaler(name)
            if name != HOST:
                if scaler is not host_scaler:
                    self._rescale(name, scaler, host_scaler)
                if self.seed_clip_norm is not None or self.grad_norms is not None:
                    scaler.unscale_(optimizer)
                    self._clip(name)
            scaler.step(optimizer)  # skips this optimizer's step if its grads are not finite
            stepped[id(scaler)] = scaler
        for scaler in stepped.values():  # shared: one update for all; else one each
            scaler.update()

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
