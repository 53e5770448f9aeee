"""Pre-allocated, env-major rollout storage for recurrent factored PPO.

Every tensor is `[num_envs, max_steps, ...]` on the buffer's device. `reset()` only zeroes
the step counts, so padding past a row's count holds stale data from earlier rollouts:
every consumer goes through `valid_mask`, and GAE writes 0 there.
"""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np
import torch
from torch.profiler import record_function

from esper import gae
from esper.device_spans import DeviceSpans
from esper.heads import HEAD_NAMES, HEAD_SIZES
from esper.transfer import FlatTransfer
from esper.variants import Variants

Tensor = torch.Tensor
Scalar = float | int | Tensor


def _add_error(field: str, expected: object, got: object) -> ValueError:
    return ValueError(f"RolloutBuffer.add: {field}: expected {expected}; got {got}")


class RolloutBuffer:
    """One rollout of `num_envs` rows of up to `max_steps` steps each.

    Shapes (n = num_envs, m = max_steps, D = state_dim, L = layers, H = hidden, K = head size):
        states [n, m, D] f32; actions[head] [n, m] int64; log_probs[head] [n, m] f32;
        masks[head] [n, m, K] bool; values, rewards, bootstrap_values, advantages,
        returns [n, m] f32; dones, truncated [n, m] bool; hidden_h, hidden_c [n, m, L, H] f32.

    `variants.step_counts` picks the bookkeeping: a Python list (the original) or a CPU
    int64 tensor, updated through a NumPy view of the same memory so that `add` reads no
    tensor element, and turned into `valid_mask` without a list-to-tensor conversion.
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
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"RolloutBuffer: {name}: expected a positive int; got {value!r}")
        self.num_envs, self.max_steps, self.state_dim = num_envs, max_steps, state_dim
        self.lstm_hidden_dim, self.num_lstm_layers = lstm_hidden_dim, num_lstm_layers
        self.device = torch.device(device)
        self.variants = variants if variants is not None else Variants.original()

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
        if self.variants.step_counts == "tensor":
            self.step_counts = torch.zeros(num_envs, dtype=torch.int64)
            self._counts_view = self.step_counts.numpy()  # shares memory with the tensor
        else:
            self.step_counts = [0] * num_envs
            self._counts_view = self.step_counts

    # ------------------------------------------------------------------ writing

    def reset(self) -> None:
        """Start a new rollout. Only the counts are zeroed; padding keeps stale data."""
        if isinstance(self.step_counts, Tensor):
            self.step_counts.zero_()
        else:
            self.step_counts[:] = [0] * self.num_envs

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
        done: bool,
        masks: Mapping[str, Tensor],
        hidden_h: Tensor,
        hidden_c: Tensor,
        truncated: bool = False,
        bootstrap_value: Scalar = 0.0,
    ) -> None:
        """Store one step of `env_id`: state [D], 8 actions, 8 log-probs, 8 masks [K] bool,
        hidden_h/hidden_c [L, 1, H]. Everything is detached and copied.

        Raises `ValueError` naming the field, before any write, so a failed add leaves the
        buffer unchanged.
        """
        step = self._check_add(env_id, state, actions, log_probs, masks, hidden_h, hidden_c)
        self.states[env_id, step] = state.detach()
        for head in HEAD_NAMES:
            self.actions[head][env_id, step] = actions[head]
            self.log_probs[head][env_id, step] = _detached(log_probs[head])
            self.masks[head][env_id, step] = masks[head].detach()
        self.values[env_id, step] = _detached(value)
        self.rewards[env_id, step] = _detached(reward)
        self.dones[env_id, step] = done
        self.truncated[env_id, step] = truncated
        self.bootstrap_values[env_id, step] = _detached(bootstrap_value)
        self.hidden_h[env_id, step] = hidden_h.detach()[:, 0]  # [L, 1, H] -> [L, H]
        self.hidden_c[env_id, step] = hidden_c.detach()[:, 0]
        self._counts_view[env_id] += 1

    def _check_add(self, env_id, state, actions, log_probs, masks, hidden_h, hidden_c) -> int:
        if not isinstance(env_id, (int, np.integer)) or not 0 <= env_id < self.num_envs:
            raise _add_error("env_id", f"an int in [0, {self.num_envs})", env_id)
        step = self.step_count(env_id)
        if step >= self.max_steps:
            raise _add_error(
                f"env {env_id} step", f"fewer than max_steps={self.max_steps} steps (buffer full)", step
            )
        if tuple(state.shape) != (self.state_dim,):
            raise _add_error("state.shape", (self.state_dim,), tuple(state.shape))
        for name, mapping in (("actions", actions), ("log_probs", log_probs), ("masks", masks)):
            if set(mapping) != set(HEAD_NAMES):
                raise _add_error(f"{name} keys", sorted(HEAD_NAMES), sorted(mapping))
        for head, size in HEAD_SIZES.items():
            mask = masks[head]
            if not isinstance(mask, Tensor) or tuple(mask.shape) != (size,):
                got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise _add_error(f"masks[{head!r}].shape", (size,), got)
            if mask.dtype != torch.bool:
                raise _add_error(f"masks[{head!r}].dtype", torch.bool, mask.dtype)
            action = actions[head]
            if isinstance(action, (int, np.integer)) and not 0 <= action < size:
                raise _add_error(f"actions[{head!r}]", f"an int in [0, {size})", action)
        want_hidden = (self.num_lstm_layers, 1, self.lstm_hidden_dim)
        for name, hidden in (("hidden_h", hidden_h), ("hidden_c", hidden_c)):
            if tuple(hidden.shape) != want_hidden:
                raise _add_error(f"{name}.shape", want_hidden, tuple(hidden.shape))
        return step

    # ------------------------------------------------------------------ reading

    def valid_mask(self, device: torch.device | str | None = None) -> Tensor:
        """[num_envs, max_steps] bool on `device` (default: the buffer's): t < step_counts[e]."""
        device = self.device if device is None else torch.device(device)
        if isinstance(self.step_counts, Tensor):
            counts = self.step_counts.to(device, non_blocking=True)
        else:
            counts = torch.tensor(self.step_counts, device=device)  # the original's conversion
        return gae.valid_mask(counts, self.max_steps)

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
        """Normalise advantages over valid entries only: (A - mean) / (population std + 1e-8).

        Masked sums rather than boolean indexing, which would sync the host on CUDA.
        """
        valid = self.valid_mask()
        count = valid.sum().clamp(min=1)
        adv = torch.where(valid, self.advantages, torch.zeros_like(self.advantages))
        mean = adv.sum() / count
        var = torch.where(valid, (adv - mean) ** 2, torch.zeros_like(adv)).sum() / count
        normalized = (adv - mean) / (var.sqrt() + 1e-8)
        self.advantages = torch.where(valid, normalized, torch.zeros_like(adv))

    def get_batched_sequences(self, device: torch.device | str | None = None) -> dict:
        """Every field on `device` (non-blocking copies on CUDA) for full-sequence BPTT.

        Returns a dict: states [n, m, D]; actions / log_probs / masks: {head: [n, m(, K)]};
        values, rewards, advantages, returns, bootstrap_values [n, m]; dones, truncated
        [n, m]; valid_mask [n, m] bool; initial_hidden_h / initial_hidden_c [L, n, H]
        (the hidden state stored at each row's step 0).

        From a host buffer to another device, `variants.transfer` picks one `.to()` per
        tensor (`per_tensor`, the original) or one `flat` copy split into views
        (`esper.transfer.FlatTransfer`); the values are the same.
        """
        device = self.device if device is None else torch.device(device)
        if (self.variants.transfer == "flat" and self.device.type == "cpu"
                and device.type != "cpu"):
            return _nest(self._flat_transfer(device)(_flatten(self._host_fields())))
        non_blocking = device.type == "cuda"

        def move(t: Tensor) -> Tensor:
            return t.to(device, non_blocking=non_blocking)

        return {
            "states": move(self.states),
            "actions": {h: move(t) for h, t in self.actions.items()},
            "log_probs": {h: move(t) for h, t in self.log_probs.items()},
            "masks": {h: move(t) for h, t in self.masks.items()},
            "values": move(self.values),
            "rewards": move(self.rewards),
            "advantages": move(self.advantages),
            "returns": move(self.returns),
            "bootstrap_values": move(self.bootstrap_values),
            "dones": move(self.dones),
            "truncated": move(self.truncated),
            "valid_mask": self.valid_mask(device),
            # [n, L, H] -> [L, n, H], the layout nn.LSTM expects
            "initial_hidden_h": move(self.hidden_h[:, 0].transpose(0, 1).contiguous()),
            "initial_hidden_c": move(self.hidden_c[:, 0].transpose(0, 1).contiguous()),
        }

    def _host_fields(self) -> dict:
        """What `get_batched_sequences` returns, on the buffer's own device (no copy)."""
        return {
            "states": self.states, "actions": dict(self.actions),
            "log_probs": dict(self.log_probs), "masks": dict(self.masks),
            "values": self.values, "rewards": self.rewards, "advantages": self.advantages,
            "returns": self.returns, "bootstrap_values": self.bootstrap_values,
            "dones": self.dones, "truncated": self.truncated, "valid_mask": self.valid_mask(),
            "initial_hidden_h": self.hidden_h[:, 0].transpose(0, 1).contiguous(),
            "initial_hidden_c": self.hidden_c[:, 0].transpose(0, 1).contiguous(),
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


def masks_to_device(masks: Mapping[str, Tensor], device: torch.device | str) -> dict[str, Tensor]:
    """One step's action masks `{head: [N, K] bool}` on `device`, in a single transfer.

    Copying each head (or, in `add`, each env's row of each head) from the host would be
    8 (or 8 x N) copies per step, each blocking on CUDA. The heads are packed side by side
    into one [N, sum K] tensor, copied once without blocking (no host sync), and split
    back into [N, K] views. Masks already on `device` are returned as they are.
    """
    device = torch.device(device)
    if all(mask.device == device for mask in masks.values()):
        return dict(masks)
    heads = list(masks)
    packed = torch.cat([masks[head] for head in heads], dim=1)  # {head: [N, K]} -> [N, sum K]
    moved = packed.to(device, non_blocking=True)  # a pageable source is staged before return
    return dict(zip(heads, moved.split([masks[head].shape[1] for head in heads], dim=1)))


def _detached(value: Scalar) -> Scalar:
    return value.detach() if isinstance(value, Tensor) else value
