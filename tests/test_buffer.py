"""RolloutBuffer: isolation, validation, valid-only normalisation, stale padding, variants."""

from __future__ import annotations

import pytest
import torch

from esper.buffer import RolloutBuffer
from esper.gae.reference import reference_gae
from esper.heads import HEAD_NAMES, HEAD_SIZES
from esper.variants import Variants

STATE_DIM, HIDDEN, LAYERS = 6, 8, 1


def make_buffer(num_envs=3, max_steps=5, variants=None) -> RolloutBuffer:
    return RolloutBuffer(num_envs, max_steps, STATE_DIM, lstm_hidden_dim=HIDDEN,
                         num_lstm_layers=LAYERS, variants=variants)


def step_args(g: torch.Generator, done=False, truncated=False) -> dict:
    masks = {h: torch.rand(k, generator=g) < 0.7 for h, k in HEAD_SIZES.items()}
    for m in masks.values():
        m[0] = True
    return dict(
        state=torch.randn(STATE_DIM, generator=g),
        actions={h: int(torch.randint(0, k, (), generator=g)) for h, k in HEAD_SIZES.items()},
        log_probs={h: float(-torch.rand((), generator=g)) for h in HEAD_NAMES},
        value=float(torch.randn((), generator=g)),
        reward=float(torch.randn((), generator=g)),
        done=done,
        masks=masks,
        hidden_h=torch.randn(LAYERS, 1, HIDDEN, generator=g),
        hidden_c=torch.randn(LAYERS, 1, HIDDEN, generator=g),
        truncated=truncated,
        bootstrap_value=float(torch.randn((), generator=g)),
    )


def fill(buffer: RolloutBuffer, counts: list[int], seed=0) -> list[list[dict]]:
    g = torch.Generator().manual_seed(seed)
    added = []
    for env, n in enumerate(counts):
        row = []
        for t in range(n):
            args = step_args(g, done=bool(torch.rand((), generator=g) < 0.2),
                             truncated=(t == n - 1))
            buffer.add(env, **args)
            row.append(args)
        added.append(row)
    return added


def poison_padding(buffer: RolloutBuffer, counts: list[int]) -> None:
    """Write NaN / garbage past each row's count, as a previous rollout would leave."""
    for env, n in enumerate(counts):
        for t in (buffer.states, buffer.values, buffer.rewards, buffer.bootstrap_values,
                  buffer.hidden_h, buffer.hidden_c, *buffer.log_probs.values()):
            t[env, n:] = float("nan")
        buffer.dones[env, n:] = True
        buffer.truncated[env, n:] = True


@pytest.mark.parametrize("counts_kind", ["list", "tensor"])
def test_per_env_isolation_and_round_trip(counts_kind):
    buffer = make_buffer(variants=Variants(step_counts=counts_kind))
    added = fill(buffer, [2, 0, 5])
    assert [buffer.step_count(e) for e in range(3)] == [2, 0, 5]
    for env, row in enumerate(added):
        for t, args in enumerate(row):
            torch.testing.assert_close(buffer.states[env, t], args["state"])
            assert buffer.actions["op"][env, t] == args["actions"]["op"]
            assert torch.equal(buffer.masks["blueprint"][env, t], args["masks"]["blueprint"])
            torch.testing.assert_close(buffer.hidden_h[env, t], args["hidden_h"][:, 0])
    assert (buffer.states[1] == 0).all()  # env 1 untouched by the others' writes


def test_step_counts_variant_types():
    assert isinstance(make_buffer(variants=Variants(step_counts="list")).step_counts, list)
    counts = make_buffer(variants=Variants(step_counts="tensor")).step_counts
    assert isinstance(counts, torch.Tensor) and counts.device.type == "cpu"


def test_overflow_raises_and_reset_allows_reuse():
    buffer = make_buffer(num_envs=1, max_steps=2)
    fill(buffer, [2])
    with pytest.raises(ValueError, match="buffer full"):
        buffer.add(0, **step_args(torch.Generator().manual_seed(1)))
    stale = buffer.states.clone()
    buffer.reset()
    assert buffer.step_count(0) == 0
    assert torch.equal(buffer.states, stale)  # reset does not zero the storage
    buffer.add(0, **step_args(torch.Generator().manual_seed(2)))


def _bad(field):
    """Return (mutation of add's kwargs, expected text in the error)."""
    cases = {
        "env_id": (lambda a: a.update(env_id=7), "env_id"),
        "negative env_id": (lambda a: a.update(env_id=-1), "env_id"),
        "state": (lambda a: a.update(state=torch.zeros(STATE_DIM + 1)), "state.shape"),
        "mask shape": (lambda a: a["masks"].update(slot=torch.ones(4, dtype=torch.bool)),
                       r"masks\['slot'\].shape"),
        "mask dtype": (lambda a: a["masks"].update(op=torch.ones(6)), r"masks\['op'\].dtype"),
        "missing head": (lambda a: a["actions"].pop("tempo"), "actions keys"),
        "action range": (lambda a: a["actions"].update(style=4), r"actions\['style'\]"),
        "hidden_h": (lambda a: a.update(hidden_h=torch.zeros(LAYERS, HIDDEN)), "hidden_h.shape"),
        "hidden_c": (lambda a: a.update(hidden_c=torch.zeros(LAYERS, 2, HIDDEN)), "hidden_c.shape"),
    }
    return cases[field]


@pytest.mark.parametrize("field", ["env_id", "negative env_id", "state", "mask shape",
                                   "mask dtype", "missing head", "action range",
                                   "hidden_h", "hidden_c"])
@pytest.mark.parametrize("counts_kind", ["list", "tensor"])
def test_bad_input_names_field_and_changes_nothing(field, counts_kind):
    buffer = make_buffer(variants=Variants(step_counts=counts_kind))
    fill(buffer, [1, 1, 1])
    before = {name: t.clone() for name, t in vars(buffer).items() if isinstance(t, torch.Tensor)}
    counts_before = [buffer.step_count(e) for e in range(3)]
    args = dict(env_id=0, **step_args(torch.Generator().manual_seed(9)))
    mutate, expected = _bad(field)
    mutate(args)
    with pytest.raises(ValueError, match=expected) as err:
        buffer.add(**args)
    assert "expected" in str(err.value) and "got" in str(err.value)
    assert [buffer.step_count(e) for e in range(3)] == counts_before
    for name, t in before.items():
        assert torch.equal(getattr(buffer, name), t), name


@pytest.mark.parametrize("method", ["loop", "batched", "scan"])
def test_gae_ignores_stale_padding_and_matches_reference(method):
    counts = [5, 2, 0]
    buffer = make_buffer(variants=Variants(gae=method, reset="mask"))
    fill(buffer, counts)
    poison_padding(buffer, counts)
    buffer.compute_advantages_and_returns(gamma=0.99, gae_lambda=0.95)
    ref_adv, ref_ret = reference_gae(
        buffer.rewards, buffer.values, buffer.dones, buffer.truncated,
        buffer.bootstrap_values, counts, gamma=0.99, gae_lambda=0.95)
    torch.testing.assert_close(buffer.advantages.double(), ref_adv, rtol=0, atol=1e-5)
    torch.testing.assert_close(buffer.returns.double(), ref_ret, rtol=0, atol=1e-5)

    buffer.normalize_advantages()
    batch = buffer.get_batched_sequences("cpu")
    for key in ("advantages", "returns"):
        assert torch.isfinite(batch[key]).all()
        assert (batch[key][~batch["valid_mask"]] == 0).all()


def test_normalization_over_valid_entries_only():
    counts = [4, 1, 3]
    buffer = make_buffer()
    fill(buffer, counts)
    buffer.compute_advantages_and_returns(gamma=0.99, gae_lambda=0.95)
    buffer.advantages[0, 4] = 1e6  # padding: must not move the statistics
    raw = buffer.advantages.clone()
    valid = buffer.valid_mask()
    buffer.normalize_advantages()
    expected = (raw[valid] - raw[valid].mean()) / (raw[valid].std(unbiased=False) + 1e-8)
    torch.testing.assert_close(buffer.advantages[valid], expected)
    assert buffer.advantages[valid].mean().abs() < 1e-5
    assert (buffer.advantages[~valid] == 0).all()


def test_batched_sequences_layout():
    buffer = make_buffer()
    fill(buffer, [3, 5, 1])
    batch = buffer.get_batched_sequences("cpu")
    assert batch["states"].shape == (3, 5, STATE_DIM)
    assert batch["initial_hidden_h"].shape == (LAYERS, 3, HIDDEN)
    torch.testing.assert_close(batch["initial_hidden_h"][:, 1], buffer.hidden_h[1, 0])
    assert batch["valid_mask"].tolist() == [[t < n for t in range(5)] for n in (3, 5, 1)]
    assert set(batch["actions"]) == set(HEAD_NAMES)
    assert batch["masks"]["blueprint"].shape == (3, 5, HEAD_SIZES["blueprint"])


@pytest.mark.parametrize("gae_method", ["loop", "scan"])
def test_list_and_tensor_step_counts_identical(gae_method):
    outputs = []
    for kind in ("list", "tensor"):
        buffer = make_buffer(variants=Variants(step_counts=kind, gae=gae_method))
        fill(buffer, [5, 3, 4], seed=11)
        poison_padding(buffer, [5, 3, 4])
        buffer.compute_advantages_and_returns(gamma=0.995, gae_lambda=0.98)
        buffer.normalize_advantages()
        outputs.append(buffer.get_batched_sequences("cpu"))
    a, b = outputs
    for key in ("advantages", "returns", "valid_mask"):
        assert torch.equal(a[key], b[key]), key


def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_steps"):
        RolloutBuffer(2, 0, STATE_DIM)
