"""The env's optimizers (esper.env.optimizers) against esper-lite's: the same SGD settings,
kept across the episode's structural changes, stepping every live seed; the latent
"No inf checks were recorded" crash of the original, and what ours does instead."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.blueprints import BLUEPRINTS
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.env.optimizers import EnvOptimizers, amp_dtype
from esper.env.seed_slot import STYLE_LR_SCALES, Stage
from esper.variants import Variants

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
SMALL = EnvConfig(num_envs=1, max_steps=12, train_batches=3, batch_size=32, val_size=64, seed=5)
MLP32 = next(i for i, b in enumerate(BLUEPRINTS) if b.name == "mlp32")
#: the style whose learning-rate scale is 1: the seed trains at `seed_lr`, as the original's
UNIT_STYLE = STYLE_LR_SCALES.index(1.0)
#: esper-lite's DEFAULT_HOST_LR and DEFAULT_SEED_LR (src/esper/leyline/__init__.py:218,222
#: @2df957ed), the task spec's host_lr and seed_lr
HOST_LR, SEED_LR = 0.01, 0.01


# ----- esper-lite's optimizers, transcribed ------------------------------------------------
# From src/esper/simic/training/vectorized.py @2df957ed; ParallelEnvState is reduced to the
# fields these lines touch. `host(inputs, slots)` (our host MLP with its seed slots) stands
# in for the CIFAR CNN's `model(inputs)`; a slot with a module is `has_active_seed_in_slot`.

class OriginalEnvState:
    def __init__(self, host: nn.Module, use_amp: bool) -> None:
        # 844-846
        self.host_optimizer = torch.optim.SGD(
            host.parameters(), lr=HOST_LR, momentum=0.9, weight_decay=5e-4
        )
        # 853: `torch_amp.GradScaler(enabled=amp_enabled)` on CUDA; the CPU's is a stand-in
        self.scaler = torch.amp.GradScaler("cpu") if use_amp else None
        self.seed_optimizers: dict[int, torch.optim.Optimizer] = {}  # parallel_env_state.py:36


def original_train_batch(env_state: OriginalEnvState, host, slots, inputs, targets,
                         use_amp: bool) -> torch.Tensor:
    """process_train_batch, 960-1039 (telemetry left out: it reads, never writes)."""
    slots_to_step = []
    for slot_id, slot in enumerate(slots):  # 962-981
        if slot.module is None:
            continue
        # Seeds can continue training through BLENDING/PROBATIONARY/FOSSILIZED.
        slots_to_step.append(slot_id)
        if slot_id not in env_state.seed_optimizers:
            seed_params = list(slot.module.parameters())
            env_state.seed_optimizers[slot_id] = torch.optim.SGD(
                seed_params, lr=SEED_LR, momentum=0.9
            )
    env_state.host_optimizer.zero_grad(set_to_none=True)  # 983-985
    for slot_id in slots_to_step:
        env_state.seed_optimizers[slot_id].zero_grad(set_to_none=True)
    autocast_ctx = (  # 987-991, with the CPU's autocast standing in for CUDA's
        torch.autocast(device_type="cpu", dtype=amp_dtype(CPU)) if use_amp else nullcontext()
    )
    with autocast_ctx:
        outputs = host(inputs, slots)
        loss = F.cross_entropy(outputs, targets)
    if use_amp and env_state.scaler is not None:  # 996-999
        env_state.scaler.scale(loss).backward()
    else:
        loss.backward()
    if use_amp and env_state.scaler is not None:  # 1031-1039
        env_state.scaler.step(env_state.host_optimizer)
        for slot_id in slots_to_step:
            env_state.scaler.step(env_state.seed_optimizers[slot_id])
        env_state.scaler.update()
    else:
        env_state.host_optimizer.step()
        for slot_id in slots_to_step:
            env_state.seed_optimizers[slot_id].step()
    return loss.detach()


def original_action(env_state: OriginalEnvState, op: str, slot: int) -> None:
    """The optimizer bookkeeping of an action: a germinated or culled slot's optimizer is
    popped (1828, 1849)."""
    if op in ("GERMINATE", "PRUNE"):
        env_state.seed_optimizers.pop(slot, None)


# ----- helpers ---------------------------------------------------------------------------

def act(op: str, **heads: int) -> dict[str, int]:
    return {**{h: 0 for h in HEAD_NAMES}, "style": UNIT_STYLE, **heads, "op": OP_INDEX[op]}


#: germinate, train, advance, a second seed, fossilize the first, prune and regrow the
#: second: every change that may keep or drop a seed's optimizer
SCRIPT = [("GERMINATE", dict(slot=0, blueprint=MLP32, tempo=0, alpha_target=2)),
          ("WAIT", dict(slot=2)), ("ADVANCE", dict(slot=0)),
          ("GERMINATE", dict(slot=1, blueprint=MLP32, tempo=0, alpha_target=1)),
          ("FOSSILIZE", dict(slot=0)), ("WAIT", dict(slot=2)), ("PRUNE", dict(slot=1)),
          ("GERMINATE", dict(slot=1, blueprint=MLP32, tempo=0, alpha_target=0)),
          ("WAIT", dict(slot=2)), ("WAIT", dict(slot=2))]


def reference_epoch(env: MorphoEnv, state: OriginalEnvState, use_amp: bool) -> torch.Tensor:
    """One epoch of `env` trained by the original's lines: `[train_loss, val_loss, val_acc]`."""
    train_x, train_y, val_x, val_y = env.task
    total = torch.zeros(())
    for b in range(env.config.train_batches):
        total += original_train_batch(state, env.host_network, env.slots, train_x[b],
                                      train_y[b], use_amp)
    with torch.no_grad():
        logits = env.host_network(val_x, env.slots)
        val_acc = (logits.argmax(dim=-1) == val_y).float().mean()
        return torch.stack([total / env.config.train_batches,
                            F.cross_entropy(logits, val_y), val_acc])


def parameters(env: MorphoEnv) -> list[torch.Tensor]:
    seeds = [p for slot in env.slots if slot.module is not None for p in slot.module.parameters()]
    return [p.detach().clone() for p in (*env.host_network.parameters(), *seeds)]


# ----- parity with the original ----------------------------------------------------------

@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "cpu_autocast_stand_in"])
def test_ours_steps_as_the_originals_optimizers_through_an_episode_of_structural_changes(amp):
    """The same weights and metrics after every epoch of SCRIPT, bit for bit. With `amp`
    the CPU's autocast and GradScaler stand in for CUDA's (the original runs AMP on CUDA
    only): this shows the shared scaler's arrangement, not CUDA's float16 kernels."""
    config = dataclasses.replace(SMALL, amp=amp)
    ours, theirs = MorphoEnv(config), MorphoEnv(config)
    state = OriginalEnvState(theirs.host_network, amp)
    for op, heads in SCRIPT:
        for env in (ours, theirs):
            assert env.apply_action(act(op, **heads)) is (op != "WAIT")
        original_action(state, op, heads.get("slot", 0))
        expected = reference_epoch(theirs, state, amp)
        got = ours.launch_epoch()
        assert torch.equal(got, expected), (op, got, expected)
        assert all(torch.equal(a, b) for a, b in zip(parameters(ours), parameters(theirs)))
        for env, metrics in ((ours, got), (theirs, expected)):
            env.observe(metrics)
    assert [s.stage for s in ours.slots] == [Stage.FOSSILIZED, Stage.TRAINING, Stage.EMPTY]
    if amp:
        assert ours.scalers["shared"].get_scale() == state.scaler.get_scale()


def test_seed_optimizers_keep_their_momentum_until_the_slot_is_emptied_or_regrown():
    env = MorphoEnv(SMALL)
    env.apply_action(act("GERMINATE", slot=0, blueprint=MLP32, tempo=0))
    env.observe(env.launch_epoch())
    first = env._optimizers.seeds["slot0"]
    momentum = [first.state[p]["momentum_buffer"].clone() for p in env.slots[0].module.parameters()]
    assert all(torch.count_nonzero(m) > 0 for m in momentum)
    env.apply_action(act("ADVANCE", slot=0))
    env.apply_action(act("SET_ALPHA", slot=0, style=STYLE_LR_SCALES.index(2.0)))
    assert env._optimizers.seeds["slot0"] is first  # the same optimizer, momentum and all
    assert first.param_groups[0]["lr"] == pytest.approx(2.0 * SMALL.seed_lr)
    assert all(torch.equal(first.state[p]["momentum_buffer"], m)
               for p, m in zip(env.slots[0].module.parameters(), momentum))
    env.apply_action(act("FOSSILIZE", slot=0))
    assert env._optimizers.seeds["slot0"] is first
    env.reset()  # a new episode: new optimizers, as the original's new env states
    assert env._optimizers.seeds == {}


def test_the_defaults_are_the_originals_sgd():
    env = MorphoEnv(SMALL)
    env.apply_action(act("GERMINATE", slot=2, blueprint=MLP32))
    host, seed = env._optimizers.host.defaults, env._optimizers.seeds["slot2"].defaults
    assert (host["lr"], host["momentum"], host["weight_decay"]) == (0.01, 0.9, 5e-4)
    assert (seed["lr"], seed["momentum"], seed["weight_decay"]) == (0.01, 0.9, 0.0)


@pytest.mark.parametrize("field, value", [("seed_lr", 0.0), ("momentum", -0.1),
                                          ("momentum", 1.5), ("weight_decay", -1e-4)])
def test_config_rejects_bad_optimizer_settings_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"EnvConfig\.{field}: expected .*got {value!r}"):
        EnvConfig(**{field: value})


# ----- the latent crash of the original's shared scaler -----------------------------------

def seed_outside_the_loss() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    host, seed = nn.Linear(4, 2), nn.Linear(4, 2)
    with torch.no_grad():
        for p in (*host.parameters(), *seed.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen))
    return host, seed, torch.randn(8, 4, generator=gen)


def test_the_originals_scaler_step_raises_on_a_seed_without_gradients():
    """vectorized.py:1032-1035 @2df957ed with a live seed that got no gradient."""
    host, seed, x = seed_outside_the_loss()
    scaler = torch.amp.GradScaler("cpu")
    host_optimizer = torch.optim.SGD(host.parameters(), lr=HOST_LR, momentum=0.9)
    seed_optimizer = torch.optim.SGD(seed.parameters(), lr=SEED_LR, momentum=0.9)
    scaler.scale(host(x).square().mean()).backward()
    scaler.step(host_optimizer)
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        scaler.step(seed_optimizer)


@pytest.mark.parametrize("arrangement", ["shared", "per_optimizer"])
def test_ours_steps_the_host_and_leaves_a_seed_without_gradients_alone(arrangement):
    host, seed, x = seed_outside_the_loss()
    optimizers = EnvOptimizers(host.parameters(), HOST_LR, 0.9, scaler=arrangement)
    optimizers.add_seed("slot0", seed.parameters(), SEED_LR, 0.9)
    before_host, before_seed = ([p.detach().clone() for p in m.parameters()] for m in (host, seed))
    optimizers.overflows = []
    optimizers.zero_grad()
    optimizers.backward_and_step(host(x).square().mean())
    assert all(not torch.equal(a, b) for a, b in zip(before_host, host.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before_seed, seed.parameters()))
    assert [(name, float(found)) for name, found in optimizers.overflows] == [("host", 0.0)]


# ----- recording overflows ------------------------------------------------------------------

@pytest.mark.parametrize("arrangement", ["shared", "per_optimizer"])
def test_an_overflow_is_recorded_for_the_optimizer_whose_gradients_overflowed(arrangement):
    """A seed gradient of 1e38, scaled by 2**16, is inf in float32: the seed's step is
    skipped and recorded; the host's is taken. The shared scale halves for both."""
    host, seed, x = seed_outside_the_loss()
    optimizers = EnvOptimizers(host.parameters(), HOST_LR, 0.9, scaler=arrangement)
    optimizers.add_seed("slot0", seed.parameters(), SEED_LR, 0.9)
    optimizers.overflows = []
    before_seed = [p.detach().clone() for p in seed.parameters()]
    optimizers.zero_grad()
    optimizers.backward_and_step(host(x).square().mean() + 1e38 * seed.bias.sum())
    assert [(n, float(f)) for n, f in optimizers.overflows] == [("host", 0.0), ("slot0", 1.0)]
    assert all(torch.equal(a, b) for a, b in zip(before_seed, seed.parameters()))
    host_scale = optimizers._scaler("host").get_scale()
    assert host_scale == (2.0 ** 15 if arrangement == "shared" else 2.0 ** 16)
    assert optimizers._scaler("slot0").get_scale() == 2.0 ** 15
