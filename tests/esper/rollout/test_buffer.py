"""RolloutBuffer: isolation, validation, valid-only normalisation, stale padding, variants."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.gae.reference import reference_gae
from esper.rollout.buffer import RolloutBuffer, device_checks
from esper.variants import Variants
from harness.measure.counters import profile_call

STATE_DIM, HIDDEN, LAYERS = 6, 8, 1


def make_buffer(num_envs=3, max_steps=5, variants=None, add_checks="checked") -> RolloutBuffer:
    """A small buffer whose `add` checks its inputs unless `add_checks="none"` (the
    original's add, which `Variants()` alone would give)."""
    variants = dataclasses.replace(variants or Variants(), add_checks=add_checks)
    return RolloutBuffer(num_envs, max_steps, STATE_DIM, lstm_hidden_dim=HIDDEN,
                         num_lstm_layers=LAYERS, variants=variants)


def step_args(g: torch.Generator, done=False, truncated=False) -> dict:
    """Random arguments of one valid `add` (every action allowed by its mask)."""
    actions = {h: int(torch.randint(0, k, (), generator=g)) for h, k in HEAD_SIZES.items()}
    masks = {h: torch.rand(k, generator=g) < 0.7 for h, k in HEAD_SIZES.items()}
    for head, m in masks.items():
        m[actions[head]] = True
    return dict(
        state=torch.randn(STATE_DIM, generator=g),
        actions=actions,
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


NAN, INF = float("nan"), float("inf")


def _set(key, value):
    return lambda a: a.update({key: value})


def _set_in(mapping, head, value):
    return lambda a: a[mapping].update({head: value})


def _forbid(head):
    """Clear the mask bit of the head's own action."""
    def mutate(a):
        mask = a["masks"][head].clone()
        mask[a["actions"][head]] = False
        a["masks"][head] = mask
    return mutate


#: name -> (mutation of add's kwargs, text its error must contain)
BAD_INPUTS = {
    "env_id": (_set("env_id", 7), "env_id"),
    "negative env_id": (_set("env_id", -1), "env_id"),
    "bool env_id": (_set("env_id", True), "env_id"),
    "state": (_set("state", torch.zeros(STATE_DIM + 1)), "state.shape"),
    "state a list": (_set("state", [0.0] * STATE_DIM), "state"),
    "mask shape": (_set_in("masks", "slot", torch.ones(4, dtype=torch.bool)),
                   r"masks\['slot'\].shape"),
    "mask dtype": (_set_in("masks", "op", torch.ones(6)), r"masks\['op'\].dtype"),
    "missing head": (lambda a: a["actions"].pop("tempo"), "actions keys"),
    "actions a list": (_set("actions", [0] * 8), "actions"),
    "action range": (_set_in("actions", "style", 4), r"actions\['style'\]"),
    "float action": (_set_in("actions", "op", 1.7), r"actions\['op'\]"),
    "whole float action": (_set_in("actions", "op", 1.0), r"actions\['op'\]"),
    "bool action": (_set_in("actions", "op", True), r"actions\['op'\]"),
    "tensor action out of range": (_set_in("actions", "blueprint", torch.tensor(13)),
                                   r"actions\['blueprint'\]"),
    "negative tensor action": (_set_in("actions", "tempo", torch.tensor([-1])), r"actions\['tempo'\]"),
    "float tensor action": (_set_in("actions", "slot", torch.tensor(1.0)), r"actions\['slot'\]"),
    "two-element tensor action": (_set_in("actions", "slot", torch.tensor([0, 1])),
                                  r"actions\['slot'\]"),
    "action its mask forbids": (_forbid("op"), r"actions\['op'\].*forbids"),
    "tensor action its mask forbids": (lambda a: (_forbid("alpha_curve")(a), a["actions"].update(
        alpha_curve=torch.as_tensor(a["actions"]["alpha_curve"])))[0], r"actions\['alpha_curve'\]"),
    "positive log-prob": (_set_in("log_probs", "op", 0.25), r"log_probs\['op'\]"),
    "NaN log-prob": (_set_in("log_probs", "slot", NAN), r"log_probs\['slot'\]"),
    "-inf log-prob": (_set_in("log_probs", "slot", -INF), r"log_probs\['slot'\]"),
    "NaN log-prob tensor": (_set_in("log_probs", "style", torch.tensor(NAN)), r"log_probs\['style'\]"),
    "log-prob a string": (_set_in("log_probs", "style", "-1"), r"log_probs\['style'\]"),
    "NaN value": (_set("value", NAN), "value"),
    "inf value tensor": (_set("value", torch.tensor([INF])), "value"),
    "value a string": (_set("value", "0.5"), "value"),
    "two values": (_set("value", torch.zeros(2)), "value"),
    "NaN reward": (_set("reward", NAN), "reward"),
    "inf reward": (_set("reward", -INF), "reward"),
    "NaN reward tensor": (_set("reward", torch.tensor(NAN, dtype=torch.float64)), "reward"),
    "bool reward": (_set("reward", True), "reward"),
    "done NaN": (_set("done", NAN), "done"),
    "done 2": (_set("done", 2), "done"),
    "done a string": (_set("done", "yes"), "done"),
    "done a float tensor": (_set("done", torch.tensor(1.0)), "done"),
    "truncated 2": (_set("truncated", 2), "truncated"),
    "truncated without bootstrap_value": (lambda a: a.update(truncated=True, bootstrap_value=None),
                                          "bootstrap_value"),
    "NaN bootstrap_value": (_set("bootstrap_value", NAN), "bootstrap_value"),
    "inf bootstrap_value tensor": (_set("bootstrap_value", torch.tensor(INF)), "bootstrap_value"),
    "NaN state": (lambda a: a["state"].__setitem__(2, NAN), "state"),
    "inf state": (lambda a: a["state"].__setitem__(0, -INF), "state"),
    "NaN hidden_h": (lambda a: a["hidden_h"].view(-1).__setitem__(3, NAN), "hidden_h"),
    "inf hidden_c": (lambda a: a["hidden_c"].view(-1).__setitem__(-1, INF), "hidden_c"),
    "hidden_h": (_set("hidden_h", torch.zeros(LAYERS, HIDDEN)), "hidden_h.shape"),
    "hidden_c": (_set("hidden_c", torch.zeros(LAYERS, 2, HIDDEN)), "hidden_c.shape"),
    "hidden_c None": (_set("hidden_c", None), "hidden_c"),
}


def snapshot(buffer: RolloutBuffer) -> dict:
    """A copy of every public tensor of the buffer (dicts of heads included) and the
    counts (its private ones are views or caches of those)."""
    out = {}
    for name, value in vars(buffer).items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            out[name] = value.clone()
        elif isinstance(value, dict):
            out.update({f"{name}[{h}]": t.clone() for h, t in value.items()
                        if isinstance(t, torch.Tensor)})
    out["counts"] = [buffer.step_count(e) for e in range(buffer.num_envs)]
    return out


def assert_unchanged(buffer: RolloutBuffer, before: dict) -> None:
    after = snapshot(buffer)
    assert after["counts"] == before["counts"]
    for name, t in before.items():
        if name != "counts":
            assert torch.equal(after[name], t), name


@pytest.mark.parametrize("field", list(BAD_INPUTS))
@pytest.mark.parametrize("counts_kind", ["list", "tensor"])
def test_bad_input_names_field_env_and_step_and_changes_nothing(field, counts_kind):
    """The old add wrote part of a step (states, actions, ...) before failing on a bad
    value, reward or done; it also stored float actions (1.7 as 1), done=2, NaN rewards
    and actions their own mask forbids."""
    buffer = make_buffer(variants=Variants(step_counts=counts_kind))
    fill(buffer, [1, 1, 1])
    before = snapshot(buffer)
    args = dict(env_id=0, **step_args(torch.Generator().manual_seed(9)))
    mutate, expected = BAD_INPUTS[field]
    mutate(args)
    with pytest.raises(ValueError, match=expected) as err:
        buffer.add(**args)
    message = str(err.value)
    assert "expected" in message and "got" in message
    if "env_id" not in field:
        assert "env 0 step 1" in message, message
    assert_unchanged(buffer, before)


def test_truncated_step_requires_a_bootstrap_value_and_others_default_to_zero():
    buffer = make_buffer(num_envs=1)
    args = step_args(torch.Generator().manual_seed(3))
    args.pop("bootstrap_value")
    with pytest.raises(ValueError, match="bootstrap_value: expected a finite number .*truncated"):
        buffer.add(0, **{**args, "truncated": True})
    buffer.bootstrap_values.fill_(7.0)
    buffer.add(0, **args)  # not truncated: no bootstrap needed, 0 stored
    assert buffer.bootstrap_values[0, 0].item() == 0.0


def test_tensor_scalars_are_stored_exactly():
    """0-d and one-element tensors for actions, log-probs, value, reward, bootstrap and done."""
    buffer = make_buffer(num_envs=1)
    args = step_args(torch.Generator().manual_seed(4), truncated=True)
    tensor_args = dict(
        args,
        actions={h: torch.tensor([a]) for h, a in args["actions"].items()},
        log_probs={h: torch.tensor(lp, dtype=torch.float64) for h, lp in args["log_probs"].items()},
        value=torch.tensor(args["value"]), reward=torch.tensor([args["reward"]]),
        bootstrap_value=torch.tensor(args["bootstrap_value"], requires_grad=True),
        done=torch.tensor(True),
    )
    buffer.add(0, **tensor_args)
    assert buffer.actions["op"][0, 0].item() == args["actions"]["op"]
    assert buffer.dones[0, 0].item() is True
    for stored, given in ((buffer.values, args["value"]), (buffer.rewards, args["reward"]),
                          (buffer.bootstrap_values, args["bootstrap_value"]),
                          (buffer.log_probs["op"], args["log_probs"]["op"])):
        assert stored[0, 0].item() == torch.tensor(given, dtype=torch.float32).item()


def test_checks_read_cpu_tensors_without_an_op_or_host_sync():
    """`validate_step` (the checks `add` runs) reads CPU tensor arguments in place: the
    profiler sees no aten op, so no `_local_scalar_dense` host sync either."""
    buffer = make_buffer(num_envs=1)
    args = step_args(torch.Generator().manual_seed(5), truncated=True)
    args.update(actions={h: torch.tensor(a) for h, a in args["actions"].items()},
                log_probs={h: torch.tensor(lp) for h, lp in args["log_probs"].items()},
                value=torch.tensor(args["value"]), reward=torch.tensor(args["reward"]),
                bootstrap_value=torch.tensor(args["bootstrap_value"]), done=torch.tensor(False))
    counters = profile_call(lambda: buffer.validate_step(0, **args))
    assert (counters.op_calls, counters.host_syncs) == (0, 0), counters.ops


def test_device_checks_fire_on_bad_values_only():
    """Stand-in for CUDA, which this machine lacks: `device_checks` builds the device-side
    asserts `add` runs on non-CPU tensor arguments; on CPU tensors `torch._assert_async`
    raises at once. It cannot prove the absence of host syncs on CUDA (the CUDA test
    below does, where there is a GPU)."""
    mask = torch.tensor([False, True, True])
    device_checks("env 0 step 0: ", actions={"op": (torch.tensor(1), mask)},
                  log_probs={"op": torch.tensor(-0.5)}, finite={"value": torch.tensor(2.0)})
    bad = [
        dict(actions={"op": (torch.tensor(0), mask)}),
        dict(actions={"op": (torch.tensor(3), mask)}),
        dict(actions={"op": (1, torch.tensor([True, False]))}),
        dict(log_probs={"op": torch.tensor(0.5)}),
        dict(log_probs={"op": torch.tensor(NAN)}),
        dict(finite={"reward": torch.tensor(INF)}),
        dict(actions={"op": (torch.tensor(1), mask), "slot": (2, mask), "style": (0, mask)}),
        dict(finite={"value": torch.tensor(1.0), "reward": torch.tensor([NAN])}),
    ]
    for kwargs in bad:
        with pytest.raises(RuntimeError, match="env 0 step 0: "):
            device_checks("env 0 step 0: ", **{"actions": {}, "log_probs": {}, "finite": {}, **kwargs})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_add_on_cuda_does_not_sync_the_host():
    buffer = RolloutBuffer(1, 2, STATE_DIM, lstm_hidden_dim=HIDDEN, device="cuda")
    args = step_args(torch.Generator().manual_seed(6), truncated=True)
    cuda = dict(
        args, state=args["state"].cuda(), hidden_h=args["hidden_h"].cuda(),
        hidden_c=args["hidden_c"].cuda(), masks={h: m.cuda() for h, m in args["masks"].items()},
        actions={h: torch.tensor(a, device="cuda") for h, a in args["actions"].items()},
        value=torch.tensor(args["value"], device="cuda"),
    )
    counters = profile_call(lambda: buffer.add(0, **cuda))
    assert counters.host_syncs == 0, counters.ops


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


@pytest.mark.parametrize("counts_kind", ["list", "tensor", "cached"])
def test_normalization_over_valid_entries_only(counts_kind):
    counts = [4, 1, 3]
    buffer = make_buffer(variants=Variants(step_counts=counts_kind))
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
def test_every_step_counts_variant_gives_the_same_batch(gae_method):
    """The list (and cached) bookkeeping normalises by the original's slices, the tensor
    one by masked sums: the same statistics, summed in another order (float32 rounding)."""
    outputs = []
    for kind in ("list", "tensor", "cached"):
        buffer = make_buffer(variants=Variants(step_counts=kind, gae=gae_method))
        fill(buffer, [5, 3, 4], seed=11)
        poison_padding(buffer, [5, 3, 4])
        buffer.compute_advantages_and_returns(gamma=0.995, gae_lambda=0.98)
        buffer.normalize_advantages()
        outputs.append(buffer.get_batched_sequences("cpu"))
    first = outputs[0]
    for other in outputs[1:]:
        for key in ("returns", "valid_mask"):
            assert torch.equal(first[key], other[key]), key
        torch.testing.assert_close(first["advantages"], other["advantages"], rtol=1e-6, atol=1e-6)


def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_steps"):
        RolloutBuffer(2, 0, STATE_DIM)
