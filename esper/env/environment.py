"""A synthetic morphogenetic environment: a small host network that grows seed modules.

One env step is one host training epoch. The host is an MLP learning a fixed synthetic
classification task (Gaussian inputs labelled by a random teacher network); it has
`NUM_SLOTS` seed slots, one after each hidden layer. The agent's factored action (see
`esper.agent.heads`) germinates, blends, prunes and fossilizes seed modules in those slots,
which really changes the host's forward pass and the parameters SGD trains.

What matters for measurement is kept from the original CIFAR-10 environment: every step
enqueues real training work on the env's device without reading anything back
(`MorphoEnv.launch_epoch`), and host-side bookkeeping happens only after the caller has
synchronised and read the metrics (`MorphoEnv.observe`). How to synchronise (per-env
CUDA streams with `stream.synchronize()`, or events) is the caller's choice.

Seed lifecycle of one slot::

    EMPTY --GERMINATE--> TRAINING --ADVANCE--> BLENDING --FOSSILIZE--> FOSSILIZED
                            |  ^                  |  ^
                            +--+ SET_ALPHA        +--+ SET_ALPHA
                 PRUNE from TRAINING or BLENDING --> EMPTY

A seed adds `alpha * seed(h)` to the hidden features `h` of its slot. In TRAINING the
seed reads `h.detach()`, so it learns without pushing gradients into the host's lower
layers; in BLENDING gradients flow both ways; a FOSSILIZED seed is frozen for good.
Every seed's output is zero-initialised, so germination does not perturb the host.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OPS
from esper.env.accumulators import EpochAccumulators
from esper.env.optimizers import EnvOptimizers, amp_dtype, make_scalers, new_scaler
from esper.env.stream_guard import GUARDS, record_on_stream
from esper.variants import Variants

NUM_SLOTS: int = HEAD_SIZES["slot"]
#: epochs of (train_loss, val_loss, val_acc) history in the observation.
HISTORY: int = 5
#: cap on the loss features of observations, in units of the chance loss ln(num_classes):
#: a diverged host's loss is huge, inf or NaN, and a single such value would wreck the
#: agent's running observation statistics for good.
MAX_LOSS_FEATURE: float = 10.0
#: alpha_target head index -> blend weight a seed ramps towards.
ALPHA_TARGETS: tuple[float, ...] = (0.3, 0.7, 1.0)
#: alpha_speed head index -> epochs a SET_ALPHA ramp takes.
ALPHA_SPEEDS: tuple[int, ...] = (1, 2, 4, 8)
#: alpha_curve head index -> shape of the ramp, a map from progress in [0, 1] to [0, 1].
ALPHA_CURVES: tuple[str, ...] = ("linear", "cosine", "step")
#: style head index -> multiplier of the seed's learning rate relative to the host's.
STYLE_LR_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
#: tempo head index -> TRAINING epochs a seed needs before ADVANCE is allowed.
TEMPO_EPOCHS: tuple[int, ...] = (1, 2, 4)

_CURVE_FNS: dict[str, Callable[[float], float]] = {
    "linear": lambda p: p,
    "cosine": lambda p: 0.5 - 0.5 * math.cos(math.pi * p),
    "step": lambda p: 1.0 if p >= 1.0 else 0.0,
}
_GATE_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gate_tanh": torch.tanh,
    "gate_gelu": F.gelu,
    "gate_silu": F.silu,
}


class Stage(IntEnum):
    """Lifecycle stage of one seed slot; the value is its one-hot index in observations."""

    EMPTY = 0
    TRAINING = 1
    BLENDING = 2
    FOSSILIZED = 3


#: observation length: loss/accuracy history, per-slot features, epoch and size fractions.
OBS_DIM: int = 3 * HISTORY + NUM_SLOTS * (len(Stage) + 3) + 2


def _he_normal(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    """He-normal weight `[out, in]` float32 on CPU, drawn from `gen`."""
    return torch.randn(out_features, in_features, generator=gen) * math.sqrt(2.0 / in_features)


def _assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """Copy a CPU init value into a (device) parameter in place."""
    with torch.no_grad():
        param.copy_(value)


def _init_linear(layer: nn.Linear, gen: torch.Generator, zero: bool = False) -> None:
    """He-normal weight and zero bias, or all zeros (a residual branch's output layer)."""
    if zero:
        _assign(layer.weight, torch.zeros_like(layer.weight, device="cpu"))
    else:
        _assign(layer.weight, _he_normal(layer.out_features, layer.in_features, gen))
    if layer.bias is not None:
        _assign(layer.bias, torch.zeros(layer.out_features))


class _ResidualMLP(nn.Module):
    """`Linear(H, width) -> ReLU -> Linear(width, H)`; input/output `[B, H]` float32."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        _init_linear(self.up, gen)
        _init_linear(self.down, gen, zero=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(h)))


class _LowRankAdapter(nn.Module):
    """Bias-free `Linear(H, rank) -> Linear(rank, H)`; input/output `[B, H]` float32."""

    def __init__(self, hidden: int, rank: int) -> None:
        super().__init__()
        self.a = nn.Linear(hidden, rank, bias=False)
        self.b = nn.Linear(rank, hidden, bias=False)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        _init_linear(self.a, gen)
        _init_linear(self.b, gen, zero=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(h))


class _FeatureGate(nn.Module):
    """Per-feature nonlinearity `act(h * scale + shift) * out`; `[B, H]` float32."""

    def __init__(self, hidden: int, kind: str) -> None:
        super().__init__()
        self.act = _GATE_FNS[kind]
        self.scale = nn.Parameter(torch.empty(hidden))
        self.shift = nn.Parameter(torch.empty(hidden))
        self.out = nn.Parameter(torch.empty(hidden))

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        hidden = self.scale.shape[0]
        _assign(self.scale, 1.0 + 0.1 * torch.randn(hidden, generator=gen))
        _assign(self.shift, torch.zeros(hidden))
        _assign(self.out, torch.zeros(hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.act(h * self.scale + self.shift) * self.out


class _NormAdapter(nn.Module):
    """`LayerNorm(H)` whose affine weight starts at zero; `[B, H]` float32."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        _assign(self.norm.weight, torch.zeros(self.norm.normalized_shape))
        _assign(self.norm.bias, torch.zeros(self.norm.normalized_shape))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


@dataclass(frozen=True)
class Blueprint:
    """A seed module kind: `mlp` (width), `lowrank` (rank), `gate_*` or `norm` (width 0)."""

    kind: str
    width: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}{self.width}" if self.width else self.kind

    def build(self, hidden: int, device: torch.device, gen: torch.Generator) -> nn.Module:
        """A fresh residual branch `[B, hidden] -> [B, hidden]` on `device`, init from `gen`."""
        with torch.device("meta"):  # no init work and no draw from the global RNG
            if self.kind == "mlp":
                module: nn.Module = _ResidualMLP(hidden, self.width)
            elif self.kind == "lowrank":
                module = _LowRankAdapter(hidden, self.width)
            elif self.kind in _GATE_FNS:
                module = _FeatureGate(hidden, self.kind)
            else:
                module = _NormAdapter(hidden)
        module.to_empty(device=device)
        module.reset_parameters_from(gen)
        return module


#: blueprint head index -> seed module kind (13 entries, one per head choice).
BLUEPRINTS: tuple[Blueprint, ...] = (
    *(Blueprint("mlp", w) for w in (8, 16, 32, 64, 128)),
    *(Blueprint("lowrank", r) for r in (1, 2, 4, 8)),
    Blueprint("gate_tanh"),
    Blueprint("gate_gelu"),
    Blueprint("gate_silu"),
    Blueprint("norm"),
)


@dataclass(frozen=True)
class EnvConfig:
    """Size and training settings of the synthetic environment (defaults: a few ms/epoch on CPU)."""

    num_envs: int = 4
    """Number of parallel environments (`VectorizedMorphoEnv`)."""
    max_steps: int = 25
    """Episode length in epochs; used to normalise the epoch counter in observations."""
    input_dim: int = 32
    """Features per synthetic input sample."""
    num_classes: int = 10
    """Classes of the synthetic task (the teacher's outputs)."""
    host_hidden: int = 64
    """Width H of the host MLP's three hidden layers (and of every seed's input/output)."""
    train_batches: int = 4
    """Minibatches per epoch; the training set is exactly `train_batches * batch_size` samples."""
    batch_size: int = 128
    """Samples per training minibatch."""
    val_size: int = 512
    """Validation samples, evaluated in one forward at the end of each epoch."""
    lr: float = 0.1
    """SGD learning rate of the host; seeds use `lr * STYLE_LR_SCALES[style]`."""
    param_rent: float = 0.01
    """Reward penalty per epoch per unit of (seed parameters / host parameters)."""
    seed: int = 0
    """Root seed; data, host init and seed init derive from (seed, env_index)."""
    amp: bool = False
    """Mixed precision for the host's training batches, as the reviewed system's `use_amp`:
    autocast (`esper.env.optimizers.amp_dtype`: float16 on CUDA) with GradScaler(s) arranged
    by `Variants.scaler`. Off by default, as there."""
    seed_clip_norm: float = 1.0
    """Gradient-norm limit of each seed's parameters when `Variants.seed_clip` is `clip`
    (the review's suggested max_norm=1.0)."""

    def __post_init__(self) -> None:
        minimums = {"num_envs": 1, "max_steps": 1, "input_dim": 1, "num_classes": 2,
                    "host_hidden": 1, "train_batches": 1, "batch_size": 1, "val_size": 1,
                    "seed": 0}
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(
                    f"EnvConfig.{name}: expected an int >= {minimum}; got {value!r}"
                )
        if not isinstance(self.amp, bool):
            raise ValueError(f"EnvConfig.amp: expected a bool; got {self.amp!r}")
        for name, positive in (("lr", True), ("param_rent", False), ("seed_clip_norm", True)):
            value = getattr(self, name)
            bad = (isinstance(value, bool) or not isinstance(value, (int, float))
                   or not math.isfinite(value) or value < 0 or (positive and value == 0))
            if bad:
                bound = "> 0" if positive else ">= 0"
                raise ValueError(
                    f"EnvConfig.{name}: expected a finite float {bound}; got {value!r}"
                )


def _generator(config: EnvConfig, env_index: int, purpose: int) -> torch.Generator:
    """A CPU generator for one (seed, env, purpose) stream: 0 data, 1 host init, 2 seed init."""
    state = np.random.SeedSequence([config.seed, env_index, purpose]).generate_state(1)
    return torch.Generator().manual_seed(int(state[0]))


def _make_task(config: EnvConfig, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a random tanh teacher, on CPU.

    Returns `train_x [train_batches, batch_size, input_dim] f32`, `train_y
    [train_batches, batch_size] int64`, `val_x [val_size, input_dim] f32`,
    `val_y [val_size] int64`.
    """
    d, c, teacher_hidden = config.input_dim, config.num_classes, 32
    w1 = torch.randn(d, teacher_hidden, generator=gen) / math.sqrt(d)
    w2 = torch.randn(teacher_hidden, c, generator=gen) / math.sqrt(teacher_hidden)
    n_train = config.train_batches * config.batch_size
    x = torch.randn(n_train + config.val_size, d, generator=gen)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=-1)
    train_x = x[:n_train].reshape(config.train_batches, config.batch_size, d)  # [N, D] -> [b, B, D]
    train_y = y[:n_train].reshape(config.train_batches, config.batch_size)  # [N] -> [b, B]
    return train_x, train_y, x[n_train:], y[n_train:]


@dataclass
class SeedSlot:
    """Host-side state of one seed slot; `module` is None exactly when `stage` is EMPTY."""

    stage: Stage = Stage.EMPTY
    module: nn.Module | None = None
    blueprint: Blueprint | None = None
    alpha: float = 0.0
    """Current blend weight: the slot adds `alpha * module(h)` to `h`."""
    lr_scale: float = 1.0
    tempo: int = 1
    """TRAINING epochs needed before ADVANCE is valid."""
    epochs_in_stage: int = 0
    ramp_start: float = 0.0
    ramp_target: float = 0.0
    ramp_epochs: int = 0
    ramp_elapsed: int = 0
    ramp_curve: str = "linear"

    @property
    def num_parameters(self) -> int:
        return 0 if self.module is None else sum(p.numel() for p in self.module.parameters())

    def valid_ops(self) -> tuple[str, ...]:
        """Ops other than WAIT that may target this slot now."""
        if self.stage is Stage.EMPTY:
            return ("GERMINATE",)
        if self.stage is Stage.TRAINING:
            ready = self.epochs_in_stage >= self.tempo
            return ("SET_ALPHA", "PRUNE", "ADVANCE") if ready else ("SET_ALPHA", "PRUNE")
        if self.stage is Stage.BLENDING:
            return ("SET_ALPHA", "PRUNE", "FOSSILIZE")
        return ()

    def start_ramp(self, target: float, epochs: int, curve: str) -> None:
        """Move `alpha` from its current value to `target` over `epochs` epoch ends."""
        self.ramp_start, self.ramp_target = self.alpha, target
        self.ramp_epochs, self.ramp_elapsed, self.ramp_curve = epochs, 0, curve

    def end_epoch(self) -> None:
        """Advance stage time and, unless fossilized, the alpha ramp by one epoch."""
        if self.stage is Stage.EMPTY:
            return
        self.epochs_in_stage += 1
        if self.stage is Stage.FOSSILIZED or self.ramp_elapsed >= self.ramp_epochs:
            return
        self.ramp_elapsed += 1
        progress = _CURVE_FNS[self.ramp_curve](self.ramp_elapsed / self.ramp_epochs)
        self.alpha = self.ramp_start + (self.ramp_target - self.ramp_start) * progress

    def blend(self, h: torch.Tensor) -> torch.Tensor:
        """`h + alpha * module(h)`, `[B, H]` float32; a TRAINING seed reads `h.detach()`."""
        if self.module is None:
            return h
        seed_in = h.detach() if self.stage is Stage.TRAINING else h
        return h + self.alpha * self.module(seed_in)


class _HostNet(nn.Module):
    """`input_dim -> H -> H -> H -> num_classes` ReLU MLP with a seed slot after each hidden layer."""

    def __init__(self, config: EnvConfig) -> None:
        super().__init__()
        h = config.host_hidden
        dims = [config.input_dim, h, h, h]
        self.hidden = nn.ModuleList(nn.Linear(dims[i], dims[i + 1]) for i in range(NUM_SLOTS))
        self.head = nn.Linear(h, config.num_classes)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        for layer in (*self.hidden, self.head):
            _init_linear(layer, gen)

    def forward(self, x: torch.Tensor, slots: Sequence[SeedSlot]) -> torch.Tensor:
        """Logits `[B, num_classes]` f32 from inputs `[B, input_dim]` f32."""
        h = x
        for layer, slot in zip(self.hidden, slots):
            h = slot.blend(torch.relu(layer(h)))
        return self.head(h)


def _parse_index(head: str, value: object) -> int:
    """An action entry as a Python int, or ValueError naming the head."""
    try:
        return operator.index(value)
    except TypeError as err:
        raise ValueError(
            f"action[{head!r}]: expected an int in [0, {HEAD_SIZES[head]}); got {value!r}"
        ) from err


class MorphoEnv:
    """One environment: a host MLP on a synthetic task, with `NUM_SLOTS` seed slots.

    Per step the caller runs `apply_action` -> `launch_epoch` -> (synchronise, read the
    metrics) -> `observe`. Data are drawn once at construction from a CPU generator seeded
    by (config.seed, env_index) and copied to `device`, so the task is identical on every
    device; `reset()` re-initialises the host and the seed generator, never the data.
    `task`, when given, is the data of an earlier env of the same (config, env_index):
    an env recreated for a new batch (`esper.env.pool`) shares it instead of drawing it
    again. `variants` picks the reviewed choices that act in an env (`scaler`,
    `seed_clip`, `stream_guard`, `accumulators`); `stream` is the CUDA stream the caller
    runs `launch_epoch` on, or None.
    """

    def __init__(self, config: EnvConfig, env_index: int = 0,
                 device: torch.device | str = "cpu", variants: Variants | None = None,
                 task: tuple[torch.Tensor, ...] | None = None) -> None:
        if isinstance(env_index, bool) or not isinstance(env_index, int) or not (
                0 <= env_index < config.num_envs):
            raise ValueError(
                f"env_index: expected an int in [0, {config.num_envs}); got {env_index!r}"
            )
        self.config = config
        self.env_index = env_index
        self.device = torch.device(device)
        self.variants = variants if variants is not None else Variants.original()
        self.obs_dim = OBS_DIM
        self.stream = None
        if task is None:
            task = tuple(t.to(self.device)
                         for t in _make_task(config, _generator(config, env_index, 0)))
        self.task = task
        """`(train_x, train_y, val_x, val_y)` on the device (see `_make_task`)."""
        self._train_x, self._train_y, self._val_x, self._val_y = task
        self._record_guard = GUARDS[self.variants.stream_guard]
        self._accumulators = EpochAccumulators(self.device, self.variants.accumulators)
        self._amp_dtype = amp_dtype(self.device) if config.amp else None
        self.seed_grad_norms: list | None = None
        """Set to a list to record each seed step's gradient norm (see `EnvOptimizers`)."""
        with torch.device("meta"):  # weights are drawn in reset() from the env's generator
            self._host = _HostNet(config)
        self._host.to_empty(device=self.device)
        self.host_parameters = sum(p.numel() for p in self._host.parameters())
        self.reset()

    # ----- episode state -------------------------------------------------------------

    def reset(self) -> torch.Tensor:
        """Re-initialise host weights and seed generator, empty all slots.

        Returns the observation `[obs_dim]` float32 on CPU (no history yet).
        """
        self._host.reset_parameters_from(_generator(self.config, self.env_index, 1))
        self._seed_gen = _generator(self.config, self.env_index, 2)
        self.slots: list[SeedSlot] = [SeedSlot() for _ in range(NUM_SLOTS)]
        self._history: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)
        self._last_val_acc = 1.0 / self.config.num_classes  # chance: baseline of the first reward
        self.epoch = 0
        self.scalers: dict | None = (make_scalers(self.device, self.variants.scaler, ())
                                     if self.config.amp else None)
        """Mixed precision's GradScalers by name (`shared`, or `host` and `slot<i>`)."""
        self._rebuild_optimizer()
        return self._observation()

    @property
    def host_network(self) -> nn.Module:
        """The host MLP (its parameters are what the host optimizer steps)."""
        return self._host

    @property
    def num_parameters(self) -> int:
        """Host plus all seed parameters (fossilized seeds included)."""
        return self.host_parameters + sum(slot.num_parameters for slot in self.slots)

    @property
    def added_parameter_fraction(self) -> float:
        """Seed parameters divided by host parameters."""
        return (self.num_parameters - self.host_parameters) / self.host_parameters

    def _rebuild_optimizer(self) -> None:
        # Plain SGD keeps no state, so rebuilding after a structural change loses nothing.
        seeds = [(f"slot{i}", list(slot.module.parameters()), self.config.lr * slot.lr_scale)
                 for i, slot in enumerate(self.slots)
                 if slot.stage in (Stage.TRAINING, Stage.BLENDING)]
        if self.scalers is not None and self.variants.scaler == "per_optimizer":
            # a seed's scaler lives as long as the seed trains; a new seed gets a new one
            names = {"host"} | {name for name, _, _ in seeds}
            for name in list(self.scalers):
                if name not in names:
                    del self.scalers[name]
            for name in sorted(names - set(self.scalers)):
                self.scalers[name] = new_scaler(self.device)
        clip = self.config.seed_clip_norm if self.variants.seed_clip == "clip" else None
        self._optimizers = EnvOptimizers(self._host.parameters(), seeds, self.config.lr,
                                         self.scalers, clip, self.seed_grad_norms)

    # ----- actions -------------------------------------------------------------------

    def action_masks(self) -> dict[str, torch.Tensor]:
        """Valid choices per head: `{head: bool [K]}` on CPU, at least one True per head.

        Masks are per head, so a combination of individually valid entries can still be
        invalid for the chosen op (e.g. GERMINATE with an occupied slot); `apply_action`
        treats such a combination as WAIT. The slot mask holds slots some op may target;
        when only WAIT is valid the slot head is unused and left unconstrained.
        """
        masks = {head: torch.ones(size, dtype=torch.bool) for head, size in HEAD_SIZES.items()}
        slot_ops = [slot.valid_ops() for slot in self.slots]
        valid_ops = {"WAIT"}.union(*slot_ops)
        masks["op"] = torch.tensor([op in valid_ops for op in OPS], dtype=torch.bool)
        if len(valid_ops) > 1:
            masks["slot"] = torch.tensor([bool(ops) for ops in slot_ops], dtype=torch.bool)
        return masks

    def _validate_action(self, actions: dict[str, int]) -> dict[str, int]:
        unknown = set(actions) - set(HEAD_NAMES)
        if unknown:
            raise ValueError(
                f"actions: expected the heads {', '.join(HEAD_NAMES)}; got unknown {sorted(unknown)}"
            )
        masks = self.action_masks()
        parsed = {}
        for head in HEAD_NAMES:
            if head not in actions:
                raise ValueError(f"actions: expected a choice for head {head!r}; got none")
            index = _parse_index(head, actions[head])
            valid = masks[head].nonzero().flatten().tolist()
            if index not in valid:
                shown = f"{index} ({OPS[index]})" if head == "op" and 0 <= index < len(OPS) else index
                raise ValueError(
                    f"action[{head!r}]: expected one of the valid choices {valid}; got {shown}"
                )
            parsed[head] = index
        return parsed

    def apply_action(self, actions: dict[str, int]) -> bool:
        """Apply one factored action `{head: index}` to the host (host-side only).

        Raises ValueError for a missing/unknown head or a choice its mask forbids.
        Returns True when the host changed; False for WAIT or for an op that is not
        valid for the chosen slot (a no-op, see `action_masks`).
        """
        a = self._validate_action(actions)
        op, slot = OPS[a["op"]], self.slots[a["slot"]]
        if op == "WAIT" or op not in slot.valid_ops():
            return False
        if op == "GERMINATE":
            self._germinate(slot, a)
        elif op == "SET_ALPHA":
            slot.lr_scale = STYLE_LR_SCALES[a["style"]]
            slot.start_ramp(ALPHA_TARGETS[a["alpha_target"]], ALPHA_SPEEDS[a["alpha_speed"]],
                            ALPHA_CURVES[a["alpha_curve"]])
        elif op == "PRUNE":
            # Removal is immediate; alpha_speed/alpha_curve are part of the policy's PRUNE
            # action but a fade-out is not modelled.
            self.slots[a["slot"]] = SeedSlot()
        elif op == "FOSSILIZE":
            slot.stage, slot.epochs_in_stage = Stage.FOSSILIZED, 0
            slot.module.requires_grad_(False)
        else:  # ADVANCE: TRAINING -> BLENDING
            slot.stage, slot.epochs_in_stage = Stage.BLENDING, 0
        self._rebuild_optimizer()
        return True

    def _germinate(self, slot: SeedSlot, a: dict[str, int]) -> None:
        blueprint = BLUEPRINTS[a["blueprint"]]
        slot.module = blueprint.build(self.config.host_hidden, self.device, self._seed_gen)
        slot.blueprint, slot.stage, slot.epochs_in_stage = blueprint, Stage.TRAINING, 0
        slot.lr_scale = STYLE_LR_SCALES[a["style"]]
        slot.tempo = TEMPO_EPOCHS[a["tempo"]]
        slot.alpha = ALPHA_TARGETS[a["alpha_target"]]
        slot.start_ramp(slot.alpha, 0, "linear")

    # ----- device work ---------------------------------------------------------------

    def launch_epoch(self) -> torch.Tensor:
        """Enqueue one epoch: `train_batches` SGD steps, then one validation forward.

        Returns `[train_loss, val_loss, val_acc]` float32 `[3]` on the env's device; the
        losses are mean cross-entropy in nats, val_acc a fraction. Nothing is read back to
        the host, so on CUDA this returns before the work finishes.
        """
        # Must stay callable inside `torch.cuda.stream(s)`: every op lands on the current
        # stream and nothing here synchronises (no .item(), .cpu(), or branching on values).
        # The caller makes `s` wait for the default stream, where data and seeds are created.
        self._accumulators.zero_()
        self._optimizers.grad_norms = self.seed_grad_norms
        amp = self._amp_dtype is not None
        for b in range(self.config.train_batches):
            inputs, targets = self._train_x[b], self._train_y[b]
            record_on_stream(self._record_guard, self.stream, inputs, targets)
            with torch.autocast(self.device.type, dtype=self._amp_dtype, enabled=amp):
                logits = self._host(inputs, self.slots)  # [B, C]
                loss = F.cross_entropy(logits, targets)  # float32 under autocast too
            self._optimizers.zero_grad()
            self._optimizers.backward_and_step(loss)
            correct = (logits.detach().argmax(dim=-1) == targets).sum(dtype=torch.float32)
            self._accumulators.add_(loss.detach(), correct)
        with torch.no_grad():
            logits = self._host(self._val_x, self.slots)  # [V, C]
            val_loss = F.cross_entropy(logits, self._val_y)
            val_acc = (logits.argmax(dim=-1) == self._val_y).float().mean()
            train_loss = self._accumulators.sums()[0] / self.config.train_batches
            return torch.stack([train_loss, val_loss, val_acc])

    # ----- host bookkeeping ----------------------------------------------------------

    def observe(self, metrics: Sequence[float] | torch.Tensor) -> tuple[torch.Tensor, float]:
        """Record one finished epoch and return `(obs [obs_dim] f32 CPU, reward)`.

        `metrics` is `[train_loss, val_loss, val_acc]` already on the host (a list or a
        CPU tensor). reward = val_acc - previous val_acc (chance before the first epoch)
        - param_rent * added_parameter_fraction.
        """
        if isinstance(metrics, torch.Tensor):
            if metrics.device.type != "cpu":
                raise ValueError(
                    f"metrics: expected a CPU tensor (read it after synchronising); "
                    f"got device {metrics.device}"
                )
            metrics = metrics.tolist()
        if len(metrics) != 3:
            raise ValueError(
                f"metrics: expected 3 values [train_loss, val_loss, val_acc]; got {len(metrics)}"
            )
        train_loss, val_loss, val_acc = (float(m) for m in metrics)
        self._history.append((train_loss, val_loss, val_acc))
        for slot in self.slots:
            slot.end_epoch()
        self.epoch += 1
        reward = (val_acc - self._last_val_acc
                  - self.config.param_rent * self.added_parameter_fraction)
        self._last_val_acc = val_acc
        return self._observation(), reward

    def _observation(self) -> torch.Tensor:
        """`observation_features()` as a `[OBS_DIM]` f32 CPU tensor."""
        return torch.tensor(self.observation_features(), dtype=torch.float32)

    def observation(self) -> torch.Tensor:
        """The current observation `[OBS_DIM]` f32 CPU (what `reset`/`observe` returned)."""
        return self._observation()

    def observation_features(self) -> list[float]:
        """The current observation as `OBS_DIM` Python floats: history (oldest first,
        zero-padded, losses / ln C capped at MAX_LOSS_FEATURE), then per slot stage
        one-hot, alpha, params / host params, epochs in stage / max_steps, then
        epoch / max_steps and added parameter fraction."""
        chance_loss = math.log(self.config.num_classes)
        rows = [(0.0, 0.0, 0.0)] * (HISTORY - len(self._history)) + list(self._history)
        features = [v for tl, vl, va in rows
                    for v in (_loss_feature(tl, chance_loss), _loss_feature(vl, chance_loss), va)]
        for slot in self.slots:
            features += [float(slot.stage == stage) for stage in Stage]
            features += [slot.alpha, slot.num_parameters / self.host_parameters,
                         slot.epochs_in_stage / self.config.max_steps]
        features += [self.epoch / self.config.max_steps, self.added_parameter_fraction]
        return features


def _loss_feature(loss: float, chance_loss: float) -> float:
    """`loss / chance_loss`, capped at MAX_LOSS_FEATURE; NaN (a diverged host) is the cap."""
    scaled = loss / chance_loss
    return scaled if scaled <= MAX_LOSS_FEATURE else MAX_LOSS_FEATURE  # NaN fails `<=`


class VectorizedMorphoEnv:
    """`config.num_envs` independent `MorphoEnv`s on one device, env i seeded by index i.

    `step` is the plain serial reference (one host read per step); a trainer that wants
    per-env CUDA streams drives `envs[i].apply_action / launch_epoch / observe` itself.
    """

    def __init__(self, config: EnvConfig, device: torch.device | str = "cpu",
                 variants: Variants | None = None,
                 tasks: Sequence[tuple[torch.Tensor, ...]] | None = None) -> None:
        self.config = config
        self.device = torch.device(device)
        tasks = tasks if tasks is not None else [None] * config.num_envs
        self.envs = [MorphoEnv(config, i, self.device, variants, task)
                     for i, task in zip(range(config.num_envs), tasks)]
        self.obs_dim = OBS_DIM

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self) -> torch.Tensor:
        """Reset every env; observations `[N, obs_dim]` f32 CPU."""
        return torch.stack([env.reset() for env in self.envs])

    def observations(self) -> torch.Tensor:
        """Every env's current observation `[N, obs_dim]` f32 CPU."""
        return torch.stack([env.observation() for env in self.envs])

    @property
    def tasks(self) -> list[tuple[torch.Tensor, ...]]:
        """Each env's data on the device (to share with envs recreated for a new batch)."""
        return [env.task for env in self.envs]

    def action_masks(self) -> dict[str, torch.Tensor]:
        """`{head: bool [N, K]}` on CPU."""
        per_env = [env.action_masks() for env in self.envs]
        return {head: torch.stack([m[head] for m in per_env]) for head in HEAD_NAMES}

    def _split_actions(self, actions: dict[str, torch.Tensor]) -> list[dict[str, int]]:
        for head in HEAD_NAMES:
            value = actions.get(head)
            if not isinstance(value, torch.Tensor) or value.shape != (self.num_envs,):
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else value
                raise ValueError(
                    f"actions[{head!r}]: expected an int64 tensor of shape ({self.num_envs},); got {got!r}"
                )
        # host read of the actions (a sync if they live on an accelerator)
        columns = {head: actions[head].tolist() for head in HEAD_NAMES}
        return [{head: columns[head][i] for head in HEAD_NAMES} for i in range(self.num_envs)]

    def step(self, actions: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply `{head: int64 [N]}`, run one epoch per env, observe.

        Returns `obs [N, obs_dim] f32`, `rewards [N] f32` and `metrics [N, 3] f32`
        (train_loss, val_loss, val_acc), all on CPU.
        """
        for env, action in zip(self.envs, self._split_actions(actions)):
            env.apply_action(action)
        metrics = torch.stack([env.launch_epoch() for env in self.envs])  # [N, 3] on device
        metrics = metrics.cpu()  # host sync: the one read of this step
        results = [env.observe(row) for env, row in zip(self.envs, metrics)]
        obs = torch.stack([o for o, _ in results])
        rewards = torch.tensor([r for _, r in results], dtype=torch.float32)
        return obs, rewards, metrics
