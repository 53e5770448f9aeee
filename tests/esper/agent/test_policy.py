"""FactoredRecurrentActorCritic and MaskedCategorical on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.agent.policy import SAMPLE_ORDER, FactoredRecurrentActorCritic, MaskedCategorical

STATE_DIM = 12
HIDDEN = 16


def random_masks(batch_shape: tuple[int, ...], generator: torch.Generator) -> dict:
    """head -> `[*batch_shape, K]` bool with at least one allowed action per row."""
    masks = {}
    for head, k in HEAD_SIZES.items():
        mask = torch.rand(*batch_shape, k, generator=generator) < 0.5
        forced = torch.randint(0, k, batch_shape, generator=generator)
        mask.scatter_(-1, forced.unsqueeze(-1), True)
        masks[head] = mask
    return masks


@pytest.fixture
def policy() -> FactoredRecurrentActorCritic:
    torch.manual_seed(0)
    return FactoredRecurrentActorCritic(STATE_DIM, hidden_dim=HIDDEN, lstm_layers=2)


def test_act_evaluate_value_shapes_and_dtypes(policy):
    gen = torch.Generator().manual_seed(1)
    batch, steps = 5, 7
    hidden = policy.initial_hidden(batch)
    assert [t.shape for t in hidden] == [torch.Size([2, batch, HIDDEN])] * 2

    out = policy.act(torch.randn(batch, STATE_DIM), random_masks((batch,), gen), hidden)
    assert list(out.actions) == list(HEAD_NAMES)
    for head in HEAD_NAMES:
        assert out.actions[head].shape == (batch,) and out.actions[head].dtype == torch.int64
        assert out.log_probs[head].shape == (batch,)
        assert out.log_probs[head].dtype == torch.float32
    assert out.value.shape == (batch,) and out.value.dtype == torch.float32
    assert [t.shape for t in out.hidden] == [torch.Size([2, batch, HIDDEN])] * 2

    actions = {h: torch.zeros(batch, steps, dtype=torch.int64) for h in HEAD_NAMES}
    masks = {h: torch.ones(batch, steps, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
    ev = policy.evaluate(torch.randn(batch, steps, STATE_DIM), actions, masks, hidden)
    assert ev.values.shape == (batch, steps)
    for head in HEAD_NAMES:
        assert ev.log_probs[head].shape == (batch, steps)
        assert ev.entropy[head].shape == (batch, steps)

    assert policy.value(torch.randn(batch, STATE_DIM), hidden).shape == (batch,)


def test_op_head_is_sampled_first():
    assert SAMPLE_ORDER[0] == "op"
    assert sorted(SAMPLE_ORDER) == sorted(HEAD_NAMES)


def test_masked_actions_are_never_sampled(policy):
    gen = torch.Generator().manual_seed(2)
    batch = 4000
    masks = random_masks((batch,), gen)
    out = policy.act(
        torch.randn(batch, STATE_DIM, generator=gen), masks, policy.initial_hidden(batch), gen
    )
    for head in HEAD_NAMES:
        chosen_allowed = masks[head].gather(1, out.actions[head].unsqueeze(1))
        assert bool(chosen_allowed.all()), head
        assert bool((out.log_probs[head] > -20).all()), head


def test_deterministic_act_takes_each_head_s_most_probable_allowed_action(policy):
    """esper-lite's `get_action(..., deterministic=True)` (its bootstrap forward) takes
    `probs.argmax(-1)` per head: an allowed action, the same on every call, whatever the
    sampler; the value and the next state are those of a sampled act."""
    gen = torch.Generator().manual_seed(4)
    batch = 64
    masks = random_masks((batch,), gen)
    obs = torch.randn(batch, STATE_DIM, generator=gen)
    hidden = policy.initial_hidden(batch)
    first = policy.act(obs, masks, hidden, torch.Generator().manual_seed(0), deterministic=True)
    again = policy.act(obs, masks, hidden, torch.Generator().manual_seed(1), deterministic=True)
    sampled = policy.act(obs, masks, hidden, torch.Generator().manual_seed(0))
    features, _ = policy._trunk(obs.unsqueeze(1), hidden)
    for head in HEAD_NAMES:
        logits = policy.heads[head](features.squeeze(1)).masked_fill(~masks[head], -1e4)
        assert torch.equal(first.actions[head], logits.softmax(-1).argmax(-1)), head
        assert torch.equal(first.actions[head], again.actions[head]), head
        assert bool(masks[head].gather(1, first.actions[head].unsqueeze(1)).all()), head
    assert any(not torch.equal(first.actions[h], sampled.actions[h]) for h in HEAD_NAMES)
    assert torch.equal(first.value, sampled.value)
    assert all(torch.equal(a, b) for a, b in zip(first.hidden, sampled.hidden))


def test_sampling_follows_the_masked_softmax():
    gen = torch.Generator().manual_seed(3)
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]]).expand(40000, 4)
    mask = torch.tensor([[True, False, True, True]]).expand(40000, 4)
    dist = MaskedCategorical(logits, mask)
    counts = torch.bincount(dist.sample(gen), minlength=4).float() / 40000
    expected = torch.tensor([2.0, 1.0, -1.0]).softmax(0)
    assert counts[1] == 0
    torch.testing.assert_close(counts[[0, 2, 3]], expected, atol=0.01, rtol=0)


def test_log_prob_is_log_softmax_over_allowed_actions():
    logits = torch.tensor([[0.5, 3.0, -1.0, 0.2, 1.0]])
    mask = torch.tensor([[True, False, True, True, False]])
    dist = MaskedCategorical(logits, mask)
    expected = logits[0, [0, 2, 3]].log_softmax(0)
    got = torch.cat([dist.log_prob(torch.tensor([a])) for a in (0, 2, 3)])
    torch.testing.assert_close(got, expected)


def test_entropy_is_normalised_by_number_of_allowed_actions():
    logits = torch.zeros(3, 5)
    mask = torch.tensor(
        [
            [True, True, True, False, False],  # uniform over 3 allowed
            [False, False, True, False, False],  # one allowed: no choice
            [True, True, True, True, True],
        ]
    )
    torch.testing.assert_close(
        MaskedCategorical(logits, mask).entropy(), torch.tensor([1.0, 0.0, 1.0])
    )
    peaked = MaskedCategorical(torch.tensor([[5.0, 0.0, 0.0]]), torch.ones(1, 3, dtype=torch.bool))
    assert 0.0 < float(peaked.entropy()) < 1.0


def test_row_without_allowed_action_raises_naming_the_head(policy):
    masks = random_masks((3,), torch.Generator().manual_seed(4))
    masks["blueprint"][1] = False
    with pytest.raises(ValueError, match=r"masks\['blueprint'\].*at least one allowed.*\(1,\)"):
        policy.act(torch.randn(3, STATE_DIM), masks, policy.initial_hidden(3))


def test_wrong_mask_shape_or_dtype_raises(policy):
    masks = random_masks((3,), torch.Generator().manual_seed(5))
    masks["op"] = torch.ones(3, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"masks\['op'\].*\(3, 6\).*\(3, 5\)"):
        policy.act(torch.randn(3, STATE_DIM), masks, policy.initial_hidden(3))
    with pytest.raises(ValueError, match="torch.bool.*torch.int64"):
        MaskedCategorical(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.int64))


def test_no_error_when_validation_is_off():
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(STATE_DIM, HIDDEN, validate_masks=False)
    masks = random_masks((3,), torch.Generator().manual_seed(6))
    masks["style"][0] = False
    out = policy.act(torch.randn(3, STATE_DIM), masks, policy.initial_hidden(3))
    assert torch.isfinite(out.log_probs["style"]).all()
    entropy = MaskedCategorical(torch.randn(2, 4), torch.zeros(2, 4, dtype=torch.bool), False)
    torch.testing.assert_close(entropy.entropy(), torch.zeros(2))


def test_bad_inputs_raise_value_error(policy):
    masks = random_masks((3,), torch.Generator().manual_seed(7))
    hidden = policy.initial_hidden(3)
    with pytest.raises(ValueError, match=r"obs: expected \[B, 12\]; got \(3, 11\)"):
        policy.act(torch.randn(3, STATE_DIM - 1), masks, hidden)
    wrong_hidden = r"hidden h: expected shape \(2, 3, 16\); got \(1, 3, 16\)"
    with pytest.raises(ValueError, match=wrong_hidden):
        policy.act(torch.randn(3, STATE_DIM), masks, (hidden[0][:1], hidden[1]))
    del masks["tempo"]
    with pytest.raises(ValueError, match="masks: expected one mask per head"):
        policy.act(torch.randn(3, STATE_DIM), masks, hidden)
    with pytest.raises(ValueError, match=r"obs: expected \[B, T, 12\]"):
        policy.evaluate(torch.randn(3, STATE_DIM), {}, {}, hidden)
    with pytest.raises(ValueError, match="state_dim: expected a positive int; got 0"):
        FactoredRecurrentActorCritic(0)


def test_evaluate_reproduces_a_sequence_of_act_calls(policy):
    gen = torch.Generator().manual_seed(8)
    batch, steps = 3, 6
    obs = torch.randn(batch, steps, STATE_DIM, generator=gen)
    masks = random_masks((batch, steps), gen)
    hidden = start = policy.initial_hidden(batch)
    steps_out = []
    for t in range(steps):
        step_masks = {h: m[:, t] for h, m in masks.items()}
        out = policy.act(obs[:, t], step_masks, hidden, gen)
        steps_out.append(out)
        hidden = out.hidden
    actions = {h: torch.stack([o.actions[h] for o in steps_out], 1) for h in HEAD_NAMES}

    ev = policy.evaluate(obs, actions, masks, start)
    for head in HEAD_NAMES:
        acted = torch.stack([o.log_probs[head] for o in steps_out], 1)
        torch.testing.assert_close(ev.log_probs[head], acted, atol=1e-5, rtol=1e-5)
    acted_values = torch.stack([o.value for o in steps_out], 1)
    torch.testing.assert_close(ev.values, acted_values, atol=1e-5, rtol=1e-5)
    # value() with the carried state is the value act() saw at that step
    torch.testing.assert_close(
        policy.value(obs[:, -1], steps_out[-2].hidden), steps_out[-1].value
    )

def act_step_by_step(policy, obs, masks, dones, gen):
    """The rollout side of several episodes per row: `act` one step at a time, zeroing an
    env's LSTM state after a step that ends its episode. Returns the start state and the
    per-step outputs."""
    batch, steps = dones.shape
    hidden = start = policy.initial_hidden(batch)
    outputs = []
    for t in range(steps):
        out = policy.act(obs[:, t], {h: m[:, t] for h, m in masks.items()}, hidden, gen)
        outputs.append(out)
        keep = ~dones[:, t].view(1, batch, 1)  # [B] -> [1, B, 1] over [L, B, H]
        hidden = tuple(torch.where(keep, s, torch.zeros(())) for s in out.hidden)
    return start, outputs


def test_evaluate_restarts_from_a_zero_state_after_each_done(policy):
    gen = torch.Generator().manual_seed(11)
    batch, steps = 3, 7
    obs = torch.randn(batch, steps, STATE_DIM, generator=gen)
    masks = random_masks((batch, steps), gen)
    dones = torch.zeros(batch, steps, dtype=torch.bool)
    dones[0, 2] = True  # env 0: episodes of 3 and 4 steps
    dones[1, [3, 4, 6]] = True  # env 1: 4 steps, a single-step episode, 2 steps
    start, outputs = act_step_by_step(policy, obs, masks, dones, gen)
    actions = {h: torch.stack([o.actions[h] for o in outputs], 1) for h in HEAD_NAMES}

    ev = policy.evaluate(obs, actions, masks, start, dones=dones)
    for head in HEAD_NAMES:
        acted = torch.stack([o.log_probs[head] for o in outputs], 1)
        torch.testing.assert_close(ev.log_probs[head], acted, atol=1e-5, rtol=1e-5)
    acted_values = torch.stack([o.value for o in outputs], 1)
    torch.testing.assert_close(ev.values, acted_values, atol=1e-5, rtol=1e-5)

    # without the dones the state is carried across the ends: later steps differ
    carried = policy.evaluate(obs, actions, masks, start)
    assert (carried.values[0, 3:] - acted_values[0, 3:]).abs().min() > 1e-4
    assert (carried.values[1, 4:] - acted_values[1, 4:]).abs().min() > 1e-4
    torch.testing.assert_close(carried.values[2], acted_values[2], atol=1e-5, rtol=1e-5)


def test_evaluate_runs_one_lstm_call_unless_an_episode_ends_inside_a_row(policy):
    gen = torch.Generator().manual_seed(12)
    batch, steps = 2, 5
    obs = torch.randn(batch, steps, STATE_DIM, generator=gen)
    masks = random_masks((batch, steps), gen)
    actions = {h: torch.zeros(batch, steps, dtype=torch.int64) for h in HEAD_NAMES}
    start = policy.initial_hidden(batch)
    calls = []
    policy.lstm.register_forward_hook(lambda _, inputs, __: calls.append(inputs[0].shape[1]))

    plain = policy.evaluate(obs, actions, masks, start)
    last_only = torch.zeros(batch, steps, dtype=torch.bool)
    last_only[:, -1] = True  # ends at the last step change nothing inside the rows
    same = policy.evaluate(obs, actions, masks, start, dones=last_only)
    assert calls == [steps, steps]
    torch.testing.assert_close(same.values, plain.values, rtol=0, atol=0)

    calls.clear()
    interior = last_only.clone()
    interior[0, 1] = interior[1, 1] = interior[1, 3] = True  # new episodes at steps 2 and 4
    policy.evaluate(obs, actions, masks, start, dones=interior)
    assert calls == [2, 2, 1]  # one call per stretch between the steps where some row restarts


def test_evaluate_rejects_dones_of_another_shape(policy):
    batch, steps = 2, 3
    actions = {h: torch.zeros(batch, steps, dtype=torch.int64) for h in HEAD_NAMES}
    masks = {h: torch.ones(batch, steps, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
    with pytest.raises(ValueError, match=r"dones: expected a bool tensor of shape \(2, 3\); "
                                         r"got torch.bool \(2, 2\)"):
        policy.evaluate(torch.zeros(batch, steps, STATE_DIM), actions, masks,
                        policy.initial_hidden(batch), dones=torch.zeros(2, 2, dtype=torch.bool))


def test_same_generator_seed_gives_same_actions(policy):
    masks = random_masks((64,), torch.Generator().manual_seed(9))
    obs = torch.randn(64, STATE_DIM)
    runs = [
        policy.act(obs, masks, policy.initial_hidden(64), torch.Generator().manual_seed(10))
        for _ in range(2)
    ]
    for head in HEAD_NAMES:
        assert torch.equal(runs[0].actions[head], runs[1].actions[head])


def test_initialisation(policy):
    h = HIDDEN
    for layer in range(2):
        bias = getattr(policy.lstm, f"bias_ih_l{layer}") + getattr(policy.lstm, f"bias_hh_l{layer}")
        torch.testing.assert_close(bias[h : 2 * h], torch.ones(h))  # forget gate
        torch.testing.assert_close(bias[:h], torch.zeros(h))
        torch.testing.assert_close(bias[2 * h :], torch.zeros(2 * h))
    # [H, D] with H > D: orthonormal columns scaled by sqrt(2)
    w = policy.encoder[0].weight.detach()
    torch.testing.assert_close(w.T @ w, 2.0 * torch.eye(STATE_DIM), atol=1e-5, rtol=0)
    # [K, 64]: orthonormal rows scaled by the gain
    head_out = policy.heads["blueprint"][-1].weight.detach()
    torch.testing.assert_close(head_out @ head_out.T, 1e-4 * torch.eye(13), atol=1e-8, rtol=0)
    value_out = policy.value_head[-1].weight.detach()
    assert math.isclose(float(value_out.norm()), 1.0, rel_tol=1e-5)
    linears = [m for m in policy.modules() if isinstance(m, torch.nn.Linear)]
    assert all(not m.bias.detach().any() for m in linears)
