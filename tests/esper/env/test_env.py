"""Tests of the synthetic morphogenetic environment (esper.env.environment)."""

from __future__ import annotations

import collections
import dataclasses
import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OP_INDEX
from esper.env.blueprints import BLUEPRINTS
from esper.env.config import EnvConfig
from esper.env.environment import OBS_DIM, MorphoEnv
from esper.env.seed_slot import ALPHA_SPEEDS, ALPHA_TARGETS, TEMPO_EPOCHS, Stage
from esper.env.vectorized import VectorizedMorphoEnv
from esper.variants import AXES, Variants

pytestmark = pytest.mark.usefixtures("one_thread")


SMALL = EnvConfig(num_envs=2, max_steps=6, train_batches=2, batch_size=32, val_size=64)
MLP128 = next(i for i, b in enumerate(BLUEPRINTS) if b.name == "mlp128")


def action(op: str = "WAIT", **heads: int) -> dict[str, int]:
    """A full factored action: every head 0 unless given."""
    return {**{head: 0 for head in HEAD_NAMES}, **heads, "op": OP_INDEX[op]}


def run_epoch(env: MorphoEnv) -> tuple[torch.Tensor, float, list[float]]:
    metrics = env.launch_epoch().tolist()
    obs, reward = env.observe(metrics)
    return obs, reward, metrics


def sample_valid(masks: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, int]:
    """Uniform choice among the valid entries of each head."""
    chosen = {}
    for head, mask in masks.items():
        valid = mask.nonzero().flatten()
        chosen[head] = int(valid[torch.randint(len(valid), (1,), generator=gen)])
    return chosen


# ----- configuration -----------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("num_envs", 0), ("max_steps", -1), ("input_dim", 2.5), ("num_classes", 1),
    ("host_hidden", 0), ("train_batches", True), ("batch_size", 0), ("val_size", 0),
    ("seed", -3), ("lr", 0.0), ("lr", float("nan")), ("param_rent", -0.1),
    ("param_rent", "x"),
])
def test_config_rejects_bad_values_naming_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"EnvConfig\.{field}: expected .*got {value!r}"):
        EnvConfig(**{field: value})


def test_env_index_must_be_within_num_envs():
    with pytest.raises(ValueError, match=r"env_index: expected an int in \[0, 2\); got 2"):
        MorphoEnv(SMALL, env_index=2)


# ----- blueprints and parameters -----------------------------------------------------

def test_one_blueprint_per_head_choice_each_starting_as_identity():
    assert len(BLUEPRINTS) == HEAD_SIZES["blueprint"]
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(5, 16)
    for blueprint in BLUEPRINTS:
        module = blueprint.build(16, torch.device("cpu"), gen)
        out = module(h)
        assert out.shape == (5, 16)
        assert torch.count_nonzero(out) == 0, blueprint.name  # zero-init residual output
        assert sum(p.numel() for p in module.parameters()) > 0


def test_germinate_then_prune_changes_and_restores_num_parameters():
    env = MorphoEnv(EnvConfig())
    base = env.num_parameters
    assert base == (32 * 64 + 64) + 2 * (64 * 64 + 64) + (64 * 10 + 10)
    assert env.apply_action(action("GERMINATE", slot=1, blueprint=MLP128))
    assert env.num_parameters == base + (64 * 128 + 128) + (128 * 64 + 64)
    assert env.slots[1].stage is Stage.TRAINING
    assert env.apply_action(action("PRUNE", slot=1))
    assert env.num_parameters == base
    assert env.slots[1].stage is Stage.EMPTY and env.slots[1].module is None


def test_construction_and_germination_leave_global_rng_untouched():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", blueprint=MLP128))
    assert torch.equal(torch.random.get_rng_state(), state)


# ----- masks and actions -------------------------------------------------------------

def test_masks_at_reset_allow_only_wait_and_germinate():
    masks = MorphoEnv(SMALL).action_masks()
    assert masks["op"].tolist() == [True, True, False, False, False, False]
    assert masks["slot"].all()


def test_masks_keep_a_valid_choice_per_head_over_random_rollouts():
    config = EnvConfig(num_envs=1, host_hidden=16, train_batches=1, batch_size=16, val_size=32)
    env = MorphoEnv(config)
    gen = torch.Generator().manual_seed(1)
    stages_seen: set[Stage] = set()
    for _ in range(2):
        env.reset()
        for _ in range(config.max_steps):
            masks = env.action_masks()
            for head, size in HEAD_SIZES.items():
                assert masks[head].dtype == torch.bool and masks[head].shape == (size,)
                assert masks[head].any(), head
            assert masks["op"][OP_INDEX["WAIT"]]
            # built "on a device" (zeros/ones and element writes): the same masks
            on_device = env.action_masks(torch.device("cpu"))
            assert list(on_device) == list(masks)
            assert all(torch.equal(on_device[h], masks[h]) for h in HEAD_NAMES)
            env.apply_action(sample_valid(masks, gen))
            run_epoch(env)
            stages_seen.update(slot.stage for slot in env.slots)
            assert all((slot.module is None) == (slot.stage is Stage.EMPTY) for slot in env.slots)
    assert stages_seen == set(Stage)  # the rollouts reached every stage, masks included


def test_all_fossilized_leaves_only_wait_and_an_unconstrained_slot_head():
    env = MorphoEnv(SMALL)
    for slot in range(3):
        env.apply_action(action("GERMINATE", slot=slot, tempo=0))
    run_epoch(env)
    for slot in range(3):
        env.apply_action(action("ADVANCE", slot=slot))
        env.apply_action(action("FOSSILIZE", slot=slot))
    masks = env.action_masks()
    assert masks["op"].tolist() == [True, False, False, False, False, False]
    assert masks["slot"].all()


@pytest.mark.parametrize("bad, message", [
    (action("FOSSILIZE"), r"action\['op'\]: expected one of the valid choices \[0, 1\]; got 4 \(FOSSILIZE\)"),
    ({**action(), "op": 7}, r"action\['op'\]: .*got 7"),
    ({**action(), "blueprint": 13}, r"action\['blueprint'\]: .*got 13"),
    ({**action(), "style": 1.5}, r"action\['style'\]: expected an int in \[0, 4\); got 1.5"),
    ({h: 0 for h in HEAD_NAMES if h != "tempo"}, r"head 'tempo'"),
    ({**action(), "colour": 0}, r"unknown \['colour'\]"),
])
def test_forbidden_or_malformed_action_raises(bad, message):
    env = MorphoEnv(SMALL)
    with pytest.raises(ValueError, match=message):
        env.apply_action(bad)
    assert env.num_parameters == env.host_parameters  # nothing happened


def test_valid_heads_in_an_invalid_combination_are_a_no_op():
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", slot=0))
    before = env.num_parameters
    # GERMINATE (slot 1 and 2 empty) and slot 0 (SET_ALPHA/PRUNE) are each valid.
    assert env.action_masks()["slot"][0] and env.action_masks()["op"][OP_INDEX["GERMINATE"]]
    assert env.apply_action(action("GERMINATE", slot=0, blueprint=MLP128)) is False
    assert env.num_parameters == before


def test_advance_waits_for_tempo_epochs():
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", slot=2, tempo=2))
    for _ in range(TEMPO_EPOCHS[2]):
        assert not env.action_masks()["op"][OP_INDEX["ADVANCE"]]
        run_epoch(env)
    assert env.action_masks()["op"][OP_INDEX["ADVANCE"]]
    assert env.apply_action(action("ADVANCE", slot=2))
    assert env.slots[2].stage is Stage.BLENDING


def test_set_alpha_ramps_linearly_to_the_target():
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", alpha_target=0))
    assert env.slots[0].alpha == ALPHA_TARGETS[0]
    env.apply_action(action("SET_ALPHA", alpha_target=2, alpha_speed=2, alpha_curve=0))
    start, target, epochs = ALPHA_TARGETS[0], ALPHA_TARGETS[2], ALPHA_SPEEDS[2]
    for k in range(1, epochs + 2):
        run_epoch(env)
        expected = start + (target - start) * min(k / epochs, 1.0)
        assert env.slots[0].alpha == pytest.approx(expected)


# ----- training ----------------------------------------------------------------------

def test_host_learns_under_wait():
    env = MorphoEnv(EnvConfig())
    accuracies = [run_epoch(env)[2][2] for _ in range(20)]
    assert accuracies[-1] > accuracies[0] + 0.1


def test_germinated_seed_trains_and_changes_the_host_trajectory():
    plain, grown = MorphoEnv(SMALL), MorphoEnv(SMALL)
    grown.apply_action(action("GERMINATE", slot=1, blueprint=MLP128, alpha_target=2))
    init = [p.detach().clone() for p in grown.slots[1].module.parameters()]
    plain_metrics, grown_metrics = run_epoch(plain)[2], run_epoch(grown)[2]
    assert plain_metrics != grown_metrics
    after = list(grown.slots[1].module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(init, after))


def test_a_fossilized_seed_keeps_its_alpha_and_trains_on_as_the_original():
    """esper-lite steps every live seed, FOSSILIZED included ("Seeds can continue training
    through BLENDING/PROBATIONARY/FOSSILIZED", vectorized.py:960-969 @2df957ed)."""
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", blueprint=MLP128, tempo=0, alpha_target=2))
    run_epoch(env)
    env.apply_action(action("ADVANCE"))
    run_epoch(env)
    env.apply_action(action("FOSSILIZE"))
    before = [p.detach().clone() for p in env.slots[0].module.parameters()]
    alpha = env.slots[0].alpha
    run_epoch(env)
    assert env.slots[0].alpha == alpha
    assert all(not torch.equal(a, b) for a, b in zip(before, env.slots[0].module.parameters()))


def test_reward_is_accuracy_gain_minus_parameter_rent():
    env = MorphoEnv(EnvConfig(param_rent=0.5))
    _, first, m1 = run_epoch(env)
    assert first == pytest.approx(m1[2] - 0.1)  # chance accuracy for 10 classes
    env.apply_action(action("GERMINATE", blueprint=MLP128))
    _, second, m2 = run_epoch(env)
    assert second == pytest.approx(m2[2] - m1[2] - 0.5 * 16576 / 11082)


def test_observation_layout():
    env = MorphoEnv(SMALL)
    obs = env.reset()
    assert obs.shape == (OBS_DIM,) == (env.obs_dim,) and obs.dtype == torch.float32
    assert OBS_DIM == 38
    assert torch.count_nonzero(obs[:15]) == 0  # no history yet
    env.apply_action(action("GERMINATE", slot=1))
    obs, _, metrics = run_epoch(env)
    chance_loss = math.log(SMALL.num_classes)
    assert obs[12:15].tolist() == pytest.approx(
        [metrics[0] / chance_loss, metrics[1] / chance_loss, metrics[2]])
    slot1 = obs[15 + 7: 15 + 14]
    assert slot1[:4].tolist() == [0.0, 1.0, 0.0, 0.0]  # TRAINING one-hot
    assert obs[-2] == pytest.approx(1 / SMALL.max_steps)


def test_observe_rejects_wrong_metric_count():
    with pytest.raises(ValueError, match="metrics: expected 3 values .* got 2"):
        MorphoEnv(SMALL).observe([1.0, 2.0])


# ----- determinism -------------------------------------------------------------------

SCRIPT = [action("GERMINATE", slot=0, blueprint=2, tempo=0), action(),
          action("ADVANCE", slot=0), action("GERMINATE", slot=2, blueprint=10, style=3),
          action("SET_ALPHA", slot=0, alpha_target=1, alpha_speed=1, alpha_curve=1),
          action("PRUNE", slot=2)]


def play(env: MorphoEnv) -> list[tuple[list[float], float]]:
    trace = [(env.reset().tolist(), 0.0)]
    for step in SCRIPT:
        env.apply_action(step)
        obs, reward, _ = run_epoch(env)
        trace.append((obs.tolist(), reward))
    return trace


def test_same_seed_and_actions_give_identical_trajectories():
    env = MorphoEnv(SMALL, env_index=1)
    first = play(env)
    assert play(env) == first  # reset restores the start
    assert play(MorphoEnv(SMALL, env_index=1)) == first  # a fresh env too


def test_env_index_and_seed_change_data_and_init():
    base = play(MorphoEnv(SMALL, env_index=0))
    assert play(MorphoEnv(SMALL, env_index=1)) != base
    other_seed = EnvConfig(**{**SMALL.__dict__, "seed": 1})
    assert play(MorphoEnv(other_seed, env_index=0)) != base


# ----- no host sync ------------------------------------------------------------------

def count_ops(fn, names: tuple[str, ...]) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts = {event.key: event.count for event in prof.key_averages()}
    return {name: counts.get(name, 0) for name in names}


SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")


def test_profiler_counts_a_host_read():
    # Control: the counting below does see a host read when there is one.
    env = MorphoEnv(SMALL)
    counts = count_ops(lambda: env.launch_epoch()[0].item(), SYNC_OPS)
    assert counts == {"aten::item": 1, "aten::_local_scalar_dense": 1}


def test_launch_epoch_does_not_synchronise():
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", slot=0, blueprint=MLP128, tempo=0))
    env.apply_action(action("GERMINATE", slot=1, blueprint=12))
    run_epoch(env)
    env.apply_action(action("ADVANCE", slot=0))
    counts = count_ops(env.launch_epoch, (*SYNC_OPS, "aten::addmm"))
    assert counts["aten::item"] == 0 and counts["aten::_local_scalar_dense"] == 0
    assert counts["aten::addmm"] > 0  # the profiled region did run the epoch


# ----- vectorized --------------------------------------------------------------------

def test_vectorized_step_matches_the_envs_run_one_by_one():
    vec = VectorizedMorphoEnv(SMALL)
    singles = [MorphoEnv(SMALL, i) for i in range(SMALL.num_envs)]
    obs = vec.reset()
    assert obs.shape == (2, OBS_DIM) and obs.dtype == torch.float32
    masks = vec.action_masks()
    assert {h: tuple(m.shape) for h, m in masks.items()} == {h: (2, k) for h, k in HEAD_SIZES.items()}
    steps = [
        {h: torch.tensor([0, 0]) for h in HEAD_NAMES} | {"op": torch.tensor([1, 0])},
        {h: torch.tensor([0, 1]) for h in HEAD_NAMES} | {"op": torch.tensor([0, 1])},
    ]
    for actions in steps:
        obs, rewards, metrics = vec.step(actions)
        assert obs.shape == (2, OBS_DIM) and rewards.shape == (2,) and metrics.shape == (2, 3)
        assert rewards.dtype == torch.float32 and metrics.dtype == torch.float32
        for i, env in enumerate(singles):
            env.apply_action({h: int(actions[h][i]) for h in HEAD_NAMES})
            o, r, m = run_epoch(env)
            assert torch.equal(obs[i], o) and rewards[i] == torch.tensor(r, dtype=torch.float32)
            assert metrics[i].tolist() == m
    assert vec.envs[0].epoch == 2


def test_vectorized_step_rejects_wrongly_shaped_actions():
    vec = VectorizedMorphoEnv(SMALL)
    actions = {h: torch.zeros(2, dtype=torch.int64) for h in HEAD_NAMES}
    actions["slot"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"actions\['slot'\]: expected .* shape \(2,\); got \(3,\)"):
        vec.step(actions)


# ----- the original's terminal reward ----------------------------------------------------

def observe(env: MorphoEnv, val_acc: float) -> float:
    """One epoch end with made-up metrics: the reward (no device work)."""
    return env.observe([1.0, 1.0, val_acc])[1]


def test_the_last_step_pays_the_originals_terminal_bonus():
    """esper-lite 2df957ed src/esper/simic/rewards/rewards.py:657-669: at epoch ==
    max_epochs, `val_acc (a percentage) * 0.05` plus 3 per contributing fossilized seed."""
    config = EnvConfig(num_envs=1, max_steps=3, param_rent=0.0)
    env = MorphoEnv(config)
    assert observe(env, 0.2) == pytest.approx(0.2 - 0.1)
    assert observe(env, 0.3) == pytest.approx(0.1)
    assert observe(env, 0.4) == pytest.approx(0.1 + 0.05 * 40.0)  # the episode's end

    plain = MorphoEnv(dataclasses.replace(config, terminal_bonus=False))
    rewards = [observe(plain, acc) for acc in (0.2, 0.3, 0.4)]
    assert rewards[-1] == pytest.approx(0.1)


def test_a_fossilized_seed_that_raised_accuracy_by_a_point_earns_3_at_the_end():
    """Contributing: its host's val accuracy rose by at least 1 percentage point
    (DEFAULT_MIN_FOSSILIZE_CONTRIBUTION, leyline:141 @2df957ed) from the seed's first
    epoch to its fossilization (kasmina/slot.py:154, vectorized.py:1833-1842)."""
    config = EnvConfig(num_envs=1, max_steps=5, param_rent=0.0)

    def episode(gain: float) -> float:
        env = MorphoEnv(config)
        env.apply_action(action("GERMINATE", tempo=0))  # one TRAINING epoch before ADVANCE
        observe(env, 0.50)  # the seed's first epoch: its initial accuracy
        env.apply_action(action("ADVANCE"))
        observe(env, 0.50 + gain)
        env.apply_action(action("FOSSILIZE"))
        observe(env, 0.50 + gain)
        observe(env, 0.50 + gain)
        return observe(env, 0.50 + gain)  # the last of 5

    assert episode(0.02) == pytest.approx(0.05 * 52.0 + 3.0)
    assert episode(0.005) == pytest.approx(0.05 * 50.5)  # half a point: not contributing


# ----- masks built on the device (review H5) -------------------------------------------

class AtenOps(TorchDispatchMode):
    """Counts the aten ops called (on CUDA: each a kernel, or a view that launches none)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_masks_on_a_device_are_built_as_the_original_builds_them():
    """2df957ed tamiyo/policy/action_masks.py:122-172: per head torch.zeros or torch.ones
    on the device, then one element write per allowed entry of the heads that vary (here
    op and slot); the host-built masks are one tensor per head from a list instead."""
    env = MorphoEnv(SMALL)
    env.apply_action(action("GERMINATE", slot=1, blueprint=2))
    host = env.action_masks()
    allowed_op = int(host["op"].sum())
    allowed_slot = int(host["slot"].sum())
    with AtenOps() as counted:
        on_device = env.action_masks(torch.device("cpu"))
    ones = len(HEAD_SIZES) - 2
    writes = allowed_op + allowed_slot
    # each write: the element's view, the value as a 0-d tensor (made on the device on
    # CUDA, torch's indexing.scalarToTensor) and a copy into the element
    assert counted.ops == {"ones.default": ones, "zeros.default": 2, "select.int": writes,
                           "lift_fresh.default": writes, "copy_.default": writes}
    assert all(torch.equal(on_device[h], host[h]) for h in HEAD_NAMES)


# ----- the epoch in parts (review H3) ---------------------------------------------------

def test_an_epoch_in_parts_gives_launch_epoch_s_metrics():
    """launch_train_batch for each batch, train_metrics and launch_val (what a trainer
    interleaves across envs) compute what launch_epoch computes, bit for bit."""
    whole, parts = MorphoEnv(SMALL), MorphoEnv(SMALL)
    for env in (whole, parts):
        env.apply_action(action("GERMINATE", slot=0, blueprint=2))
    for _ in range(2):
        expected = whole.launch_epoch()
        for b in range(SMALL.train_batches):
            parts.launch_train_batch(b)
        train_loss, correct = parts.train_metrics()
        val_loss, val_acc = parts.launch_val()
        assert torch.equal(torch.stack([train_loss, val_loss, val_acc]), expected)
        assert correct.dtype == torch.float32 and 0 <= float(correct) <= (
            SMALL.train_batches * SMALL.batch_size)
        assert correct == float(correct) // 1  # a count
        whole.observe(expected), parts.observe(expected)
    assert torch.equal(torch.stack(parts.launch_train()), torch.stack(whole.launch_train()))


def test_train_batches_of_two_envs_interleaved_train_each_as_alone():
    """Batches outer and envs inner, as esper-lite's loop: each env's results are those of
    its epoch run alone (batch 0 starts the epoch: it zeroes the accumulators)."""
    alone = [MorphoEnv(SMALL, i) for i in range(2)]
    interleaved = [MorphoEnv(SMALL, i) for i in range(2)]
    for _ in range(2):
        expected = [env.launch_epoch() for env in alone]
        for b in range(SMALL.train_batches):
            for env in interleaved:
                env.launch_train_batch(b)
        for env, want in zip(interleaved, expected):
            train_loss, _ = env.train_metrics()
            val_loss, val_acc = env.launch_val()
            assert torch.equal(torch.stack([train_loss, val_loss, val_acc]), want)
        for env, want in zip(alone + interleaved, expected + expected):
            env.observe(want)


def test_a_training_batch_out_of_range_is_an_error_naming_it():
    env = MorphoEnv(SMALL)
    with pytest.raises(ValueError, match=r"launch_train_batch: b: expected an int in "
                                         r"\[0, 2\); got 2"):
        env.launch_train_batch(SMALL.train_batches)


def test_validation_runs_under_the_mode_variants_say_with_equal_results():
    """Variants.validation: inference_mode (esper-lite's, vectorized.py:1070-1072, and the
    default) makes inference tensors of the loss and the count; no_grad normal ones; the
    values are equal."""
    results, counted = {}, {}
    for mode in AXES["validation"]:
        env = MorphoEnv(SMALL, variants=Variants(validation=mode))
        env.launch_train()
        counted[mode] = env.process_val_batch()[:2]
        results[mode] = env.launch_val()
    assert Variants().validation == "inference_mode"
    assert all(t.is_inference() for t in counted["inference_mode"])
    assert not any(t.is_inference() or t.requires_grad for t in counted["no_grad"])
    assert [float(t) for t in results["inference_mode"]] == [float(t) for t in results["no_grad"]]
