"""PPO losses on hand-made tensors, and PPOAgent.update on a real RolloutBuffer (CPU)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OP_INDEX, OPS
from esper.agent.policy import EvalOutput, FactoredRecurrentActorCritic
from esper.agent.ppo import (
    OBJECTIVES,
    NonFiniteUpdateError,
    PPOAgent,
    PPOConfig,
    causal_head_table,
    ppo_losses,
    prepare_batch,
    update_sequences,
)
from esper.rollout.buffer import RolloutBuffer
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
        "dones": torch.tensor([[False, False, True]]),
        "truncated": torch.tensor([[False, False, True]]),
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


def test_prepare_batch_makes_padding_inert():
    raw = sequences_by_hand()
    raw["valid_mask"] = torch.tensor([[True, True, False], [False, False, False]])
    for key in ("states", "values", "advantages", "returns", "dones", "truncated"):
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
    assert not batch.dones.any()  # the only end is in padding: nothing restarts


# ------------------------------------------------------------------ the objective, by hand
#
# Two envs, three steps each; env 1's step 2 is padding (N = 5 stored steps):
#
#   step      op         A     entropy (every head)   V_old  V_new   R
#   e0 t0     WAIT       1     0.2                    0      3       1
#   e0 t1     GERMINATE  -2    0.4                    0      0.5     0
#   e0 t2     PRUNE      0.5   0.6                    0      -1.5    -2
#   e1 t0     SET_ALPHA  2     0.8                    0      0       0
#   e1 t1     FOSSILIZE  -1    1.0                    2      2       1
#
# Relevance (esper-lite's masks) and n_h = steps where the head matters:
#   op: all 5 | slot: every op but WAIT, 4 | blueprint, tempo: GERMINATE, 1 |
#   style, alpha_target: GERMINATE + SET_ALPHA, 2 | alpha_speed, alpha_curve: SET_ALPHA + PRUNE, 2
#   (sum of n_h = 19)

HAND_OPS = [["WAIT", "GERMINATE", "PRUNE"], ["SET_ALPHA", "FOSSILIZE", "WAIT"]]
HAND_N = {"op": 5, "slot": 4, "blueprint": 1, "style": 2, "tempo": 1, "alpha_target": 2,
          "alpha_speed": 2, "alpha_curve": 2}


def hand_batch():
    """The table above as an `UpdateBatch` (padding filled with garbage)."""
    valid = torch.tensor([[True, True, True], [True, True, False]])
    ops = torch.tensor([[OP_INDEX[op] for op in row] for row in HAND_OPS])
    actions = {h: torch.zeros(2, 3, dtype=torch.int64) for h in HEAD_NAMES}
    actions["op"] = ops
    return prepare_batch({
        "states": torch.zeros(2, 3, 4),
        "actions": actions,
        "log_probs": {h: torch.full((2, 3), -1.0) for h in HEAD_NAMES},
        "masks": {h: torch.ones(2, 3, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()},
        "values": torch.tensor([[0.0, 0.0, 0.0], [0.0, 2.0, NAN]]),
        "advantages": torch.tensor([[1.0, -2.0, 0.5], [2.0, -1.0, 1e6]]),
        "returns": torch.tensor([[1.0, 0.0, -2.0], [0.0, 1.0, NAN]]),
        "dones": torch.zeros(2, 3, dtype=torch.bool),
        "truncated": torch.zeros(2, 3, dtype=torch.bool),
        "valid_mask": valid,
        "initial_hidden_h": torch.zeros(1, 2, 4),
        "initial_hidden_c": torch.zeros(1, 2, 4),
    }, causal_head_table())


def hand_eval(batch, log_ratios: dict[tuple[str, int, int], float] | None = None) -> EvalOutput:
    """New log-probs = stored ones plus `log_ratios[(head, env, step)]`; the table's entropies
    and new values; NaN in padding, which no term may read."""
    log_probs = {h: batch.old_log_probs[h].clone() for h in HEAD_NAMES}
    for (head, env, step), shift in (log_ratios or {}).items():
        log_probs[head][env, step] += shift
    entropy = {h: torch.tensor([[0.2, 0.4, 0.6], [0.8, 1.0, NAN]]) for h in HEAD_NAMES}
    for lp in log_probs.values():
        lp[1, 2] = NAN
    return EvalOutput(log_probs, entropy, torch.tensor([[3.0, 0.5, -1.5], [0.0, 2.0, NAN]]))


def kl3(x: float) -> float:
    """The k3 estimator of one log-ratio: (e^x - 1) - x."""
    return math.expm1(x) - x


def test_relevance_masks_are_esper_lites():
    """Written out from the reviewed system's rules, not from `HEADS_FOR_OP`."""
    expected = {  # op -> relevant heads
        "WAIT": {"op"},
        "GERMINATE": {"op", "slot", "blueprint", "style", "tempo", "alpha_target"},
        "SET_ALPHA": {"op", "slot", "style", "alpha_target", "alpha_speed", "alpha_curve"},
        "PRUNE": {"op", "slot", "alpha_speed", "alpha_curve"},
        "FOSSILIZE": {"op", "slot"},
        "ADVANCE": {"op", "slot"},
    }
    table = causal_head_table()
    assert table.shape == (len(OPS), len(HEAD_NAMES))
    for op, row in zip(OPS, table):
        assert {h for h, used in zip(HEAD_NAMES, row) if used} == expected[op], op

    batch = hand_batch()
    F, T = False, True
    assert batch.causal["op"].tolist() == [[T, T, T], [T, T, F]]  # never in padding
    assert batch.causal["slot"].tolist() == [[F, T, T], [T, T, F]]
    assert batch.causal["blueprint"].tolist() == [[F, T, F], [F, F, F]]
    assert batch.causal["style"].tolist() == [[F, T, F], [T, F, F]]
    assert batch.causal["alpha_speed"].tolist() == [[F, F, T], [T, F, F]]
    assert {h: int(m.sum()) for h, m in batch.causal.items()} == HAND_N


def test_reviewed_policy_loss_is_a_sum_of_per_head_masked_means():
    batch = hand_batch()
    losses = ppo_losses(hand_eval(batch), batch, PPOConfig())
    # ratio 1: each head's mean advantage over the steps where it matters, summed
    per_head = {
        "op": (1 - 2 + 0.5 + 2 - 1) / 5,  # 0.1
        "slot": (-2 + 0.5 + 2 - 1) / 4,  # -0.125
        "blueprint": -2 / 1, "tempo": -2 / 1,
        "style": (-2 + 2) / 2, "alpha_target": (-2 + 2) / 2,
        "alpha_speed": (0.5 + 2) / 2, "alpha_curve": (0.5 + 2) / 2,  # 1.25
    }
    assert float(losses.policy) == pytest.approx(-sum(per_head.values()))  # 1.525
    assert float(losses.policy) == pytest.approx(1.525)

    # blueprint's ratio 0.5 at its only step (A = -2): min(0.5 * -2, 0.8 * -2) = -1.6, and
    # it counts with weight 1 / n_blueprint = 1 (the joint objective gives it 1 / 5)
    clipped = ppo_losses(hand_eval(batch, {("blueprint", 0, 1): math.log(0.5)}), batch,
                         PPOConfig())
    assert float(clipped.policy) == pytest.approx(1.525 - 0.4)
    # the clip fraction is the op head's, as esper-lite's: op's ratios are all 1 here
    assert float(clipped.clip_fraction) == 0.0


def test_reviewed_entropy_is_a_sum_of_per_head_means_over_relevant_steps():
    batch = hand_batch()
    losses = ppo_losses(hand_eval(batch), batch, PPOConfig())
    per_head = {
        "op": (0.2 + 0.4 + 0.6 + 0.8 + 1.0) / 5,  # 0.6
        "slot": (0.4 + 0.6 + 0.8 + 1.0) / 4,  # 0.7
        "blueprint": 0.4, "tempo": 0.4,
        "style": (0.4 + 0.8) / 2, "alpha_target": (0.4 + 0.8) / 2,  # 0.6
        "alpha_speed": (0.6 + 0.8) / 2, "alpha_curve": (0.6 + 0.8) / 2,  # 0.7
    }
    assert float(losses.entropy) == pytest.approx(sum(per_head.values()))  # 4.7
    assert float(losses.entropy) == pytest.approx(4.7)

    # coef_h: op's bonus off, blueprint's tripled: 4.7 - 0.6 + 2 * 0.4
    weighted = PPOConfig(head_entropy_coefs={"op": 0.0, "blueprint": 3.0})
    assert float(ppo_losses(hand_eval(batch), batch, weighted).entropy) == pytest.approx(4.9)


def test_reviewed_approx_kl_is_the_n_h_weighted_mean_of_per_head_kls():
    batch = hand_batch()
    shifts = {("op", 0, 0): math.log(1.5), ("blueprint", 0, 1): math.log(0.5),
              ("blueprint", 0, 0): 3.0}  # blueprint at a WAIT step: irrelevant, not counted
    losses = ppo_losses(hand_eval(batch, shifts), batch, PPOConfig())
    per_head_mean = {"op": kl3(math.log(1.5)) / 5, "blueprint": kl3(math.log(0.5)) / 1}
    weights = {"op": 5 / 19, "blueprint": 1 / 19}  # n_h / sum of n_h
    expected = sum(weights[h] * per_head_mean[h] for h in per_head_mean)
    assert float(losses.approx_kl) == pytest.approx(expected)
    assert float(losses.approx_kl) == pytest.approx((0.0945349 + 0.1931472) / 19, rel=1e-6)


def test_approx_kl_reads_the_unclamped_log_ratio_as_the_original():
    """esper-lite computes each head's KL from `log_probs - old_log_probs` before the clamp
    to +-20 that its ratios use (599f3895 ppo.py:673-674): a log-ratio of 25 counts as 25.
    Where the head is not relevant the step counts 0, even for an infinite log-ratio (the
    original multiplied by the mask: inf * 0 = NaN)."""
    batch = hand_batch()
    shifts = {("op", 0, 0): 25.0, ("blueprint", 0, 0): math.inf}  # blueprint: a WAIT step
    losses = ppo_losses(hand_eval(batch, shifts), batch, PPOConfig())
    assert float(losses.approx_kl) == pytest.approx((5 / 19) * kl3(25.0) / 5)
    assert float(losses.approx_kl) != pytest.approx((5 / 19) * kl3(20.0) / 5)


def test_clip_fraction_is_the_op_heads_over_stored_steps_as_the_original():
    """esper-lite reports `((ratio_op - 1).abs() > clip_ratio).float().mean()` over the
    stored steps (599f3895 ppo.py:687-688), not over every relevant head."""
    batch = hand_batch()
    shifts = {("op", 0, 0): math.log(1.5), ("op", 1, 1): math.log(1.1),
              ("slot", 0, 1): math.log(3.0)}
    losses = ppo_losses(hand_eval(batch, shifts), batch, PPOConfig())
    assert float(losses.clip_fraction) == pytest.approx(1 / 5)  # op clipped at 1 of 5 steps


def test_value_loss_is_the_pessimistic_clipped_loss_over_stored_steps():
    batch = hand_batch()
    for objective in OBJECTIVES:
        losses = ppo_losses(hand_eval(batch), batch, PPOConfig(value_clip=1.0,
                                                              objective=objective))
        # e0t0: V 3 clipped to 1: max(4, 0) = 4; e0t1: 0.25; e0t2: V -1.5 clipped to -1:
        # max(0.25, 1) = 1; e1t0: 0; e1t1: 1. 0.5 * mean = 0.5 * 6.25 / 5
        assert float(losses.value) == pytest.approx(0.625), objective


def test_reviewed_total_loss_combines_the_terms_with_their_coefficients():
    batch = hand_batch()
    config = PPOConfig(value_clip=1.0)
    losses = ppo_losses(hand_eval(batch), batch, config)
    assert float(losses.total) == pytest.approx(1.525 + 0.5 * 0.625 - 0.05 * 4.7)


def test_joint_objective_averages_over_all_stored_steps():
    batch = hand_batch()
    config = PPOConfig(value_clip=1.0, objective="joint")
    losses = ppo_losses(hand_eval(batch), batch, config)
    # every relevant (head, step) advantage summed, over N = 5: (0.5 - 0.5 - 2 + 0 - 2 + 0
    # + 2.5 + 2.5) / 5
    assert float(losses.policy) == pytest.approx(-0.2)
    # each head's mean entropy over all 5 steps (0.6), averaged over the 8 heads
    assert float(losses.entropy) == pytest.approx(0.6)
    assert float(losses.total) == pytest.approx(-0.2 + 0.5 * 0.625 - 0.05 * 0.6)
    weighted = PPOConfig(objective="joint", head_entropy_coefs={"op": 0.0, "blueprint": 3.0})
    assert float(ppo_losses(hand_eval(batch), batch, weighted).entropy) == pytest.approx(
        (6 + 0 + 3) * 0.6 / 8)

    shifts = {("op", 0, 0): math.log(1.5), ("blueprint", 0, 1): math.log(0.5),
              ("slot", 0, 1): math.log(2.0), ("blueprint", 0, 0): 3.0}
    shifted = ppo_losses(hand_eval(batch, shifts), batch, config)
    # the joint log-ratio per step (relevant heads summed): e0t0 ln 1.5, e0t1 ln 0.5 + ln 2 = 0
    assert float(shifted.approx_kl) == pytest.approx(kl3(math.log(1.5)) / 5)
    # op: min(1.5, 1.2) * 1 = 1.2 instead of 1; blueprint -1.6 instead of -2; slot at e0t1
    # (A = -2): min(2 * -2, 1.2 * -2) = -4 instead of -2: a change of (0.2 + 0.4 - 2) / 5
    assert float(shifted.policy) == pytest.approx(-0.2 - (0.2 + 0.4 - 2.0) / 5)


def test_losses_ignore_heads_the_op_does_not_use():
    batch = prepare_batch(sequences_by_hand(), causal_head_table())
    for objective in OBJECTIVES:
        config = PPOConfig(objective=objective)
        ev = eval_output(batch, 0.0, [0.0, 0.0, NAN])
        ev.log_probs["blueprint"][0, 0] += 3.0  # step 0 is WAIT: blueprint had no effect
        base = ppo_losses(eval_output(batch, 0.0, [0.0, 0.0, NAN]), batch, config)
        shifted = ppo_losses(ev, batch, config)
        assert float(shifted.policy) == float(base.policy)
        assert float(shifted.approx_kl) == 0.0


@pytest.mark.parametrize(
    "field, value",
    [("gamma", 1.5), ("clip_ratio", 0.0), ("target_kl", -1.0), ("update_epochs", 0)],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}: expected .*; got {value}"):
        PPOConfig(**{field: value})


@pytest.mark.parametrize("changes, message", [
    (dict(objective="sum"), "PPOConfig.objective: expected one of reviewed, joint; got 'sum'"),
    (dict(head_entropy_coefs={"colour": 1.0}),
     "PPOConfig.head_entropy_coefs: expected keys among slot, blueprint, style, tempo, "
     "alpha_target, alpha_speed, alpha_curve, op; got 'colour'"),
    (dict(head_entropy_coefs={"op": -1.0}),
     "PPOConfig.head_entropy_coefs['op']: expected a finite number >= 0; got -1.0"),
    (dict(head_entropy_coefs=[1.0] * 8),
     "PPOConfig.head_entropy_coefs: expected a mapping of head name to coefficient; got list"),
])
def test_config_rejects_a_bad_objective_or_head_coefficient(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PPOConfig(**changes)


def test_config_defaults_are_the_original_hyper_parameters():
    config = PPOConfig()
    assert (config.gamma, config.gae_lambda, config.clip_ratio, config.value_clip) == (
        0.995, 0.98, 0.2, 10.0,
    )
    assert (config.entropy_coef, config.value_coef, config.max_grad_norm) == (0.05, 0.5, 0.5)
    assert (config.learning_rate, config.adam_eps, config.target_kl) == (3e-4, 1e-5, 0.015)
    assert config.kl_stop_factor == 1.5 and config.amp_bf16 is False
    assert config.objective == "reviewed"
    assert config.head_entropy_coefs == {h: 1.0 for h in HEAD_NAMES}


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
    write_garbage_into_padding_of(buffer, STEP_COUNTS)


def write_garbage_into_padding_of(buffer: RolloutBuffer, step_counts: tuple[int, ...]) -> None:
    """Stale data past `step_counts[env]` in each row: NaN, huge and out-of-range values."""
    for env, count in enumerate(step_counts):
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
    "early_stop_epoch", "first_value_loss", "first_entropy",
}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_update_changes_parameters_and_returns_finite_metrics(objective):
    policy = make_policy()
    buffer = filled_buffer(policy)
    before = dict((name, p.detach().clone()) for name, p in policy.named_parameters())
    config = PPOConfig(target_kl=1.0, update_epochs=3, objective=objective)
    metrics = PPOAgent(policy, config).update(buffer)
    assert set(metrics) == METRIC_KEYS
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["epochs_run"] == 3 and metrics["early_stop_epoch"] == -1
    # the first epoch's, before any step: what another variant computes from the same state
    first = PPOAgent(make_policy(), PPOConfig(target_kl=1.0, update_epochs=1,
                                              objective=objective)).update(filled_buffer(policy))
    assert first["first_value_loss"] == first["value_loss"]
    assert first["first_entropy"] == first["entropy"]
    # the reviewed entropy term sums 8 heads' normalised entropies, the joint one averages
    assert 0.0 <= metrics["entropy"] <= (len(HEAD_NAMES) if objective == "reviewed" else 1.0)
    assert 0.0 <= metrics["clip_fraction"] <= 1.0
    unchanged = {name.split(".")[1] for name, p in policy.named_parameters()
                 if torch.equal(before[name], p)}
    # no GERMINATE was sampled: blueprint and tempo are relevant at no step. The reviewed
    # objective leaves them alone (their entropy counts only where they matter too); the
    # joint one still pushes their entropy up on every step
    ops = buffer.actions["op"][prepare_batch(update_sequences(buffer, buffer.device),
                                             causal_head_table()).valid]
    assert OP_INDEX["GERMINATE"] not in ops.tolist()
    assert unchanged == ({"blueprint", "tempo"} if objective == "reviewed" else set())


@pytest.mark.parametrize("variants", [Variants.original(), Variants.reviews(), Variants.ours()],
                         ids=str)
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


def poison(buffer: RolloutBuffer, where: str, value: float) -> None:
    """Write `value` into one stored step (env 0, step 1) of `where`, past the buffer's
    own checks on add (which refuse a non-finite reward): a stand-in for a bug upstream."""
    if where == "rewards":
        buffer.rewards[0, 1] = value
    elif where == "states":
        buffer.states[0, 1, 0] = value
    elif where == "log_probs":
        buffer.log_probs["op"][0, 0] = value
    elif where == "values":
        buffer.values[0, 1] = value
    else:
        raise AssertionError(where)


@pytest.mark.parametrize("where, value, named", [
    ("rewards", NAN, "rewards"),
    ("rewards", math.inf, "rewards"),
    ("states", NAN, "states"),
    ("states", -math.inf, "states"),
    ("log_probs", NAN, "old_log_probs[op]"),
    ("values", NAN, "old_values"),
])
def test_a_non_finite_update_raises_naming_what_went_non_finite(where, value, named):
    """NaN rewards used to come back as `policy_loss: nan` after an Adam step that made
    every weight NaN; a NaN state or log-prob as NaN losses with zero epochs run. Now
    the update raises before any step, naming the losses and the inputs that are not
    finite, and leaves the weights as they were."""
    policy = make_policy()
    buffer = filled_buffer(policy)
    poison(buffer, where, value)
    before = parameters(policy)
    with pytest.raises(NonFiniteUpdateError) as info:
        PPOAgent(policy, PPOConfig(update_epochs=2)).update(buffer)
    err = info.value
    message = str(err)
    assert "\n" not in message and message.startswith("PPO update, epoch 0: ")
    assert err.epoch == 0 and not err.weights_changed
    assert err.losses and all(not math.isfinite(v) for v in err.losses.values())
    assert named in err.inputs and f"{named} (1 of " in message, message
    assert "no Adam step was taken" in message
    for b, a in zip(before, parameters(policy)):
        assert torch.equal(b, a)


def test_the_error_counts_every_non_finite_input_on_stored_steps_only():
    policy = make_policy()
    buffer = filled_buffer(policy)
    write_garbage_into_padding(buffer)  # NaN in padding is no error, nor counted
    buffer.rewards[0, 1] = NAN
    with pytest.raises(NonFiniteUpdateError) as info:
        PPOAgent(policy, PPOConfig()).update(buffer)
    stored = sum(STEP_COUNTS)
    # one NaN reward; every advantage after normalisation (the mean is NaN); the returns
    # of env 0 up to the NaN step (GAE runs backwards)
    assert info.value.inputs["rewards"] == 1
    assert info.value.inputs["advantages"] == stored
    assert info.value.inputs["returns"] == 2
    assert "states" not in info.value.inputs
    assert f"advantages ({stored} of {stored} nan)" in str(info.value)


def test_a_step_that_makes_the_policy_non_finite_is_caught_at_the_next_epoch():
    """A learning rate of 1e36 makes the first Adam step move every weight by about 1e36:
    the next epoch's forward overflows. That epoch is named, before its own step, and the
    message says the weights changed since the update began."""
    policy = make_policy()
    buffer = filled_buffer(policy)
    config = PPOConfig(target_kl=1e30, learning_rate=1e36, update_epochs=3)
    with pytest.raises(NonFiniteUpdateError) as info:
        PPOAgent(policy, config).update(buffer)
    assert info.value.epoch == 1 and info.value.weights_changed
    assert "1 Adam step was taken before it" in str(info.value)
    assert "old_log_probs[op]" not in info.value.inputs  # the rollout's inputs were fine


def test_an_infinite_kl_with_finite_losses_still_stops_early_as_the_original():
    """`approx_kl` reads the unclamped log-ratio, so a large policy change can overflow it
    to inf while the clamped losses stay finite: that is the early stop, not an error."""
    policy = make_policy()
    buffer = filled_buffer(policy)
    buffer.log_probs["op"][0, 0] = -200.0  # log-ratio ~ +200: exp overflows float32
    metrics = PPOAgent(policy, PPOConfig()).update(buffer)
    assert metrics["approx_kl"] == math.inf
    assert metrics["early_stop_epoch"] == 0.0 and metrics["epochs_run"] == 0.0
    assert all(math.isfinite(metrics[k]) for k in ("policy_loss", "value_loss", "entropy"))


# ------------------------------------------------------------------ several episodes per row

#: env -> steps after which an episode ends inside the row ((step, truncated) pairs); every
#: row's last step ends one too. Env 1's second episode is a single step.
INTERIOR_ENDS = {0: [(1, False)], 1: [(2, True), (3, False)], 2: [], 3: [(0, False)]}
INTERIOR_COUNTS = (6, 6, 4, 5)


def buffer_with_interior_episode_ends(policy, seed: int = 0) -> RolloutBuffer:
    """A rollout whose rows hold several episodes, sampled from `policy` the way a rollout
    that restarts episodes inside a row must: after storing a step that ends an episode
    (a terminal, or a truncation that bootstraps from the state after it), the env's LSTM
    state is zeroed before its next step."""
    gen = torch.Generator().manual_seed(seed)
    buffer = RolloutBuffer(len(INTERIOR_COUNTS), MAX_STEPS, STATE_DIM, lstm_hidden_dim=HIDDEN)
    for env, count in enumerate(INTERIOR_COUNTS):
        ends = dict(INTERIOR_ENDS[env])
        hidden = policy.initial_hidden(1)
        for t in range(count):
            obs = torch.randn(1, STATE_DIM, generator=gen)
            masks = step_masks(gen)
            out = policy.act(obs, masks, hidden, gen)
            last = t == count - 1
            done = last or t in ends
            truncated = ends.get(t, False)
            bootstrap = policy.value(torch.randn(1, STATE_DIM, generator=gen), out.hidden)[0]
            buffer.add(
                env, obs[0], {h: a[0] for h, a in out.actions.items()},
                {h: lp[0] for h, lp in out.log_probs.items()}, out.value[0],
                float(torch.randn((), generator=gen)), done, {h: m[0] for h, m in masks.items()},
                hidden[0], hidden[1], truncated=truncated,
                bootstrap_value=bootstrap if truncated else 0.0,
            )
            hidden = policy.initial_hidden(1) if done else out.hidden
    return buffer


def count_lstm_calls(policy) -> list[int]:
    """A one-element list counting forward calls of `policy.lstm` from now on."""
    calls = [0]
    policy.lstm.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_re_evaluation_restarts_the_lstm_state_after_an_interior_episode_end():
    policy = make_policy()
    buffer = buffer_with_interior_episode_ends(policy)
    write_garbage_into_padding_of(buffer, INTERIOR_COUNTS)
    batch = prepare_batch(update_sequences(buffer, buffer.device), causal_head_table())
    valid = batch.valid

    ev = policy.evaluate(batch.states, batch.actions, batch.masks, batch.initial_hidden,
                         dones=batch.dones)
    for head in HEAD_NAMES:
        torch.testing.assert_close(ev.log_probs[head][valid], buffer.log_probs[head][valid],
                                   rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ev.values[valid], buffer.values[valid], rtol=1e-5, atol=1e-5)

    # carrying the state across the ends (the earlier behaviour) changes every later step
    carried = policy.evaluate(batch.states, batch.actions, batch.masks, batch.initial_hidden)
    after_first_end = torch.tensor([[False] * 2 + [True] * 4, [False] * 3 + [True] * 3,
                                    [False] * 6, [False] + [True] * 4 + [False]])
    assert (carried.values - buffer.values)[after_first_end].abs().min() > 1e-4
    torch.testing.assert_close(carried.values[~after_first_end & valid],
                               buffer.values[~after_first_end & valid], rtol=1e-5, atol=1e-5)


def test_update_with_interior_episode_ends_starts_at_ratio_one():
    """The first epoch re-evaluates the rollout's own policy: its KL is 0 only if the
    re-evaluation restarts the state where the rollout did."""
    policy = make_policy()
    buffer = buffer_with_interior_episode_ends(policy)
    calls = count_lstm_calls(policy)
    metrics = PPOAgent(policy, PPOConfig(update_epochs=1)).update(buffer)
    assert metrics["approx_kl"] < 1e-9 and metrics["clip_fraction"] == 0.0
    # episodes start at steps 1, 2, 3 and 4 of some row: 5 segments of one LSTM call each
    assert calls[0] == 5


def test_update_without_interior_episode_ends_runs_one_lstm_call_per_epoch():
    policy = make_policy()
    buffer = filled_buffer(policy)  # every row one episode, ended at its last stored step
    assert bool(buffer.dones.any())
    calls = count_lstm_calls(policy)
    metrics = PPOAgent(policy, PPOConfig(target_kl=1.0, update_epochs=3)).update(buffer)
    assert metrics["epochs_run"] == 3 and calls[0] == 3
