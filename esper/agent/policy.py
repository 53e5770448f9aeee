"""The recurrent factored actor-critic: one LSTM trunk, 8 masked categorical heads, a value head.

Shapes: `B` batch (environments), `T` time steps, `D` state_dim, `H` hidden_dim,
`L` LSTM layers, `K` a head's number of actions (`esper.agent.heads.HEAD_SIZES`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.checks import check_int

#: Logit given to masked actions. Finite rather than -inf so that softmax, entropy and
#: their gradients stay NaN-free even for a fully masked row, and representable in bf16/fp16.
MASKED_LOGIT = -1e4

#: Sampling order in `act`: the op first (it decides which other heads matter), then the rest.
SAMPLE_ORDER: tuple[str, ...] = ("op",) + tuple(h for h in HEAD_NAMES if h != "op")

Hidden = tuple[torch.Tensor, torch.Tensor]


class MaskedCategorical:
    """A categorical distribution over the last dimension with some actions forbidden.

    Args:
        logits: `[..., K]` float, any float dtype; computed on in float32.
        mask: `[..., K]` bool, True where the action is allowed.
        validate: check that every row allows at least one action. This reads a device
            value on the host (a host sync on CUDA), so hot paths may switch it off.
        name: how error messages call `mask` (e.g. `masks['op']`).

    Raises:
        ValueError: `mask` is not bool or not shaped like `logits` (always checked: free),
            or, with `validate`, a row allows no action.
    """

    def __init__(
        self, logits: torch.Tensor, mask: torch.Tensor, validate: bool = True, name: str = "mask"
    ) -> None:
        if mask.dtype != torch.bool:
            raise ValueError(f"{name}: expected dtype torch.bool; got {mask.dtype}")
        if mask.shape != logits.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(logits.shape)} (same as the logits); "
                f"got {tuple(mask.shape)}"
            )
        if validate:
            _check_rows_have_valid_action(mask, name)
        self.mask = mask
        self.log_probs_all = logits.float().masked_fill(~mask, MASKED_LOGIT).log_softmax(-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw one action per row: `[...]` int64. `generator` must live on the logits' device."""
        probs = self.log_probs_all.exp()
        flat = probs.reshape(-1, probs.shape[-1])  # [..., K] -> [N, K]
        drawn = torch.multinomial(flat, 1, generator=generator)  # [N, 1]
        return drawn.reshape(probs.shape[:-1])

    def mode(self) -> torch.Tensor:
        """The most probable action per row: `[...]` int64 (the first on a tie)."""
        return self.log_probs_all.argmax(-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability of `actions [...]` int64: `[...]` float32."""
        if actions.shape != self.mask.shape[:-1]:
            raise ValueError(
                f"actions: expected shape {tuple(self.mask.shape[:-1])}; got {tuple(actions.shape)}"
            )
        return self.log_probs_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """Entropy divided by log(#allowed actions): `[...]` float32 in [0, 1].

        1 for a uniform choice among the allowed actions; 0 when exactly one is allowed
        (there is no choice to keep open, so it must not count against the entropy bonus).
        """
        probs = self.log_probs_all.exp()
        plogp = torch.where(self.mask, probs * self.log_probs_all, torch.zeros_like(probs))
        raw = -plogp.sum(-1)
        num_valid = self.mask.sum(-1)
        # clamp keeps log() away from 0 and -inf; those rows are replaced by 0 below
        scale = torch.log(num_valid.clamp(min=2).to(raw.dtype))
        return torch.where(num_valid > 1, raw / scale, torch.zeros_like(raw))


def _check_rows_have_valid_action(mask: torch.Tensor, name: str) -> None:
    """Raise ValueError if some row of `mask [..., K]` allows nothing."""
    empty = ~mask.any(-1)
    # host sync: the check must be read on the host to raise
    if bool(empty.any()):
        first = tuple(int(i) for i in empty.nonzero()[0])
        raise ValueError(
            f"{name}: expected at least one allowed action in every row; "
            f"got {int(empty.sum())} row(s) with none, the first at index {first}"
        )


class ActOutput(NamedTuple):
    """One sampled step for `B` environments."""

    actions: dict[str, torch.Tensor]
    """head -> `[B]` int64 action."""
    log_probs: dict[str, torch.Tensor]
    """head -> `[B]` float32 log-probability of that action."""
    value: torch.Tensor
    """`[B]` float32 state value."""
    hidden: Hidden
    """`(h, c)`, each `[L, B, H]` float32: the LSTM state after this step."""


class EvalOutput(NamedTuple):
    """The policy re-run over stored sequences, with gradients."""

    log_probs: dict[str, torch.Tensor]
    """head -> `[B, T]` float32 log-probability of the stored action."""
    entropy: dict[str, torch.Tensor]
    """head -> `[B, T]` float32 normalised entropy (see `MaskedCategorical.entropy`)."""
    values: torch.Tensor
    """`[B, T]` float32 state values."""


def _mlp_head(hidden_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden_dim, 64), nn.ReLU(), nn.Linear(64, out_dim))


class FactoredRecurrentActorCritic(nn.Module):
    """`Linear(D,H) -> LayerNorm -> ReLU -> LSTM(H,H) -> LayerNorm`, then 8 action heads
    and a value head, each `Linear(H,64) -> ReLU -> Linear(64,out)`.

    Args:
        state_dim: `D`, features per observation.
        hidden_dim: `H`, width of the trunk and the LSTM.
        lstm_layers: `L`.
        validate_masks: check in `act`/`evaluate` that every mask row allows an action
            (one host sync per head and call on CUDA).
    """

    def __init__(
        self,
        state_dim: int,
        hidden_dim: int = 128,
        lstm_layers: int = 1,
        validate_masks: bool = True,
    ) -> None:
        super().__init__()
        check_int("state_dim", state_dim)
        check_int("hidden_dim", hidden_dim)
        check_int("lstm_layers", lstm_layers)
        self.state_dim = state_dim
        self.hidden_dim = hidden_dim
        self.lstm_layers = lstm_layers
        self.validate_masks = validate_masks
        self.encoder = nn.Sequential(
            nn.Linear(state_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.ReLU()
        )
        self.lstm = nn.LSTM(hidden_dim, hidden_dim, num_layers=lstm_layers, batch_first=True)
        self.lstm_norm = nn.LayerNorm(hidden_dim)
        self.heads = nn.ModuleDict({h: _mlp_head(hidden_dim, HEAD_SIZES[h]) for h in HEAD_NAMES})
        self.value_head = _mlp_head(hidden_dim, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        """Orthogonal init: gain sqrt(2) before ReLUs, 0.01 on action logits (near-uniform
        first policy), 1 on the value output; LSTM weights gain 1 and forget-gate bias 1."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=math.sqrt(2))
                nn.init.zeros_(module.bias)
        for head in self.heads.values():
            nn.init.orthogonal_(head[-1].weight, gain=0.01)
        nn.init.orthogonal_(self.value_head[-1].weight, gain=1.0)
        h = self.hidden_dim
        for name, param in self.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, gain=1.0)
            else:
                nn.init.zeros_(param)
                # gates are ordered (input, forget, cell, output); bias_ih + bias_hh is the
                # gate's bias, so the forget gate's total is 1: it starts by remembering
                if name.startswith("bias_ih"):
                    nn.init.ones_(param[h : 2 * h])

    def initial_hidden(self, batch: int, device: torch.device | str = "cpu") -> Hidden:
        """Zero LSTM state `(h, c)`, each `[L, batch, H]` float32."""
        shape = (self.lstm_layers, batch, self.hidden_dim)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def _trunk(self, obs_seq: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """`obs_seq [B,T,D]` -> features `[B,T,H]` and the LSTM state after step T-1."""
        encoded = self.encoder(obs_seq)  # [B, T, H]
        out, (h, c) = self.lstm(encoded, hidden)
        return self.lstm_norm(out), (h, c)

    def _check_inputs(
        self,
        obs: torch.Tensor,
        time_dim: bool,
        masks: dict[str, torch.Tensor] | None,
        hidden: Hidden,
    ) -> None:
        """Shape checks shared by act/evaluate/value: `obs` is `[B, T, D]` if `time_dim`
        else `[B, D]`; each of `hidden` is `[L, B, H]`; `masks` has every head."""
        expected_obs = f"[B, T, {self.state_dim}]" if time_dim else f"[B, {self.state_dim}]"
        if obs.dim() != 2 + time_dim or obs.shape[-1] != self.state_dim:
            raise ValueError(f"obs: expected {expected_obs}; got {tuple(obs.shape)}")
        expected = (self.lstm_layers, obs.shape[0], self.hidden_dim)
        for name, tensor in zip(("hidden h", "hidden c"), hidden):
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{name}: expected shape {expected}; got {tuple(tensor.shape)}")
        if masks is not None and set(masks) != set(HEAD_NAMES):
            raise ValueError(
                f"masks: expected one mask per head {list(HEAD_NAMES)}; got {sorted(masks)}"
            )

    def _distribution(
        self, head: str, features: torch.Tensor, mask: torch.Tensor
    ) -> MaskedCategorical:
        logits = self.heads[head](features)
        return MaskedCategorical(logits, mask, self.validate_masks, name=f"masks[{head!r}]")

    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        masks: dict[str, torch.Tensor],
        hidden: Hidden,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> ActOutput:
        """Sample one step for every environment, without gradients.

        Args:
            obs: `[B, D]` float32 observations.
            masks: head -> `[B, K]` bool allowed actions.
            hidden: `(h, c)`, each `[L, B, H]`: the state carried from the previous step.
            generator: for reproducible sampling; must live on `obs`'s device.
            deterministic: take each head's most probable action instead of sampling
                (esper-lite's `get_action(..., deterministic=True)`, which its bootstrap
                forward calls, 2df957ed simic/agent/network.py:296-297).

        Returns:
            `ActOutput`; the op head is drawn first, then the others in `HEAD_NAMES` order,
            and the dicts are keyed in `HEAD_NAMES` order. Its tensors are inference
            tensors: store copies (as `RolloutBuffer.add` does) before any autograd use.
        """
        self._check_inputs(obs, False, masks, hidden)
        features, new_hidden = self._trunk(obs.unsqueeze(1), hidden)  # [B, 1, H]
        features = features.squeeze(1)  # [B, 1, H] -> [B, H]
        actions, log_probs = {}, {}
        for head in SAMPLE_ORDER:
            dist = self._distribution(head, features, masks[head])
            actions[head] = dist.mode() if deterministic else dist.sample(generator)
            log_probs[head] = dist.log_prob(actions[head])
        value = self.value_head(features).squeeze(-1).float()
        return ActOutput(
            actions={h: actions[h] for h in HEAD_NAMES},
            log_probs={h: log_probs[h] for h in HEAD_NAMES},
            value=value,
            hidden=new_hidden,
        )

    def evaluate(
        self,
        obs_seq: torch.Tensor,
        actions: dict[str, torch.Tensor],
        masks: dict[str, torch.Tensor],
        initial_hidden: Hidden,
        dones: torch.Tensor | None = None,
    ) -> EvalOutput:
        """Re-run whole sequences from their first hidden state (BPTT), with gradients.

        Args:
            obs_seq: `[B, T, D]` float32.
            actions: head -> `[B, T]` int64 actions taken.
            masks: head -> `[B, T, K]` bool allowed actions.
            initial_hidden: `(h, c)`, each `[L, B, H]`: the state before step 0.
            dones: `[B, T]` bool, True at a step that ends an episode (terminal or
                truncated), or None when no episode ends before its row's last step.

        A row may hold several episodes: the step after a done starts from a zero state,
        as a rollout that restarts an episode inside a row must have acted (it zeroes the
        env's state after storing the done step). Without an end inside any row the
        whole batch is one LSTM call; otherwise the time axis is cut where some row
        starts a new episode, one LSTM call per stretch, the restarting rows zeroed at
        each cut (dones aligned across rows cost as few calls as one row's). Reading the
        cut positions is one host sync; pass `dones=None` when the caller knows there
        is no interior end. Steps past a row's end cannot change earlier outputs, the
        LSTM being causal.
        """
        self._check_inputs(obs_seq, True, masks, initial_hidden)
        if set(actions) != set(HEAD_NAMES):
            raise ValueError(
                f"actions: expected one tensor per head {list(HEAD_NAMES)}; got {sorted(actions)}"
            )
        if dones is None:
            features, _ = self._trunk(obs_seq, initial_hidden)  # [B, T, H]
        else:
            features = self._trunk_with_restarts(obs_seq, initial_hidden, dones)
        log_probs, entropy = {}, {}
        for head in HEAD_NAMES:
            dist = self._distribution(head, features, masks[head])
            log_probs[head] = dist.log_prob(actions[head])
            entropy[head] = dist.entropy()
        values = self.value_head(features).squeeze(-1).float()  # [B, T, 1] -> [B, T]
        return EvalOutput(log_probs=log_probs, entropy=entropy, values=values)

    def _trunk_with_restarts(
        self, obs_seq: torch.Tensor, hidden: Hidden, dones: torch.Tensor
    ) -> torch.Tensor:
        """Features `[B, T, H]` of `obs_seq [B, T, D]`, the LSTM state zeroed in a row
        after each of its `dones [B, T]`."""
        expected = tuple(obs_seq.shape[:2])
        if dones.dtype != torch.bool or tuple(dones.shape) != expected:
            raise ValueError(
                f"dones: expected a bool tensor of shape {expected}; "
                f"got {dones.dtype} {tuple(dones.shape)}"
            )
        restarts = dones[:, :-1]  # [B, T-1]: True where step t + 1 starts an episode
        # host sync: the cut positions decide how many LSTM calls run
        cuts = (restarts.any(0).nonzero().flatten() + 1).tolist()
        if not cuts:
            return self._trunk(obs_seq, hidden)[0]
        encoded = self.encoder(obs_seq)  # [B, T, H]
        bounds = [0, *cuts, obs_seq.shape[1]]
        pieces = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            if start > 0:
                keep = ~restarts[:, start - 1].view(1, -1, 1)  # [B] -> [1, B, 1]
                zero = torch.zeros((), dtype=hidden[0].dtype, device=hidden[0].device)
                hidden = (torch.where(keep, hidden[0], zero), torch.where(keep, hidden[1], zero))
            out, hidden = self.lstm(encoded[:, start:end], hidden)
            pieces.append(out)
        return self.lstm_norm(torch.cat(pieces, dim=1))

    @torch.inference_mode()
    def value(self, obs: torch.Tensor, hidden: Hidden) -> torch.Tensor:
        """State value `[B]` float32 of `obs [B, D]` given the carried state `hidden`
        (`[L, B, H]` each): the bootstrap value for a rollout cut at its last step."""
        self._check_inputs(obs, False, None, hidden)
        features, _ = self._trunk(obs.unsqueeze(1), hidden)  # [B, 1, H]
        return self.value_head(features.squeeze(1)).squeeze(-1).float()
