"""PPO losses on hand-made tensors, and PPOAgent.update on a real RolloutBuffer (CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from esper.buffer import RolloutBuffer
from esper.heads import HEAD_NAMES, HEAD_SIZES, HEADS_FOR_OP, OP_INDEX, OPS
from esper.policy import EvalOutput, FactoredRecurrentActorCritic
from esper.ppo import PPOAgent, PPOConfig, causal_head_table, ppo_losses, prepare_batch
from esper.variants import Variants

NAN = float("nan")


def sequences_by_hand(states_dim: int = 2) -> dict:
    """One env, 3 steps, the last one padding full of garbage; ops WAIT then GERMINATE."""
    valid = torch.tensor([[True, True, False]])
    ops = torch.tensor([[OP_INDEX["WAIT"], OP_INDEX["GERMINATE"], 77]])
    actions = {h: torch.tensor([[0, 0, 99]]) for h in HEAD_NAMES}
    actions["op"] = ops
    masks = {h: torch.ones(1, 3, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
    for mask in masks.values():
        mask[0, 2] = False
    states = torch.ones(1, 3, states_dim)
    states[0, 2] = NAN
    return {
        "states": states,
        "actions": actions,
        "log_probs": {h: torch.tensor([[-1.0, -2.0, NAN]]) for h in HEAD_NAMES},
        "masks": masks,
        "values": torch.tensor([[0.0, 0.0, NAN]]),
        "advantages": torch.tensor([[1.0, -2.0, 1e6]]),
        "returns": torch.tensor([[1.0, 0.0, NAN]]),
        "valid_mask": valid,
        "initial_hidden_h": torch.full((1, 1, 4), 0.5),
        "initial_hidden_c": torch.full((1, 1, 4), -0.5),
    }


def eval_output(batch, op_log_ratio: float, values: list[float]) -> EvalOutput:
    """Policy outputs equal to the stored ones except the op head at step 0; NaN in padding."""
    log_probs = {h: batch.old_log_probs[h].clone() for h in HEAD_NAMES}
    for lp in log_probs.values():
        lp[0, 2] = NAN
    log_probs["op"][0, 0] += op_log_ratio
    entropy = {h: torch.tensor([[0.5, 0.5, NAN]]) for h in HEAD_NAMES}
    return EvalOutput(log_probs, entropy, torch.tensor([values]))


def test_causal_head_table_follows_heads_for_op():
    table = causal_head_table()
    assert table.shape == (len(OPS), len(HEAD_NAMES))
    for op, row in zip(OPS, table):
        assert {h for h, used in zip(HEAD_NAMES, row) if used} == set(HEADS_FOR_OP[op])


def test_prepare_batch_makes_padding_inert():
    raw = sequences_by_hand()
    raw["valid_mask"] = torch.tensor([[True, True, False], [False, False, False]])
    for key in ("states", "values", "advantages", "returns"):
        raw[key] = torch.cat([raw[key], raw[key]])
    for group in ("actions", "log_probs", "masks"):
        raw[group] = {h: torch.cat([t, t]) for h, t in raw[group].items()}
    raw["initial_hidden_h"] = torch.full((1, 2, 4), NAN)
    raw["initial_hidden_c"] = torch.full((1, 2, 4), NAN)
    raw["initial_hidden_h"][:, 0] = 0.5
    batch = prepare_batch(raw, causal_head_table())

    assert torch.isfinite(batch.states).all() and not batch.states[:, 2].any()
    assert all(int(a[:, 2].max()) == 0 for a in batch.actions.values())
    assert all(bool(m[:, 2].all()) for m in batch.masks.values())
    assert batch.advantages[0].tolist() == [1.0, -2.0, 0.0]
    assert bool(batch.causal["op"][0, :2].all()) and not batch.causal["op"][:, 2].any()
    assert not batch.causal["slot"][0, 0] and batch.causal["slot"][0, 1]
    torch.testing.assert_close(batch.initial_hidden[0][:, 0], torch.full((1, 4), 0.5))
    assert not batch.initial_hidden[0][:, 1].any() and not batch.initial_hidden[1][:, 1].any()


def test_losses_at_ratio_one_known_answer():
    config = PPOConfig(value_clip=1.0)
    batch = prepare_batch(sequences_by_hand(), causal_head_table())
    losses = ppo_losses(eval_output(batch, 0.0, [3.0, 0.0, NAN]), batch, config)
    # step 0 (WAIT): op only, A=1; step 1 (GERMINATE): 6 heads, A=-2; mean over 2 steps
    assert float(losses.policy) == pytest.approx(-(1.0 - 12.0) / 2)
    # step 0: V=3 is clipped to 0+1; max((3-1)^2, (1-1)^2) = 4; step 1: 0
    assert float(losses.value) == pytest.approx(0.5 * 4.0 / 2)
    assert float(losses.entropy) == pytest.approx(0.5)
    assert float(losses.approx_kl) == 0.0 and float(losses.clip_fraction) == 0.0
    expected_total = 5.5 + config.value_coef * 1.0 - config.entropy_coef * 0.5
    assert float(losses.total) == pytest.approx(expected_total)


def test_losses_clip_the_ratio_and_measure_kl():
    batch = prepare_batch(sequences_by_hand(), causal_head_table())
    log_ratio = math.log(1.5)
    losses = ppo_losses(eval_output(batch, log_ratio, [0.0, 0.0, NAN]), batch, PPOConfig())
    # op at step 0: min(1.5 * 1, 1.2 * 1) = 1.2
    assert float(losses.policy) == pytest.approx(-(1.2 - 12.0) / 2)
    assert float(losses.clip_fraction) == pytest.approx(1 / 7)  # 1 of 7 causal entries
    assert float(losses.approx_kl) == pytest.approx((0.5 - log_ratio) / 2)


def test_losses_ignore_heads_the_op_does_not_use():
    batch = prepare_batch(sequences_by_hand(), causal_head_table())
    ev = eval_output(batch, 0.0, [0.0, 0.0, NAN])
    ev.log_probs["blueprint"][0, 0] += 3.0  # step 0 is WAIT: blueprint had no effect
    base = ppo_losses(eval_output(batch, 0.0, [0.0, 0.0, NAN]), batch, PPOConfig())
    shifted = ppo_losses(ev, batch, PPOConfig())
    assert float(shifted.policy) == float(base.policy)
    assert float(shifted.approx_kl) == 0.0


@pytest.mark.parametrize(
    "field, value",
    [("gamma", 1.5), ("clip_ratio", 0.0), ("target_kl", -1.0), ("update_epochs", 0)],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}: expected .*; got {value}"):
        PPOConfig(**{field: value})


def test_config_defaults_are_the_original_hyper_parameters():
    config = PPOConfig()
    assert (config.gamma, config.gae_lambda, config.clip_ratio, config.value_clip) == (
        0.995, 0.98, 0.2, 10.0,
    )
    assert (config.entropy_coef, config.value_coef, config.max_grad_norm) == (0.05, 0.5, 0.5)
    assert (config.learning_rate, config.adam_eps, config.target_kl) == (3e-4, 1e-5, 0.015)
    assert config.kl_stop_factor == 1.5 and config.amp_bf16 is False


# ------------------------------------------------------------------ updates on a real buffer

STATE_DIM = 10
HIDDEN = 16
STEP_COUNTS = (6, 3, 0, 5)
MAX_STEPS = 6


def make_policy(seed: int = 0) -> FactoredRecurrentActorCritic:
    torch.manual_seed(seed)
    return FactoredRecurrentActorCritic(STATE_DIM, hidden_dim=HIDDEN)


def step_masks(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """head -> `[1, K]` bool with at least one allowed action."""
    masks = {}
    for head, k in HEAD_SIZES.items():
        mask = torch.rand(1, k, generator=gen) < 0.6
        mask[0, int(torch.randint(0, k, (1,), generator=gen))] = True
        masks[head] = mask
    return masks


def filled_buffer(policy, variants: Variants | None = None, seed: int = 0) -> RolloutBuffer:
    """A rollout of `STEP_COUNTS` steps per env sampled from `policy`, random rewards;
    one episode per row, cut at its last step (truncated rows bootstrap from `value`)."""
    gen = torch.Generator().manual_seed(seed)
    buffer = RolloutBuffer(
        len(STEP_COUNTS), MAX_STEPS, STATE_DIM, lstm_hidden_dim=HIDDEN, variants=variants
    )
    for env, count in enumerate(STEP_COUNTS):
        hidden = policy.initial_hidden(1)
        truncated = env % 2 == 0
        for t in range(count):
            obs = torch.randn(1, STATE_DIM, generator=gen)
            masks = step_masks(gen)
            out = policy.act(obs, masks, hidden, gen)
            last = t == count - 1
            bootstrap = 0.0
            if last and truncated:
                bootstrap = policy.value(torch.randn(1, STATE_DIM, generator=gen), out.hidden)[0]
            buffer.add(
                env, obs[0], {h: a[0] for h, a in out.actions.items()},
                {h: lp[0] for h, lp in out.log_probs.items()}, out.value[0],
                float(torch.randn((), generator=gen)), last, {h: m[0] for h, m in masks.items()},
                hidden[0], hidden[1], truncated=last and truncated, bootstrap_value=bootstrap,
            )
            hidden = out.hidden
    return buffer


def write_garbage_into_padding(buffer: RolloutBuffer) -> None:
    """Stale data past each env's step count: NaN, huge and out-of-range values."""
    for env, count in enumerate(STEP_COUNTS):
        pad = slice(count, None)
        buffer.states[env, pad] = NAN
        for head in HEAD_NAMES:
            buffer.actions[head][env, pad] = 99
            buffer.log_probs[head][env, pad] = NAN
            buffer.masks[head][env, pad] = False
        for field in (buffer.values, buffer.bootstrap_values, buffer.hidden_h, buffer.hidden_c):
            field[env, pad] = NAN
        buffer.rewards[env, pad] = 1e9
        buffer.dones[env, pad] = True
        buffer.truncated[env, pad] = True


def parameters(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


METRIC_KEYS = {
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "epochs_run",
    "early_stop_epoch",
}


def test_update_changes_parameters_and_returns_finite_metrics():
    policy = make_policy()
    buffer = filled_buffer(policy)
    before = parameters(policy)
    metrics = PPOAgent(policy, PPOConfig(target_kl=1.0, update_epochs=3)).update(buffer)
    assert set(metrics) == METRIC_KEYS
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["epochs_run"] == 3 and metrics["early_stop_epoch"] == -1
    assert 0.0 <= metrics["entropy"] <= 1.0 and 0.0 <= metrics["clip_fraction"] <= 1.0
    changed = [not torch.equal(b, a) for b, a in zip(before, parameters(policy))]
    assert all(changed)


@pytest.mark.parametrize("variants", [Variants.original(), Variants.optimized()], ids=str)
def test_stale_padding_does_not_affect_the_update(variants):
    results = []
    for garbage in (False, True):
        policy = make_policy()
        buffer = filled_buffer(policy, variants)
        if garbage:
            write_garbage_into_padding(buffer)
        metrics = PPOAgent(policy, PPOConfig(target_kl=1.0, update_epochs=2)).update(buffer)
        results.append((metrics, parameters(policy)))
    (clean_metrics, clean_params), (dirty_metrics, dirty_params) = results
    assert all(math.isfinite(v) for v in dirty_metrics.values())
    assert dirty_metrics == pytest.approx(clean_metrics, rel=1e-6, abs=1e-7)
    for clean, dirty in zip(clean_params, dirty_params):
        torch.testing.assert_close(dirty, clean)


def test_kl_early_stop_skips_the_backward_of_the_stopping_epoch():
    stopped_policy = make_policy()
    # a threshold just above the epoch-0 rounding noise: the first Adam step exceeds it
    config = PPOConfig(target_kl=1e-8, learning_rate=1e-2, update_epochs=4)
    metrics = PPOAgent(stopped_policy, config).update(filled_buffer(stopped_policy))
    assert metrics["early_stop_epoch"] == 1.0
    assert metrics["epochs_run"] == 1.0
    assert metrics["approx_kl"] > 1.5e-8

    one_epoch_policy = make_policy()
    one_epoch = PPOConfig(target_kl=1.0, learning_rate=1e-2, update_epochs=1)
    PPOAgent(one_epoch_policy, one_epoch).update(filled_buffer(one_epoch_policy))
    for stopped, single in zip(parameters(stopped_policy), parameters(one_epoch_policy)):
        torch.testing.assert_close(stopped, single, rtol=0, atol=0)


def test_bf16_autocast_update_runs_on_cpu():
    runs = {}
    for amp in (False, True):
        policy = make_policy()
        before = parameters(policy)
        config = PPOConfig(target_kl=1.0, update_epochs=2, amp_bf16=amp)
        runs[amp] = PPOAgent(policy, config).update(filled_buffer(policy))
        assert any(not torch.equal(b, a) for b, a in zip(before, parameters(policy)))
    assert all(math.isfinite(v) for v in runs[True].values())
    assert runs[True]["epochs_run"] == 2
    # bf16 rounding shows in the losses: the forward really ran under autocast
    assert runs[True]["value_loss"] != runs[False]["value_loss"]
    assert runs[True]["value_loss"] == pytest.approx(runs[False]["value_loss"], rel=0.05)


def test_update_is_labelled_for_the_profiler():
    policy = make_policy()
    buffer = filled_buffer(policy)
    agent = PPOAgent(policy, PPOConfig(update_epochs=1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        agent.update(buffer)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("update") == 1 and counts.get("gae") == 1


def test_update_of_an_empty_buffer_raises():
    policy = make_policy()
    buffer = RolloutBuffer(2, MAX_STEPS, STATE_DIM, lstm_hidden_dim=HIDDEN)
    with pytest.raises(ValueError, match="buffer: expected at least one stored step; got none"):
        PPOAgent(policy).update(buffer)


def test_nan_kl_stops_before_any_step():
    policy = make_policy()
    buffer = filled_buffer(policy)
    buffer.log_probs["op"][0, 0] = NAN  # a stored step, so the KL itself is NaN
    before = parameters(policy)
    metrics = PPOAgent(policy, PPOConfig()).update(buffer)
    assert metrics["early_stop_epoch"] == 0.0 and metrics["epochs_run"] == 0.0
    assert math.isnan(metrics["approx_kl"])
    for b, a in zip(before, parameters(policy)):
        assert torch.equal(b, a)
