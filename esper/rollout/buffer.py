"""Pre-allocated, env-major rollout storage for recurrent factored PPO.

Every tensor is `[num_envs, max_steps, ...]` on the buffer's device. `reset()` only zeroes
the step counts, so padding past a row's count holds stale data from earlier rollouts:
every consumer goes through `valid_mask`, and GAE writes 0 there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from numbers import Real

import numpy as np
import torch
from torch.profiler import record_function

from esper import gae
from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.checks import check_device, check_int, is_integral
from esper.host_view import host_item, host_view
from esper.rollout.device_spans import DeviceSpans
from esper.rollout.transfer import FlatTransfer
from esper.variants import Variants

Tensor = torch.Tensor
Scalar = float | int | Tensor


Flag = bool | int | Tensor
_HEAD_SET = frozenset(HEAD_NAMES)
#: the variants of a buffer made without any: the original's code paths, with `add`'s checks
CHECKED = Variants(add_checks="checked")


def _add_error(where: str, field: str, expected: object, got: object) -> ValueError:
    """`where` is "env E step S: " (empty before the env is known)."""
    return ValueError(f"RolloutBuffer.add: {where}{field}: expected {expected}; got {got}")


def _shape_of(value: object) -> object:
    """A tensor's shape as a tuple, else the name of the type that is not a tensor."""
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _one_element(value: Tensor) -> bool:
    """A 0-d or [1] tensor: what fits one cell of the buffer."""
    return value.dim() <= 1 and value.numel() == 1


def _number(where: str, field: str, value: object, expected: str) -> float | None:
    """`value` as a float: a Python or NumPy real (not a bool) or a one-element real CPU
    tensor, read in place; None for a one-element real tensor on another device, which
    `device_checks` checks. Anything else raises, naming `field`."""
    if type(value) is float:
        return value
    if isinstance(value, Tensor):
        if (_one_element(value) and value.dtype != torch.bool
                and not value.is_complex()):
            return float(host_item(value)) if value.is_cpu else None
        got = f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    elif isinstance(value, Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    else:
        got = repr(value)
    raise _add_error(where, field, f"{expected} (a number or a one-element tensor)", got)


def _action_index(where: str, head: str, action: object, size: int) -> int | None:
    """The action as an int in [0, size): a Python or NumPy int (not a bool) or a
    one-element integer CPU tensor; None for one on another device (`device_checks`)."""
    if type(action) is int:  # the usual case first: no ABC check
        index = action
    elif isinstance(action, Tensor):
        if not (_one_element(action) and not action.is_floating_point()
                and action.dtype != torch.bool and not action.is_complex()):
            raise _add_error(where, f"actions[{head!r}]", f"an int in [0, {size}) or a one-element "
                             "integer tensor", f"a {action.dtype} tensor of shape {tuple(action.shape)}")
        if not action.is_cpu:
            return None
        index = host_item(action)
    elif is_integral(action):
        index = int(action)
    else:  # a float (1.7 would be stored as 1), a bool, anything else
        raise _add_error(where, f"actions[{head!r}]", f"an int in [0, {size})",
                         f"{action!r} ({type(action).__name__})")
    if not 0 <= index < size:
        raise _add_error(where, f"actions[{head!r}]", f"an int in [0, {size})", index)
    return index


def _flag(where: str, field: str, value: object) -> bool | None:
    """`value` as a bool: True/False, a NumPy bool, 0 or 1, or a one-element bool CPU
    tensor; None for a one-element bool tensor on another device (always 0 or 1)."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_) or (type(value) is int and value in (0, 1)):
        return bool(value)
    if isinstance(value, Tensor) and value.dtype == torch.bool and _one_element(value):
        return host_item(value) if value.is_cpu else None
    got = (f"a {value.dtype} tensor of shape {tuple(value.shape)}"
           if isinstance(value, Tensor) else repr(value))
    raise _add_error(where, field, "a bool (True/False, 0/1 or a one-element bool tensor)", got)


def check_mask_shapes(masks: Mapping[str, Tensor]) -> None:
    """Rollout-buffer audit 5.1's check, for each head: `ValueError` unless the mask's
    shape is `(K,)` (metadata only: no aten op)."""
    for head, size in HEAD_SIZES.items():
        mask = masks[head]
        if mask.shape != (size,):
            raise _add_error("", f"masks[{head!r}].shape", (size,), tuple(mask.shape))


def _non_finite(tensor: Tensor) -> str | None:
    """Where a floating CPU tensor holds a NaN or an infinity ("nan at [3]"), or None.

    Read in place through NumPy (`esper.host_view`): no aten op, a few microseconds for
    a state of a few hundred floats."""
    values = np.ctypeslib.as_array(host_view(tensor))
    finite = np.isfinite(values)
    if finite.all():
        return None
    index = int(np.argmin(finite))  # the first False
    return f"{values[index]} at [{', '.join(map(str, np.unravel_index(index, tensor.shape)))}]"


def device_checks(
    where: str,
    actions: Mapping[str, tuple[int | Tensor, Tensor]],
    log_probs: Mapping[str, Tensor],
    finite: Mapping[str, Tensor],
) -> None:
    """Device-side asserts (`torch._assert_async`) for `add`'s arguments that live off
    the CPU, where reading them would sync the host.

    `actions`: head -> (action, mask [K] bool): the action is in [0, K) and allowed by
    the mask (an int action was range-checked on the host; a tensor one is looked up
    with `index_select`, which does not read it on the host). `log_probs`: head ->
    tensor, finite and <= 0. `finite`: name -> tensor (a scalar, the state, a hidden
    state) whose every element is finite.

    One assert per kind of check and device, over all of its fields at once (a handful
    of small kernels per `add` rather than one per head); its message starts
    "RolloutBuffer.add: {where}" and names the fields it covers. On CUDA a failure
    surfaces at a later synchronising call; on the CPU `_assert_async` raises
    `RuntimeError` at once.
    """
    prefix = f"RolloutBuffer.add: {where}"
    allowed: list[Tensor] = []
    for head, (action, mask) in actions.items():
        size = mask.shape[0]
        if isinstance(action, Tensor):
            index = action.reshape(1).long()
            mask = mask.to(index.device, non_blocking=True)
            hit = mask.index_select(0, index.clamp(0, size - 1))[0]
            allowed.append((index[0] >= 0) & (index[0] < size) & hit)
        else:
            allowed.append(mask[action])
    _assert_all(allowed, f"{prefix}actions[{', '.join(map(repr, actions))}]: expected ints "
                         "in [0, K) that their masks allow")
    log_prob_ok = [(torch.isfinite(lp) & (lp <= 0)).all() for lp in log_probs.values()]
    _assert_all(log_prob_ok, f"{prefix}log_probs[{', '.join(map(repr, log_probs))}]: "
                             "expected finite numbers <= 0")
    all_finite = [torch.isfinite(tensor).all() for tensor in finite.values()]
    _assert_all(all_finite, f"{prefix}{', '.join(finite)}: expected finite numbers")


def _assert_all(conditions: list[Tensor], message: str) -> None:
    """One `torch._assert_async` per device over 0-d bool `conditions`."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for condition in conditions:
        by_device.setdefault(condition.device, []).append(condition)
    for group in by_device.values():
        torch._assert_async(group[0] if len(group) == 1 else torch.stack(group).all(), message)


class RolloutBuffer:
    """One rollout of `num_envs` rows of up to `max_steps` steps each.

    Shapes (n = num_envs, m = max_steps, D = state_dim, L = layers, H = hidden, K = head size):
        states [n, m, D] f32; actions[head] [n, m] int64; log_probs[head] [n, m] f32;
        masks[head] [n, m, K] bool; values, rewards, bootstrap_values, advantages,
        returns [n, m] f32; dones, truncated [n, m] bool; hidden_h, hidden_c [n, m, L, H] f32.

    `variants.step_counts` picks the bookkeeping (B4-PT-05): a Python list (the
    original: turned into a tensor once per update, by `get_batched_sequences`; GAE's
    loop and `normalize_advantages` read it as ints), a CPU int32 `tensor` as the
    ticket's first fix writes it (`add` reads its step as `int(step_counts[env_id])` and
    counts up with `step_counts[env_id] += 1`: tensor ops and a read per add), a list
    beside a `cached` count tensor rebuilt only when `step_counts_dirty` says the list
    changed (the ticket's second), or a CPU int64 tensor read and counted up through a
    `numpy_view` of its memory, so that `add` runs no aten op for it (this project's).
    `variants.gae` and `variants.reset` pick the GAE method.
    """

    def __init__(
        self,
        num_envs: int = 4,
        max_steps: int = 25,
        state_dim: int = 218,
        *,
        lstm_hidden_dim: int = 128,
        num_lstm_layers: int = 1,
        device: torch.device | str = "cpu",
        variants: Variants | None = None,
    ) -> None:
        for name, value in (("num_envs", num_envs), ("max_steps", max_steps),
                            ("state_dim", state_dim), ("lstm_hidden_dim", lstm_hidden_dim),
                            ("num_lstm_layers", num_lstm_layers)):
            check_int(f"RolloutBuffer: {name}", value)
        self.num_envs, self.max_steps, self.state_dim = num_envs, max_steps, state_dim
        self.lstm_hidden_dim, self.num_lstm_layers = lstm_hidden_dim, num_lstm_layers
        if variants is not None and not isinstance(variants, Variants):
            raise TypeError(f"RolloutBuffer: variants: expected a Variants or None (e.g. "
                            f"Variants.parse('ours')); got {variants!r} "
                            f"({type(variants).__name__})")
        self.device = check_device("RolloutBuffer: device", device)
        self.variants = variants if variants is not None else CHECKED
        self._checked = self.variants.add_checks == "checked"
        self._checks_mask_shapes = self.variants.add_checks == "mask_shapes"

        shape = (num_envs, max_steps)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.states = torch.zeros(*shape, state_dim, **f32)
        self.actions = {h: torch.zeros(shape, dtype=torch.int64, device=self.device) for h in HEAD_NAMES}
        self.log_probs = {h: torch.zeros(shape, **f32) for h in HEAD_NAMES}
        self.masks = {
            h: torch.zeros(*shape, k, dtype=torch.bool, device=self.device) for h, k in HEAD_SIZES.items()
        }
        self.values = torch.zeros(shape, **f32)
        self.rewards = torch.zeros(shape, **f32)
        self.bootstrap_values = torch.zeros(shape, **f32)
        self.advantages = torch.zeros(shape, **f32)
        self.returns = torch.zeros(shape, **f32)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        hidden_shape = (*shape, num_lstm_layers, lstm_hidden_dim)
        self.hidden_h = torch.zeros(hidden_shape, **f32)
        self.hidden_c = torch.zeros(hidden_shape, **f32)

        self._gae_spans = DeviceSpans(self.device)
        self.last_gae_seconds = 0.0
        self._flat_transfers: dict[torch.device, FlatTransfer] = {}

        self.step_counts: list[int] | Tensor
        if self.variants.step_counts == "tensor":  # the ticket's `__init__` line
            self.step_counts = torch.zeros(num_envs, dtype=torch.int32, device="cpu")
            self._counts_view = self.step_counts  # read and counted up by tensor ops
        elif self.variants.step_counts == "numpy_view":
            self.step_counts = torch.zeros(num_envs, dtype=torch.int64)
            self._counts_view = self.step_counts.numpy()  # shares memory with the tensor
        else:
            self.step_counts = [0] * num_envs
            self._counts_view = self.step_counts
        self._caches_counts = self.variants.step_counts == "cached"
        self.step_counts_dirty = True
        """With `step_counts="cached"`: whether the counts changed (`add`, `reset`) since
        `step_counts_tensor` last built its tensor, which it then rebuilds."""
        self._counts_cache: Tensor | None = None

    # ------------------------------------------------------------------ writing

    def reset(self) -> None:
        """Start a new rollout. Only the counts are zeroed; padding keeps stale data."""
        if isinstance(self.step_counts, Tensor):
            self.step_counts.zero_()
        else:
            self.step_counts[:] = [0] * self.num_envs
        self.step_counts_dirty = True

    def step_count(self, env_id: int) -> int:
        """Steps stored so far for `env_id`."""
        return int(self._counts_view[env_id])

    def add(
        self,
        env_id: int,
        state: Tensor,
        actions: Mapping[str, int | Tensor],
        log_probs: Mapping[str, Scalar],
        value: Scalar,
        reward: Scalar,
        done: Flag,
        masks: Mapping[str, Tensor],
        hidden_h: Tensor,
        hidden_c: Tensor,
        truncated: Flag = False,
        bootstrap_value: Scalar | None = None,
    ) -> None:
        """Store one step of `env_id`: state [D], 8 actions, 8 log-probs, 8 masks [K] bool,
        hidden_h/hidden_c [L, 1, H]. Everything is detached and copied.

        Scalars (log-probs, value, reward, bootstrap_value) are Python numbers or
        one-element tensors; actions are ints or one-element integer tensors; done and
        truncated are bools (or 0/1, or one-element bool tensors). `bootstrap_value` is
        required when `truncated` is True (the value the truncated episode would have
        gone on to earn); otherwise it defaults to 0, used only if the row's last step
        ends up neither done nor truncated.

        With `variants.add_checks == "checked"` every argument is checked first
        (`validate_step` says what), so a failed add raises `ValueError` naming the field,
        the expected and the received value, the env and the step, and leaves the buffer
        unchanged. Values are read without a host sync: CPU tensors in place, tensors on
        other devices by device-side asserts, which report a bad value at a later
        synchronising call, after the step was written (on CUDA the failed assert also
        poisons the context).

        With `"mask_shapes"` (the audit's 5.1) each mask's shape is checked first, as the
        audit writes it (`if slot_mask.shape != (self.num_slots,): raise ValueError`):
        `check_mask_shapes`; the rest is written as with `"none"`.

        With `"none"` (the original) only a full row is refused (`ValueError`, where the
        original raised `RuntimeError`); anything else is written as given: a NaN is
        stored, a [1] mask broadcasts over its head's K actions, a mask of another wrong
        length or a hidden state of the wrong shape fails in the copy (`RuntimeError`)
        after the fields before it were written, and an `env_id` past the end raises
        `IndexError` (a negative one writes into the row it counts back to).
        """
        if self._checked:
            step = self.validate_step(env_id, state, actions, log_probs, value, reward, done,
                                      masks, hidden_h, hidden_c, truncated, bootstrap_value)
        else:
            if self._checks_mask_shapes:
                check_mask_shapes(masks)
            step = self.step_count(env_id)
            if step >= self.max_steps:
                raise self._full(env_id, step)
        # the original's writes, in its order (599f3895 rollout_buffer.py:308-343)
        self.states[env_id, step] = state.detach()
        for head in HEAD_NAMES:
            self.actions[head][env_id, step] = _cell(actions[head], detach=False)
        for head in HEAD_NAMES:
            self.log_probs[head][env_id, step] = _cell(log_probs[head])
        self.values[env_id, step] = _cell(value)
        self.rewards[env_id, step] = _cell(reward)
        self.dones[env_id, step] = _cell(done, detach=False)
        self.truncated[env_id, step] = _cell(truncated, detach=False)
        self.bootstrap_values[env_id, step] = (
            0.0 if bootstrap_value is None else _cell(bootstrap_value))
        for head in HEAD_NAMES:
            self.masks[head][env_id, step] = masks[head].detach().bool()
        self.hidden_h[env_id, step] = hidden_h.detach().squeeze(1)  # [L, 1, H] -> [L, H]
        self.hidden_c[env_id, step] = hidden_c.detach().squeeze(1)
        self._counts_view[env_id] += 1  # the ticket's `step_counts[env_idx] += 1` for `tensor`
        if self._caches_counts:
            self.step_counts_dirty = True

    def validate_step(self, env_id: int, state: Tensor, actions: Mapping[str, int | Tensor],
                      log_probs: Mapping[str, Scalar], value: Scalar, reward: Scalar,
                      done: Flag, masks: Mapping[str, Tensor], hidden_h: Tensor,
                      hidden_c: Tensor, truncated: Flag = False,
                      bootstrap_value: Scalar | None = None) -> int:
        """The checks `add` runs before writing (same arguments); returns the step `add`
        would write.

        Raises `ValueError` ("RolloutBuffer.add: env E step S: FIELD: expected ...; got
        ...") unless: env_id is an int in [0, num_envs) whose row is not full; state is
        a [D] tensor; actions, log_probs and masks are mappings over exactly `HEAD_NAMES`;
        each mask is a [K] bool tensor; each action an int (not a bool or a float) or a
        one-element integer tensor in [0, K) that its mask allows; each log-prob a finite
        number <= 0; value, reward and bootstrap_value finite numbers (bootstrap_value
        given when truncated is True); done and truncated bools; hidden_h and hidden_c
        [L, 1, H] tensors; state, hidden_h and hidden_c free of NaN and infinity.

        Python numbers are checked in Python and CPU tensors read in place
        (`esper.host_view`): no aten op, no host sync. Tensors on other devices (CUDA)
        are checked by `device_checks` (device-side asserts, no host sync), which
        cannot raise here: see `add`.
        """
        if (type(env_id) is not int and not is_integral(env_id)) or not 0 <= env_id < self.num_envs:
            raise _add_error("", "env_id", f"an int in [0, {self.num_envs})", repr(env_id))
        step = self.step_count(env_id)
        where = f"env {env_id} step {step}: "
        if step >= self.max_steps:
            raise self._full(env_id, step)
        if not isinstance(state, Tensor) or state.shape != (self.state_dim,):
            raise _add_error(where, "state.shape", (self.state_dim,), _shape_of(state))
        for name, mapping in (("actions", actions), ("log_probs", log_probs), ("masks", masks)):
            if type(mapping) is not dict and not isinstance(mapping, Mapping):
                raise _add_error(where, name, f"a mapping over the heads {sorted(HEAD_NAMES)}",
                                 type(mapping).__name__)
            if mapping.keys() != _HEAD_SET:
                raise _add_error(where, f"{name} keys", sorted(HEAD_NAMES), sorted(mapping, key=str))
        on_device: dict[str, dict] = {"actions": {}, "log_probs": {}, "finite": {}}
        for head, size in HEAD_SIZES.items():
            mask = masks[head]
            if not isinstance(mask, Tensor) or mask.shape != (size,):
                raise _add_error(where, f"masks[{head!r}].shape", (size,), _shape_of(mask))
            if mask.dtype != torch.bool:
                raise _add_error(where, f"masks[{head!r}].dtype", torch.bool, mask.dtype)
            action = _action_index(where, head, actions[head], size)
            if action is None or not mask.is_cpu:
                on_device["actions"][head] = (actions[head] if action is None else action, mask)
            elif not host_item(mask, action):
                allowed = [i for i, ok in enumerate(host_view(mask)) if ok]
                raise _add_error(where, f"actions[{head!r}]", f"an action that masks[{head!r}] "
                                 f"allows ({allowed})", f"{action}, which it forbids")
            log_prob = _number(where, f"log_probs[{head!r}]", log_probs[head], "a finite number <= 0")
            if log_prob is None:
                on_device["log_probs"][head] = log_probs[head]
            elif not -math.inf < log_prob <= 0.0:  # NaN fails too
                raise _add_error(where, f"log_probs[{head!r}]", "a finite number <= 0", log_prob)
        scalars = [("value", value), ("reward", reward)]
        truncating = _flag(where, "truncated", truncated)
        _flag(where, "done", done)
        if bootstrap_value is not None:
            scalars.append(("bootstrap_value", bootstrap_value))
        elif truncating is not False:  # True, or a device tensor that may be True
            raise _add_error(where, "bootstrap_value", "a finite number (required when "
                             "truncated=True: the value the cut episode would go on to earn)", None)
        for name, number in scalars:
            checked = _number(where, name, number, "a finite number")
            if checked is None:
                on_device["finite"][name] = number
            elif not math.isfinite(checked):
                raise _add_error(where, name, "a finite number", checked)
        want_hidden = (self.num_lstm_layers, 1, self.lstm_hidden_dim)
        for name, hidden in (("hidden_h", hidden_h), ("hidden_c", hidden_c)):
            if not isinstance(hidden, Tensor) or hidden.shape != want_hidden:
                raise _add_error(where, f"{name}.shape", want_hidden, _shape_of(hidden))
        # a NaN here would reach the update's LSTM and make its losses NaN
        for name, tensor in (("state", state), ("hidden_h", hidden_h), ("hidden_c", hidden_c)):
            if not tensor.is_floating_point():
                continue
            if not tensor.is_cpu:
                on_device["finite"][name] = tensor
                continue
            bad = _non_finite(tensor)
            if bad is not None:
                raise _add_error(where, name, "finite numbers", bad)
        if on_device["actions"] or on_device["log_probs"] or on_device["finite"]:
            device_checks(where, **on_device)
        return step

    def _full(self, env_id: int, step: int) -> ValueError:
        return _add_error(f"env {env_id} step {step}: ", "env_id", f"an env with fewer than "
                          f"max_steps={self.max_steps} steps (buffer full: reset() starts a "
                          "new rollout)", f"env {env_id}, which holds {step}")

    # ------------------------------------------------------------------ reading

    def step_counts_tensor(self, device: torch.device | str | None = None) -> Tensor:
        """The step counts, an integer tensor [num_envs] on `device` (default: the
        buffer's), made as the bookkeeping makes it (`variants.step_counts`):

        - `list`: `torch.tensor(list, device)` on every call, the original's conversion
          (599f3895 rollout_buffer.py:458; on CUDA a blocking host-to-device copy);
        - `tensor` and `numpy_view`: the CPU tensor `.to(device, non_blocking=True)`, as
          the ticket's first fix writes it (the same tensor on the CPU);
        - `cached`: the ticket's `get_step_counts_tensor`, an int32 tensor built as the
          list's is and kept until `step_counts_dirty` (or another device) asks for a new
          one. The ticket's sketch kept one tensor whatever device was asked; this one is
          rebuilt for another device.
        """
        device = self.device if device is None else torch.device(device)
        if isinstance(self.step_counts, Tensor):
            return self.step_counts.to(device, non_blocking=True)
        if not self._caches_counts:
            return torch.tensor(self.step_counts, device=device)
        cache = self._counts_cache
        if self.step_counts_dirty or cache is None or cache.device != device:
            cache = self._counts_cache = torch.tensor(self.step_counts, device=device,
                                                      dtype=torch.int32)
            self.step_counts_dirty = False
        return cache

    def valid_mask(self, device: torch.device | str | None = None) -> Tensor:
        """[num_envs, max_steps] bool on `device` (default: the buffer's): t < step_counts[e],
        from `step_counts_tensor(device)`, by the original's ops (599f3895
        rollout_buffer.py:458-460: `unsqueeze(1)`, `arange(...).unsqueeze(0)`, `<`)."""
        device = self.device if device is None else torch.device(device)
        step_counts_tensor = self.step_counts_tensor(device).unsqueeze(1)
        step_indices = torch.arange(self.max_steps, device=device).unsqueeze(0)
        return step_indices < step_counts_tensor  # [num_envs, max_steps]

    def compute_advantages_and_returns(self, gamma: float, gae_lambda: float) -> None:
        """Fill `advantages` and `returns` with `variants.gae` / `variants.reset`.

        Sets `last_gae_seconds` (host) and, on CUDA, the span read by `last_gae_device_seconds`.
        """
        self._gae_spans.clear()
        start = time.perf_counter()
        with record_function("gae"), self._gae_spans.span("gae"):
            counts = self.step_counts if isinstance(self.step_counts, Tensor) else list(self.step_counts)
            self.advantages, self.returns = gae.compute_gae(
                self.rewards, self.values, self.dones, self.truncated, self.bootstrap_values,
                counts, gamma=gamma, gae_lambda=gae_lambda,
                method=self.variants.gae, reset=self.variants.reset,
            )
        # host seconds: on CUDA the async methods count their launches, not their kernels
        self.last_gae_seconds = time.perf_counter() - start

    @property
    def last_gae_device_seconds(self) -> float | None:
        """Device seconds of the last GAE (CUDA events at the range's ends); None on the CPU.

        Waits for the GAE's kernels (a host sync) unless a later sync already did.
        """
        return self._gae_spans.seconds().get("gae")

    def normalize_advantages(self) -> None:
        """Normalise advantages over valid entries only: (A - mean) / (population std + 1e-8);
        padding is 0 after it.

        With counts in a list (`list`, `cached`), as the original (599f3895
        rollout_buffer.py:418-443): each row's valid slice by its Python count, `cat`,
        `mean`, `std(correction=0)`, one write per row (into zeros: the padding). No
        count tensor is made: a list-bookkept update turns its counts into a tensor once,
        in `get_batched_sequences`, as the original's did. With a count tensor: masked
        sums, not boolean indexing, which would sync the host on CUDA.
        """
        if not isinstance(self.step_counts, Tensor):
            self._normalize_by_rows()
            return
        valid = self.valid_mask()
        count = valid.sum().clamp(min=1)
        adv = torch.where(valid, self.advantages, torch.zeros_like(self.advantages))
        mean = adv.sum() / count
        var = torch.where(valid, (adv - mean) ** 2, torch.zeros_like(adv)).sum() / count
        normalized = (adv - mean) / (var.sqrt() + 1e-8)
        self.advantages = torch.where(valid, normalized, torch.zeros_like(adv))

    def _normalize_by_rows(self) -> None:
        """`normalize_advantages` over the list's counts: the original's slices."""
        counts = self.step_counts
        rows = [self.advantages[env, :n] for env, n in enumerate(counts) if n > 0]
        normalized = torch.zeros_like(self.advantages)
        if rows:
            every = torch.cat(rows)  # [sum of counts]
            mean = every.mean()
            std = every.std(correction=0)  # population std: defined for one element
            for env, n in enumerate(counts):
                if n > 0:
                    normalized[env, :n] = (self.advantages[env, :n] - mean) / (std + 1e-8)
        self.advantages = normalized

    def get_batched_sequences(self, device: torch.device | str | None = None) -> dict:
        """Every stored field on `device` (non-blocking copies on CUDA) for full-sequence BPTT.

        Returns a dict: states [n, m, D]; actions / log_probs / masks: {head: [n, m(, K)]};
        values, rewards, advantages, returns [n, m]; hidden_h, hidden_c [n, m, L, H];
        valid_mask [n, m] bool; initial_hidden_h / initial_hidden_c [L, n, H] (the hidden
        state stored at each row's step 0).

        With `variants.transfer == "per_tensor"` (the original) these are the reviewed
        lines, 599f3895 rollout_buffer.py:454-504, op for op: the valid mask from the
        count tensor, then one `.to(device, non_blocking=device.type == "cuda")` per field
        in the original's order, the step-0 hidden states through
        `[:, 0, :, :].permute(1, 0, 2).contiguous().to(...)`. From a host buffer to
        another device, `flat` packs them into one copy split into views
        (`esper.rollout.transfer.FlatTransfer`); the values are the same.
        """
        device = self.device if device is None else torch.device(device)
        if (self.variants.transfer == "flat" and self.device.type == "cpu"
                and device.type != "cpu"):
            return _nest(self._flat_transfer(device)(_flatten(self._host_fields())))
        valid_mask = self.valid_mask(device)
        nb = device.type == "cuda"

        def move(t: Tensor) -> Tensor:
            return t.to(device, non_blocking=nb)

        return {
            "states": move(self.states),
            "actions": {h: move(t) for h, t in self.actions.items()},
            "log_probs": {h: move(t) for h, t in self.log_probs.items()},
            "values": move(self.values),
            "rewards": move(self.rewards),
            "advantages": move(self.advantages),
            "returns": move(self.returns),
            "masks": {h: move(t) for h, t in self.masks.items()},
            "hidden_h": move(self.hidden_h),
            "hidden_c": move(self.hidden_c),
            "valid_mask": valid_mask,
            # [n, L, H] -> [L, n, H], the layout nn.LSTM expects
            "initial_hidden_h": move(self.hidden_h[:, 0, :, :].permute(1, 0, 2).contiguous()),
            "initial_hidden_c": move(self.hidden_c[:, 0, :, :].permute(1, 0, 2).contiguous()),
        }

    def _host_fields(self) -> dict:
        """What `get_batched_sequences` returns, on the buffer's own device (no copy)."""
        return {
            "states": self.states, "actions": dict(self.actions),
            "log_probs": dict(self.log_probs), "values": self.values,
            "rewards": self.rewards, "advantages": self.advantages, "returns": self.returns,
            "masks": dict(self.masks), "hidden_h": self.hidden_h, "hidden_c": self.hidden_c,
            "valid_mask": self.valid_mask(),
            "initial_hidden_h": self.hidden_h[:, 0, :, :].permute(1, 0, 2).contiguous(),
            "initial_hidden_c": self.hidden_c[:, 0, :, :].permute(1, 0, 2).contiguous(),
        }

    def _flat_transfer(self, device: torch.device) -> FlatTransfer:
        """The buffer's flat transfer to `device`, made once (its staging buffer is kept)."""
        if device not in self._flat_transfers:
            self._flat_transfers[device] = FlatTransfer(device)
        return self._flat_transfers[device]


def _flatten(fields: dict) -> dict[str, Tensor]:
    """`{"actions": {"op": t}}` -> `{"actions/op": t}`: one level of nesting, flattened."""
    flat = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            flat.update({f"{key}/{head}": t for head, t in value.items()})
        else:
            flat[key] = value
    return flat


def _nest(flat: dict[str, Tensor]) -> dict:
    """The inverse of `_flatten`."""
    nested: dict = {}
    for key, value in flat.items():
        outer, _, head = key.partition("/")
        if head:
            nested.setdefault(outer, {})[head] = value
        else:
            nested[outer] = value
    return nested


def _cell(value: Scalar | Flag, detach: bool = True) -> Scalar | Flag:
    """What `add` writes into one cell: a tensor (detached unless `detach` is False: int
    and bool tensors carry no graph), a NumPy scalar as the Python one (torch refuses to
    assign a numpy.float32 or numpy.bool_), anything else as it is."""
    if isinstance(value, Tensor):
        return value.detach() if detach else value
    if isinstance(value, np.generic):
        return value.item()
    return value
