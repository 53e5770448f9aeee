"""One environment, `MorphoEnv`: a host MLP on a synthetic task, growing seed modules.

One env step is one host training epoch. The host (`esper.env.host_network`) is an MLP
learning a fixed synthetic classification task (`esper.env.task`); it has `NUM_SLOTS`
seed slots (`esper.env.seed_slot`), one after each hidden layer. The agent's factored
action (see `esper.agent.heads`) germinates, blends, prunes and fossilizes seed modules
(`esper.env.blueprints`) in those slots, which really changes the host's forward pass
and the parameters SGD trains.

What matters for measurement is kept from the original CIFAR-10 environment: every step
enqueues real training work on the env's device without reading anything back
(`MorphoEnv.launch_epoch`, or its parts `launch_train_batch` / `train_metrics` /
`launch_val`, which a caller interleaves across envs as the original does), and host-side
bookkeeping happens only after the caller has synchronised and read the metrics
(`MorphoEnv.observe`). How to synchronise (per-env CUDA streams with
`stream.synchronize()`, or events) and on which stream validation runs is the caller's
choice.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OPS
from esper.checks import check_device, check_int
from esper.env.accumulators import EpochAccumulators
from esper.env.blueprints import BLUEPRINTS
from esper.env.config import EnvConfig
from esper.env.host_network import HostNetwork
from esper.env.optimizers import EnvOptimizers, amp_dtype
from esper.env.seed_slot import (
    ALPHA_CURVES,
    ALPHA_SPEEDS,
    ALPHA_TARGETS,
    NUM_SLOTS,
    STYLE_LR_SCALES,
    TEMPO_EPOCHS,
    SeedSlot,
    Stage,
)
from esper.env.stream_guard import GUARDS, record_on_stream
from esper.env.task import DATA, HOST_INIT, SEED_INIT, make_task, random_stream
from esper.variants import AXES, Variants

#: The terminal reward (`EnvConfig.terminal_bonus`), esper-lite's at 2df957ed: per
#: percentage point of validation accuracy (rewards.py:198 `terminal_acc_weight`) ...
TERMINAL_ACC_WEIGHT: float = 0.05
#: ... plus this per contributing fossilized seed (rewards.py:201 `fossilize_terminal_scale`),
FOSSILIZE_TERMINAL_SCALE: float = 3.0
#: a seed whose host gained at least this many accuracy points from its first epoch to its
#: fossilization (leyline/__init__.py:141 DEFAULT_MIN_FOSSILIZE_CONTRIBUTION, checked at
#: vectorized.py:1833-1842).
MIN_FOSSILIZE_CONTRIBUTION: float = 1.0
#: epochs of (train_loss, val_loss, val_acc) history in the observation.
HISTORY: int = 5
#: cap on the loss features of observations, in units of the chance loss ln(num_classes):
#: a diverged host's loss is huge, inf or NaN, and a single such value would wreck the
#: agent's running observation statistics for good.
MAX_LOSS_FEATURE: float = 10.0
#: observation length: loss/accuracy history, per-slot features, epoch and size fractions.
OBS_DIM: int = 3 * HISTORY + NUM_SLOTS * (len(Stage) + 3) + 2
#: `Variants.validation` -> the grad mode of the validation forward. esper-lite runs it
#: under `torch.inference_mode()` (2df957ed simic/training/vectorized.py:1070-1072), which
#: the review (L1) calls "more efficient than no_grad()".
VALIDATION_MODES = dict(zip(AXES["validation"], (torch.inference_mode, torch.no_grad),
                            strict=True))


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

    Per step the caller runs `apply_action` -> `launch_epoch` (or `launch_train_batch` for
    each batch, `train_metrics`, `launch_val`) -> (synchronise, read the metrics) ->
    `observe`. Data are drawn once at construction from a CPU generator seeded
    by (config.seed, env_index) and copied to `device`, so the task is identical on every
    device; `reset()` re-initialises the host and the seed generator, never the data.
    `task`, when given, is the data of an earlier env of the same (config, env_index):
    an env recreated for a new batch (`esper.env.pool`) shares it instead of drawing it
    again. `variants` picks the reviewed choices that act in an env (`scaler`,
    `seed_clip`, `stream_guard`, `accumulators`, `validation`); `stream` is the CUDA
    stream the caller runs the training batches on, or None.
    """

    def __init__(self, config: EnvConfig, env_index: int = 0,
                 device: torch.device | str = "cpu", variants: Variants | None = None,
                 task: tuple[torch.Tensor, ...] | None = None) -> None:
        check_int("env_index", env_index, minimum=0, below=config.num_envs)
        self.config = config
        self.env_index = env_index
        self.device = check_device("MorphoEnv: device", device)
        self.variants = variants if variants is not None else Variants.original()
        self.obs_dim = OBS_DIM
        self.stream = None
        if task is None:
            task = tuple(t.to(self.device)
                         for t in make_task(config, random_stream(config, env_index, DATA)))
        self.task = task
        """`(train_x, train_y, val_x, val_y)` on the device (see `make_task`)."""
        self._train_x, self._train_y, self._val_x, self._val_y = task
        self._record_guard = GUARDS[self.variants.stream_guard]
        self._accumulators = EpochAccumulators(self.device, self.variants.accumulators)
        self._val_mode = VALIDATION_MODES[self.variants.validation]
        self._amp_dtype = amp_dtype(self.device) if config.amp else None
        self._optimizers: EnvOptimizers | None = None
        with torch.device("meta"):  # weights are drawn in reset() from the env's generator
            self._host = HostNetwork(config)
        self._host.to_empty(device=self.device)
        self.host_parameters = sum(p.numel() for p in self._host.parameters())
        self.reset()

    # ----- episode state -------------------------------------------------------------

    def reset(self, host_state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Re-initialise host weights and seed generator, empty all slots. With
        `host_state` (a state dict of the host network) the host's weights are restored
        from it (`load_state_dict`, the review's H1 `reset_to_checkpoint`) instead of
        drawn again.

        Returns the observation `[obs_dim]` float32 on CPU (no history yet).
        """
        if host_state is None:
            self._host.reset_parameters_from(random_stream(self.config, self.env_index, HOST_INIT))
        else:
            self._host.load_state_dict(host_state)
        self._seed_gen = random_stream(self.config, self.env_index, SEED_INIT)
        self.slots: list[SeedSlot] = [SeedSlot() for _ in range(NUM_SLOTS)]
        self._history: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)
        self._last_val_acc = 1.0 / self.config.num_classes  # chance: baseline of the first reward
        self.epoch = 0
        self.contributing_fossilized = 0
        """Seeds fossilized this episode that contributed (see `MIN_FOSSILIZE_CONTRIBUTION`)."""
        self._new_optimizers()
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

    # ----- optimizers (esper.env.optimizers) ------------------------------------------

    def _new_optimizers(self) -> None:
        """The episode's optimizers: the host's SGD and new GradScalers, made at each
        reset as the original makes them with each env (vectorized.py:844-853
        @2df957ed); measurement lists set on the env carry over."""
        c = self.config
        previous = self._optimizers
        self._optimizers = EnvOptimizers(
            self._host.parameters(), c.lr, c.momentum, c.weight_decay,
            scaler=self.variants.scaler if c.amp else None, device=self.device,
            seed_clip_norm=c.seed_clip_norm if self.variants.seed_clip == "clip" else None)
        if previous is not None:
            self._optimizers.grad_norms = previous.grad_norms
            self._optimizers.overflows = previous.overflows

    def _seed_optimizers_follow_slots(self) -> None:
        """Every live seed (TRAINING, BLENDING or FOSSILIZED) has an SGD of its own, made
        when it first needs one and kept with its momentum (vectorized.py:960-981
        @2df957ed); an emptied slot's is dropped (2023). Its learning rate follows the
        style head's last choice (`STYLE_LR_SCALES`, this project's)."""
        for i, slot in enumerate(self.slots):
            name = f"slot{i}"
            if slot.module is None:
                self._optimizers.drop_seed(name)
            elif name not in self._optimizers.seeds:
                self._optimizers.add_seed(name, slot.module.parameters(),
                                          self.config.seed_lr * slot.lr_scale,
                                          self.config.momentum)
            else:
                self._optimizers.set_seed_lr(name, self.config.seed_lr * slot.lr_scale)

    @property
    def scalers(self) -> dict | None:
        """Mixed precision's GradScalers by name (`shared`, or `host` and `slot<i>`);
        None without mixed precision."""
        return self._optimizers.scalers

    @property
    def seed_grad_norms(self) -> list | None:
        """Set to a list to record each seed step's gradient norm before clipping,
        `(slot name, 0-d device tensor)` per step (`EnvOptimizers.grad_norms`)."""
        return self._optimizers.grad_norms

    @seed_grad_norms.setter
    def seed_grad_norms(self, value: list | None) -> None:
        self._optimizers.grad_norms = value

    @property
    def step_overflows(self) -> list | None:
        """Set to a list to record, under mixed precision, whether each scaled optimizer
        step found an inf/NaN (and was skipped): `(name, 0-d 0/1 float device tensor)`
        per step, `host` and `slot<i>` (`EnvOptimizers.overflows`)."""
        return self._optimizers.overflows

    @step_overflows.setter
    def step_overflows(self, value: list | None) -> None:
        self._optimizers.overflows = value

    # ----- actions -------------------------------------------------------------------

    def action_masks(self, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Valid choices per head: `{head: bool [K]}`, at least one True per head.

        Masks are per head, so a combination of individually valid entries can still be
        invalid for the chosen op (e.g. GERMINATE with an occupied slot); `apply_action`
        treats such a combination as WAIT. The slot mask holds slots some op may target;
        when only WAIT is valid the slot head is unused and left unconstrained.

        `device` None: built on the host, one tensor per head from a list. A device: built
        there as esper-lite's `compute_action_masks(device=...)` builds them (2df957ed
        tamiyo/policy/action_masks.py:122-172): `torch.zeros`/`torch.ones` on the device
        per head, then one element write per allowed entry of the op and slot heads (on
        CUDA a small kernel or two each: the value is made on the device and copied into
        the element; no host-to-device copy, no host sync).
        """
        slot_ops = [slot.valid_ops() for slot in self.slots]
        valid_ops = {"WAIT"}.union(*slot_ops)
        op_valid = [op in valid_ops for op in OPS]
        slot_valid = [bool(ops) for ops in slot_ops] if len(valid_ops) > 1 else None
        if device is None:
            masks = {head: torch.ones(size, dtype=torch.bool) for head, size in HEAD_SIZES.items()}
            masks["op"] = torch.tensor(op_valid, dtype=torch.bool)
            if slot_valid is not None:
                masks["slot"] = torch.tensor(slot_valid, dtype=torch.bool)
            return masks
        # the slot head by writes even when it is unconstrained, as the original's always is
        written = {"op": op_valid,
                   "slot": slot_valid if slot_valid is not None else [True] * NUM_SLOTS}
        masks = {}
        for head, size in HEAD_SIZES.items():
            allowed = written.get(head)
            if allowed is None:
                masks[head] = torch.ones(size, dtype=torch.bool, device=device)
                continue
            mask = torch.zeros(size, dtype=torch.bool, device=device)
            for index, valid in enumerate(allowed):
                if valid:
                    mask[index] = True  # one device write per allowed entry, as the original
            masks[head] = mask
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
            # action but a fade-out is not modelled. Its optimizer goes with it (below).
            self.slots[a["slot"]] = SeedSlot()
        elif op == "FOSSILIZE":
            # contributing: its host gained a point of accuracy since the seed's first epoch
            gain = (None if slot.initial_val_acc is None
                    else 100.0 * (self._last_val_acc - slot.initial_val_acc))
            if gain is not None and gain >= MIN_FOSSILIZE_CONTRIBUTION:
                self.contributing_fossilized += 1
            # its blend weight is fixed for good; its weights train on with its
            # optimizer, as the original's (vectorized.py:966 @2df957ed)
            slot.stage, slot.epochs_in_stage = Stage.FOSSILIZED, 0
        else:  # ADVANCE: TRAINING -> BLENDING
            slot.stage, slot.epochs_in_stage = Stage.BLENDING, 0
        self._seed_optimizers_follow_slots()
        return True

    def _germinate(self, slot: SeedSlot, a: dict[str, int]) -> None:
        self._optimizers.drop_seed(f"slot{a['slot']}")  # a new seed, a new optimizer (1828)
        blueprint = BLUEPRINTS[a["blueprint"]]
        slot.module = blueprint.build(self.config.host_hidden, self.device, self._seed_gen)
        slot.blueprint, slot.stage, slot.epochs_in_stage = blueprint, Stage.TRAINING, 0
        slot.lr_scale = STYLE_LR_SCALES[a["style"]]
        slot.tempo = TEMPO_EPOCHS[a["tempo"]]
        slot.alpha = ALPHA_TARGETS[a["alpha_target"]]
        slot.start_ramp(slot.alpha, 0, "linear")

    # ----- device work ---------------------------------------------------------------

    def launch_train_batch(self, b: int) -> None:
        """Enqueue training batch `b` (0 first: it zeroes the epoch's accumulators): one
        SGD step of the host and of every training seed on the current stream.

        Nothing is read back to the host, so on CUDA this returns before the work finishes.
        """
        # Must stay callable inside `torch.cuda.stream(s)`: every op lands on the current
        # stream and nothing here synchronises (no .item(), .cpu(), or branching on values).
        # The caller makes `s` wait for the default stream, where data and seeds are created.
        check_int("launch_train_batch: b", b, minimum=0, below=self.config.train_batches)
        if b == 0:
            self._accumulators.zero_()
        inputs, targets = self._train_x[b], self._train_y[b]
        record_on_stream(self._record_guard, self.stream, inputs, targets)
        self._host.train()  # as process_train_batch (vectorized.py:943); no layer depends on it
        amp = self._amp_dtype is not None
        with torch.autocast(self.device.type, dtype=self._amp_dtype, enabled=amp):
            logits = self._host(inputs, self.slots)  # [B, C]
            loss = F.cross_entropy(logits, targets)  # float32 under autocast too
        self._optimizers.zero_grad()
        self._optimizers.backward_and_step(loss)
        correct = (logits.detach().argmax(dim=-1) == targets).sum(dtype=torch.float32)
        self._accumulators.add_(loss.detach(), correct)

    def train_metrics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The epoch's training results so far, enqueued on the current stream: mean
        training loss (nats) and the count of correct predictions, each a 0-d float32
        device tensor (esper-lite's two accumulators, read one `.item()` each)."""
        sums = self._accumulators.sums()  # [2]: [loss sum, correct count]
        return sums[0] / self.config.train_batches, sums[1]

    def launch_train(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Enqueue every training batch of one epoch, then `train_metrics()`."""
        for b in range(self.config.train_batches):
            self.launch_train_batch(b)
        return self.train_metrics()

    def launch_val(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Enqueue the validation forward on the current stream, under the grad mode of
        `Variants.validation` (`torch.inference_mode()`, the original's, or `no_grad`).

        Returns `(val_loss, val_acc)`, 0-d float32 device tensors: mean cross-entropy in
        nats and the fraction correct. It reads the host's weights that training wrote: on
        another stream than the training's, the caller orders it after them.
        """
        val_loss, correct, total = self.process_val_batch()
        return val_loss, correct / total  # int64 count / int -> float32 fraction

    def process_val_batch(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The validation forward as the reviewed `process_val_batch` writes it
        (2df957ed src/esper/simic/training/vectorized.py:1063-1076, with
        `loss_and_correct`, 707-720): the inputs and targets `.to()` the env's device
        (already there: no copy), `record_stream` when the guard says so, `model.eval()`,
        and under `Variants.validation`'s grad mode the forward, the cross-entropy,
        `outputs.max(1)` and `predicted.eq(targets).sum()`.

        Returns `(val_loss, correct, total)`: the mean cross-entropy (0-d float32), the
        count of correct predictions (0-d int64) on the device, and the examples (int).
        """
        inputs = self._val_x.to(self.device, non_blocking=True)
        targets = self._val_y.to(self.device, non_blocking=True)
        record_on_stream(self._record_guard, self.stream, inputs, targets)
        self._host.eval()
        with self._val_mode():
            outputs = self._host(inputs, self.slots)  # [V, C]
            loss = F.cross_entropy(outputs, targets)
            _, predicted = outputs.max(1)
            correct = predicted.eq(targets).sum()
            total = targets.size(0)
        return loss, correct, total

    def launch_epoch(self) -> torch.Tensor:
        """Enqueue one epoch on the current stream: `train_batches` SGD steps, then one
        validation forward (`launch_train_batch`, `launch_val`).

        Returns `[train_loss, val_loss, val_acc]` float32 `[3]` on the env's device; the
        losses are mean cross-entropy in nats, val_acc a fraction. Nothing is read back to
        the host, so on CUDA this returns before the work finishes.
        """
        for b in range(self.config.train_batches):
            self.launch_train_batch(b)
        val_loss, val_acc = self.launch_val()
        train_loss = self._accumulators.sums()[0] / self.config.train_batches
        return torch.stack([train_loss, val_loss, val_acc])

    # ----- host bookkeeping ----------------------------------------------------------

    def observe(self, metrics: Sequence[float] | torch.Tensor) -> tuple[torch.Tensor, float]:
        """Record one finished epoch and return `(obs [obs_dim] f32 CPU, reward)`.

        `metrics` is `[train_loss, val_loss, val_acc]` already on the host (a list or a
        CPU tensor). reward = val_acc - previous val_acc (chance before the first epoch)
        - param_rent * added_parameter_fraction; at the episode's last epoch (`max_steps`)
        plus, with `EnvConfig.terminal_bonus`, esper-lite's terminal reward:
        `TERMINAL_ACC_WEIGHT * 100 * val_acc + FOSSILIZE_TERMINAL_SCALE * (seeds
        fossilized this episode that contributed)`.
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
            if slot.stage is not Stage.EMPTY and slot.initial_val_acc is None:
                slot.initial_val_acc = val_acc  # the seed's first epoch
        self.epoch += 1
        reward = (val_acc - self._last_val_acc
                  - self.config.param_rent * self.added_parameter_fraction)
        if self.config.terminal_bonus and self.epoch == self.config.max_steps:
            reward += (TERMINAL_ACC_WEIGHT * 100.0 * val_acc
                       + FOSSILIZE_TERMINAL_SCALE * self.contributing_fossilized)
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
