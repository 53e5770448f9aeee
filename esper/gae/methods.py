"""The one table of GAE methods, and `auto`, the method that picks from it.

Each row (`Method`) says where a method's function lives, the device types this machine
runs it on, and whether its outputs keep autograd's graph. Everything else is read from
the table: `METHODS` (name -> function, for the methods this machine runs: what
`compute_gae` calls and `Variants.gae` accepts), `DEVICE_TYPES` and
`NON_DIFFERENTIABLE`.

The methods that need nothing but torch are imported with this module. The others
(`compiled`, `numba`, `triton`) are imported on their first call, so `import esper.gae`
stays light (numba, triton and inductor take seconds to import); their entry in
`METHODS` is a stand-in until then, which puts the real function in its own place.

`auto` runs, per shape, the fastest method this machine has for the device: the first of
the measured ranking (`esper.gae.crossovers.CROSSOVERS`) present in the table.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
from dataclasses import dataclass

import torch

from esper.gae.addcmul import gae_addcmul
from esper.gae.batched import gae_batched
from esper.gae.crossovers import CROSSOVERS
from esper.gae.inputs import GaeFn, StepCounts, Tensor, refuse_meta
from esper.gae.loop import gae_loop
from esper.gae.scan import gae_scan


@dataclass(frozen=True)
class Method:
    """One GAE method of the table."""

    name: str
    """What `compute_gae(method=...)` and `Variants.gae` call it."""
    function: GaeFn | str
    """The function, or `"module:function"` in this package where it is imported on the
    method's first call."""
    device_types: tuple[str, ...]
    """Device types (`cpu`, `cuda`) whose tensors it takes on this machine; empty where
    it cannot run here (it is then left out of `METHODS`)."""
    differentiable: bool
    """Whether its outputs keep autograd's graph; a method that does not refuses inputs
    that require grad in grad mode (`inputs.refuse_grad`), and `auto` passes it over then."""


# ------------------------------------------------- where the optional methods run

def _compiled_device_types() -> tuple[str, ...]:
    """Where inductor can build kernels: a C++ compiler for the CPU (found as inductor
    looks for it on Linux: $CXX, else g++), Triton for CUDA."""
    has_cxx = shutil.which(os.environ.get("CXX", "g++")) is not None
    has_triton = importlib.util.find_spec("triton") is not None
    return ("cpu",) * has_cxx + ("cuda",) * (has_triton and torch.cuda.is_available())


def _numba_device_types() -> tuple[str, ...]:
    return ("cpu",) if importlib.util.find_spec("numba") is not None else ()


def _triton_device_types() -> tuple[str, ...]:
    """CUDA, or the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    if importlib.util.find_spec("triton") is None:
        return ()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return ("cpu",)
    return ("cuda",) if torch.cuda.is_available() else ()


# ------------------------------------------------------------------------- auto

def choose(device_type: str, num_envs: int, max_steps: int, differentiable: bool = False) -> str:
    """The method `auto` runs for inputs [num_envs, max_steps] on `device_type`: the first
    method of the first matching `CROSSOVERS` row that this machine runs on the device
    (with `differentiable`, the first that keeps autograd); `scan` where none is."""
    for row in CROSSOVERS:
        if row.device_type == device_type and num_envs <= row.max_envs and max_steps <= row.max_steps:
            for method in row.ranking:
                if (device_type in DEVICE_TYPES.get(method, ())
                        and not (differentiable and method in NON_DIFFERENTIABLE)):
                    return method
    return "scan"  # runs on every device, and keeps autograd


#: distinct (shape, dtype, device type, differentiable) whose choice `cached_choice` keeps
CHOICE_CACHE_SIZE = 256


@functools.lru_cache(maxsize=CHOICE_CACHE_SIZE)
def cached_choice(shape: tuple[int, ...], dtype: torch.dtype, device_type: str,
                  differentiable: bool) -> str:
    """`choose` for inputs of this shape [num_envs, max_steps] and dtype on a device of
    this type (`cpu`, `cuda`: all the table tells apart), read from the table once per
    distinct key: a rollout's shape repeats every iteration, and scanning the table
    costs about a microsecond, as much as `auto` may add to the call. (`dtype` is part of
    the key so that a table ranking by dtype needs no change here.)
    `cached_choice.cache_clear()` forgets the choices, e.g. after changing `CROSSOVERS`."""
    return choose(device_type, shape[0], shape[1], differentiable)


def gae_auto(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """GAE by the method `cached_choice` picks for these inputs' shape, dtype, device type
    and autograd need (an input that requires grad in grad mode: then the fastest method
    that keeps the graph runs). Arguments and results as every method's (rewards etc.
    [num_envs, max_steps]; outputs the same shape, dtype and device). No host sync beyond
    the chosen method's (none for any fast one)."""
    refuse_meta("gae_auto", rewards, step_counts)
    differentiable = torch.is_grad_enabled() and (
        rewards.requires_grad or values.requires_grad or bootstrap_values.requires_grad)
    device_type = "cpu" if rewards.is_cpu else rewards.device.type  # no device built on the CPU
    method = cached_choice(rewards.shape, rewards.dtype, device_type, differentiable)
    return METHODS[method](
        rewards, values, dones, truncated, bootstrap_values, step_counts,
        gamma=gamma, gae_lambda=gae_lambda,
    )


# ------------------------------------------------------------------------ the table

#: Every method, `loop` (the original) first; `Variants.gae` lists them in this order.
TABLE: tuple[Method, ...] = (
    Method("loop", gae_loop, ("cpu", "cuda"), differentiable=True),
    Method("batched", gae_batched, ("cpu", "cuda"), differentiable=True),
    Method("scan", gae_scan, ("cpu", "cuda"), differentiable=True),
    Method("addcmul", gae_addcmul, ("cpu", "cuda"), differentiable=True),
    Method("compiled", "compiled:gae_compiled", _compiled_device_types(), differentiable=True),
    Method("numba", "numba_kernel:gae_numba", _numba_device_types(), differentiable=False),
    Method("triton", "triton_kernel:gae_triton", _triton_device_types(), differentiable=False),
    Method("auto", gae_auto, ("cpu", "cuda"), differentiable=True),
)


@functools.cache
def _load(function: str) -> GaeFn:
    module, name = function.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _first_call_imports(method: Method) -> GaeFn:
    """A stand-in that imports `method.function` on its first call, puts it in its own
    place in `METHODS` (so later calls skip the stand-in, a fraction of a microsecond
    each) and calls it."""

    def stand_in(*args, **kwargs):
        loaded = _load(method.function)
        if METHODS.get(method.name) is stand_in:
            METHODS[method.name] = loaded
        return loaded(*args, **kwargs)

    name = method.function.split(":")[1]
    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__doc__ = f"`{__package__}.{method.function.replace(':', '.')}`, imported on first call."
    return stand_in


#: method name -> implementation, for every method this machine runs (table order).
METHODS: dict[str, GaeFn] = {
    m.name: m.function if callable(m.function) else _first_call_imports(m)
    for m in TABLE if m.device_types
}
#: method name -> the device types (`cpu`, `cuda`) whose tensors it takes here.
DEVICE_TYPES: dict[str, tuple[str, ...]] = {m.name: m.device_types for m in TABLE if m.device_types}
#: methods that compute outside autograd: they refuse inputs that require grad while grad
#: mode is on (`auto` does not choose them then).
NON_DIFFERENTIABLE: frozenset[str] = frozenset(m.name for m in TABLE if not m.differentiable)
