"""The PPO update for the recurrent factored policy: one batch = the whole rollout.

Read top to bottom: `PPOConfig` (hyper-parameters) -> `prepare_batch` (padding made
inert, per-head relevance masks) -> `ppo_losses` (pure function of tensors) ->
`PPOAgent.update` (GAE, epochs of full-sequence BPTT, KL early stop, clipped Adam steps;
`NonFiniteUpdateError` for an epoch whose losses are NaN or infinite, before its step).

By default the per-head terms are reduced as the reviewed system (esper-lite) reduces
them (`PPOConfig.objective = "reviewed"`); `"joint"` is this project's earlier objective.

Shapes: `n` environments, `m` the buffer's max steps, `D` state_dim, `L` LSTM layers,
`H` hidden size, `K` a head's number of actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import torch
from torch import nn
from torch.profiler import record_function

from esper.agent.heads import HEAD_NAMES, HEADS_FOR_OP, OPS
from esper.agent.policy import EvalOutput, FactoredRecurrentActorCritic
from esper.checks import check_bool, check_choice, check_device, check_int, check_number


#: How `ppo_losses` reduces the 8 per-head terms (see `PPOConfig.objective`).
OBJECTIVES: tuple[str, ...] = ("reviewed", "joint")


@dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of the update: esper-lite's values and objective by default.

    Each field names esper-lite's value and where it is set, at the commit the B4 reviews
    read (599f3895; `leyline` is `src/esper/leyline/__init__.py`, `ppo.py`
    `src/esper/simic/agent/ppo.py`). `tests/esper/test_original_defaults.py` holds every
    default to its original and lists the ones that differ on purpose (none here).
    """

    gamma: float = 0.995
    """Discount per step. Original: `0.995`, src/esper/leyline/__init__.py:52 @599f3895
    (DEFAULT_GAMMA, PPOAgent's default at ppo.py:197)."""
    gae_lambda: float = 0.98
    """GAE trace decay. Original: `0.98`, src/esper/leyline/__init__.py:89 @599f3895
    (DEFAULT_GAE_LAMBDA; 0.97 at 2df957ed, the vectorized review's commit)."""
    clip_ratio: float = 0.2
    """Surrogate clip: each head's ratio is clipped to [1 - clip_ratio, 1 + clip_ratio].
    Original: `0.2`, src/esper/leyline/__init__.py:83 @599f3895 (DEFAULT_CLIP_RATIO)."""
    value_clip: float = 10.0
    """New values are clipped to old value +- value_clip in the pessimistic value loss.
    Original: `10.0`, src/esper/leyline/__init__.py:316 @599f3895 (DEFAULT_VALUE_CLIP,
    with clip_value=True at ppo.py:214)."""
    entropy_coef: float = 0.05
    """Weight of the (normalised, in [0, 1]) entropy bonus. Original: `0.05`,
    src/esper/leyline/__init__.py:109 @599f3895 (DEFAULT_ENTROPY_COEF; used as
    max(entropy_coef, entropy_coef_min=0.01), which is 0.05 here)."""
    value_coef: float = 0.5
    """Weight of the value loss. Original: `0.5`, src/esper/leyline/__init__.py:93
    @599f3895 (DEFAULT_VALUE_COEF)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip before each Adam step. Original: `0.5`,
    src/esper/leyline/__init__.py:97 @599f3895 (DEFAULT_MAX_GRAD_NORM, applied at
    ppo.py:797)."""
    learning_rate: float = 3e-4
    """Adam learning rate. Original: `3e-4`, src/esper/leyline/__init__.py:79 @599f3895
    (DEFAULT_LEARNING_RATE)."""
    adam_eps: float = 1e-5
    """Adam epsilon. Original: `1e-5`, src/esper/simic/agent/ppo.py:351 @599f3895 (Adam
    fused on CUDA, as here; foreach on the CPU)."""
    target_kl: float = 0.015
    """Approximate-KL target; an epoch whose KL exceeds kl_stop_factor * target_kl
    is not applied and ends the update. Original: `0.015`,
    src/esper/simic/agent/ppo.py:223 @599f3895."""
    kl_stop_factor: float = 1.5
    """Multiple of target_kl that triggers the early stop. Original: `1.5`,
    src/esper/simic/agent/ppo.py:694 @599f3895 (written into the check)."""
    update_epochs: int = 1
    """Passes over the whole rollout per update (one full batch, one Adam step each).
    Original: `1`, src/esper/simic/agent/ppo.py:265 @599f3895 (`recurrent_n_epochs`,
    "Default 1 for recurrent (hidden state safety)", line 221; the trainer never passes
    another, and `ppo_updates_per_batch` defaults to 1 at simic/training/config.py:68).
    With one pass the KL check before it compares the policy with itself and never
    stops; more passes make it meaningful."""
    amp_bf16: bool = False
    """Run the policy forward of the update under bf16 autocast (losses stay float32).
    bf16 has float32's exponent range, so no GradScaler is needed (the original's fp16
    update ran without one: see docs/differences.md). Original: `False`,
    src/esper/simic/training/config.py:80 @599f3895 (`amp: bool = False`)."""
    objective: str = "reviewed"
    """How the per-head terms are reduced, with `m_h` a head's relevance mask over the
    stored steps (the steps whose op uses the head), `n_h = max(1, sum m_h)` and `N` the
    number of stored steps:

    - `"reviewed"` (esper-lite's): policy loss `sum_h -sum(m_h * surrogate_h) / n_h`, each
      head a mean over the steps where it matters; entropy term
      `sum_h coef_h * sum(m_h * H_h) / n_h` (a sum over heads, so up to 8); approximate KL
      the mean of the per-head KLs `sum(m_h * kl_h) / n_h` weighted by `n_h / sum n_h`.
    - `"joint"` (this project's earlier objective): the head surrogates summed and divided
      by `N`, as the joint log-prob they factor (rare heads weigh `n_h / N` of the
      reviewed weight); entropy term `mean_h coef_h * sum(valid * H_h) / N` (a mean over
      heads of means over every stored step, so each head's bonus is 8x weaker); KL of
      the joint log-ratio (the relevant heads' log-ratios summed per step), mean over
      stored steps: 4-6x the reviewed KL, so `target_kl` stops earlier.

    Both use the same clipped per-head ratios, value loss and `kl_i = (e^x - 1) - x`.
    Original: `"reviewed"`, src/esper/simic/agent/ppo.py:643 @599f3895 (the reduction of
    lines 643-750)."""
    head_entropy_coefs: Mapping[str, float] = field(default_factory=dict)
    """head -> `coef_h`, the weight of that head's entropy in the entropy term; heads left
    out get 1.0. Stored with every head filled in. Original: `{}`,
    src/esper/simic/agent/ppo.py:275 @599f3895 (none given: every head 1.0, lines
    275-284)."""

    def __post_init__(self) -> None:
        for name in ("gamma", "gae_lambda"):
            check_number(f"PPOConfig.{name}", getattr(self, name), minimum=0.0, maximum=1.0)
        positive = ("clip_ratio", "value_clip", "max_grad_norm", "learning_rate", "adam_eps",
                    "target_kl", "kl_stop_factor")
        for name in positive:
            check_number(f"PPOConfig.{name}", getattr(self, name), positive=True)
        for name in ("entropy_coef", "value_coef"):
            check_number(f"PPOConfig.{name}", getattr(self, name), minimum=0.0)
        check_int("PPOConfig.update_epochs", self.update_epochs)
        check_bool("PPOConfig.amp_bf16", self.amp_bf16)
        check_choice("PPOConfig.objective", self.objective, OBJECTIVES)
        object.__setattr__(self, "head_entropy_coefs", _full_head_coefs(self.head_entropy_coefs))


def _full_head_coefs(coefs: Mapping[str, float]) -> dict[str, float]:
    """Check `coefs` and return it with every head, missing ones at 1.0, in `HEAD_NAMES` order."""
    if not isinstance(coefs, Mapping):
        raise ValueError("PPOConfig.head_entropy_coefs: expected a mapping of head name to "
                         f"coefficient; got {type(coefs).__name__}")
    for head, coef in coefs.items():
        if head not in HEAD_NAMES:
            raise ValueError(f"PPOConfig.head_entropy_coefs: expected keys among "
                             f"{', '.join(HEAD_NAMES)}; got {head!r}")
        check_number(f"PPOConfig.head_entropy_coefs[{head!r}]", coef, minimum=0.0)
    return {head: float(coefs.get(head, 1.0)) for head in HEAD_NAMES}


def causal_head_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """`[len(OPS), len(HEAD_NAMES)]` bool: True where that op's outcome depends on that head
    (the reviewed system's relevance masks)."""
    table = torch.zeros(len(OPS), len(HEAD_NAMES), dtype=torch.bool)
    for op_index, op in enumerate(OPS):
        for head in HEADS_FOR_OP[op]:
            table[op_index, HEAD_NAMES.index(head)] = True
    return table.to(device)


class UpdateBatch(NamedTuple):
    """The rollout as the loss reads it; padding entries are replaced by inert values."""

    states: torch.Tensor
    """`[n, m, D]` float32, 0 in padding."""
    actions: dict[str, torch.Tensor]
    """head -> `[n, m]` int64, 0 in padding."""
    masks: dict[str, torch.Tensor]
    """head -> `[n, m, K]` bool, all allowed in padding."""
    old_log_probs: dict[str, torch.Tensor]
    """head -> `[n, m]` float32 log-probs at rollout time, 0 in padding."""
    old_values: torch.Tensor
    """`[n, m]` float32, 0 in padding."""
    advantages: torch.Tensor
    """`[n, m]` float32 normalised advantages, 0 in padding."""
    returns: torch.Tensor
    """`[n, m]` float32 value targets, 0 in padding."""
    valid: torch.Tensor
    """`[n, m]` bool, True on stored steps."""
    causal: dict[str, torch.Tensor]
    """head -> `[n, m]` bool: a stored step whose op uses the head (its relevance mask)."""
    initial_hidden: tuple[torch.Tensor, torch.Tensor]
    """`(h, c)`, each `[L, n, H]` float32: the state before step 0, 0 for empty envs."""
    dones: torch.Tensor | None
    """`[n, m]` bool: a step that ends an episode (done or truncated) and is followed by
    another stored step of its row, which the policy starts from a zero state. Ends at a
    row's last stored step are left out: nothing follows them. `PPOAgent` sets it to
    None when there is none (the usual case: one LSTM call per epoch)."""


def update_sequences(buffer, device: torch.device) -> dict:
    """`buffer.get_batched_sequences(device)` (the reviewed batch) with the buffer's
    `dones` and `truncated` (`[n, m]` bool) added on `device`: the episode ends inside a
    row, which the reviewed batch leaves out (it held one episode a row)."""
    sequences = buffer.get_batched_sequences(device)
    sequences["dones"] = buffer.dones.to(device, non_blocking=True)
    sequences["truncated"] = buffer.truncated.to(device, non_blocking=True)
    return sequences


def prepare_batch(sequences: dict, causal_table: torch.Tensor) -> UpdateBatch:
    """Turn `update_sequences` output into an `UpdateBatch`.

    Padding past each env's step count holds stale data (possibly NaN or out-of-range
    actions). Masking only the loss is not enough: a NaN state would reach the weight
    gradients through the LSTM backward (0 * NaN), and a stale action could index out of
    range. So every padded input is overwritten with an inert value here.
    """
    valid = sequences["valid_mask"]  # [n, m]

    def zero_padding(x: torch.Tensor) -> torch.Tensor:
        v = valid.view(valid.shape + (1,) * (x.dim() - 2))  # [n, m] -> [n, m, 1...]
        return torch.where(v, x, torch.zeros((), dtype=x.dtype, device=x.device))

    actions = {h: zero_padding(sequences["actions"][h]) for h in HEAD_NAMES}
    per_step = causal_table[actions["op"]]  # [n, m] op index -> [n, m, heads]
    causal = {h: per_step[..., i] & valid for i, h in enumerate(HEAD_NAMES)}
    started = valid[:, 0].view(1, -1, 1)  # envs with a step 0: [n] -> [1, n, 1]
    return UpdateBatch(
        states=zero_padding(sequences["states"]),
        actions=actions,
        masks={h: sequences["masks"][h] | ~valid.unsqueeze(-1) for h in HEAD_NAMES},
        old_log_probs={h: zero_padding(sequences["log_probs"][h]) for h in HEAD_NAMES},
        old_values=zero_padding(sequences["values"]),
        advantages=zero_padding(sequences["advantages"]),
        returns=zero_padding(sequences["returns"]),
        valid=valid,
        causal=causal,
        initial_hidden=tuple(
            torch.where(started, sequences[k], torch.zeros((), device=valid.device))
            for k in ("initial_hidden_h", "initial_hidden_c")
        ),
        dones=_interior_episode_ends(sequences["dones"] | sequences["truncated"], valid),
    )


def _interior_episode_ends(ends: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`ends [n, m]` bool kept where the next step of the row is stored: `[n, m]` bool."""
    followed = torch.zeros_like(valid)
    followed[:, :-1] = valid[:, 1:]
    return ends & followed


class PPOLosses(NamedTuple):
    """0-d float32 tensors of one epoch; only `total` carries gradients."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over True entries of `mask` (same shape); 0 when none is True."""
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    return total / mask.sum().clamp(min=1)


def ppo_losses(ev: EvalOutput, batch: UpdateBatch, config: PPOConfig) -> PPOLosses:
    """Clipped factored surrogate, clipped value loss and entropy bonus over stored steps.

    Each head has its own ratio `exp(clamp(logp_new - logp_old, -20, 20))` and its own
    clipped surrogate, counted only on the steps where the head is relevant (its op uses
    it; elsewhere its choice had no effect, so its log-prob must not carry the
    advantage). `config.objective` decides how the heads' terms are reduced (see
    `PPOConfig.objective`); `total = policy + value_coef * value - entropy_coef * entropy`.
    `approx_kl` reads each head's log-ratio before the clamp (esper-lite's, 599f3895
    ppo.py:673-674) on the steps where the head is relevant; `clip_fraction` is the share
    of stored steps where the op head's ratio was clipped (its, ppo.py:687-688).
    """
    valid = batch.valid
    zero = torch.zeros((), device=valid.device)
    joint_log_ratio = torch.zeros(valid.shape, device=valid.device)
    surrogates, entropies, kls, counts = [], [], [], []
    for head in HEAD_NAMES:
        relevant = batch.causal[head]
        raw_log_ratio = ev.log_probs[head] - batch.old_log_probs[head]
        log_ratio = torch.where(relevant, raw_log_ratio.clamp(-20.0, 20.0), zero)
        ratio = log_ratio.exp()
        advantage = torch.where(relevant, batch.advantages, zero)
        bounded = ratio.clamp(1.0 - config.clip_ratio, 1.0 + config.clip_ratio)
        surrogates.append(torch.min(ratio * advantage, bounded * advantage).sum())
        # the KL reads the log-ratio before the clamp, as esper-lite's (ppo.py:673-674);
        # `where`, not a product with the mask, so a step where the head is not relevant
        # counts 0 even when its log-ratio is infinite
        detached = torch.where(relevant, raw_log_ratio.detach(), zero)
        kls.append((torch.expm1(detached) - detached).sum())
        joint_log_ratio = joint_log_ratio + detached
        entropy_steps = relevant if config.objective == "reviewed" else valid
        entropies.append(torch.where(entropy_steps, ev.entropy[head], zero).sum())
        counts.append(relevant.sum())
        if head == "op":  # relevant at every stored step
            clipped_op = (((ratio.detach() - 1.0).abs() > config.clip_ratio) & valid).sum()

    # per head, [8] each: summed surrogate, entropy, KL, and the relevant steps
    surrogate, entropy_sum, kl_sum = (torch.stack(x) for x in (surrogates, entropies, kls))
    count = torch.stack(counts).float()
    coefs = [config.head_entropy_coefs[h] for h in HEAD_NAMES]
    if config.objective == "reviewed":
        per_head = count.clamp(min=1)  # n_h
        policy_loss = -(surrogate / per_head).sum()
        entropy = sum(c * e for c, e in zip(coefs, entropy_sum / per_head))
        weights = per_head / per_head.sum()  # a head relevant nowhere: n_h = 1, its KL 0
        approx_kl = (weights * kl_sum.detach() / per_head).sum()
    else:
        num_valid = valid.sum().clamp(min=1)  # N
        policy_loss = -surrogate.sum() / num_valid
        entropy = sum(c * e for c, e in zip(coefs, entropy_sum / num_valid)) / len(HEAD_NAMES)
        approx_kl = masked_mean(torch.expm1(joint_log_ratio) - joint_log_ratio, valid)

    value_loss = _clipped_value_loss(ev.values, batch, config.value_clip)
    total = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    return PPOLosses(
        total=total,
        policy=policy_loss.detach(),
        value=value_loss.detach(),
        entropy=entropy.detach(),
        approx_kl=approx_kl,
        clip_fraction=clipped_op / valid.sum().clamp(min=1),
    )


def _clipped_value_loss(values: torch.Tensor, batch: UpdateBatch, value_clip: float):
    """`0.5 * mean(max((V - R)^2, (V_clip - R)^2))` over stored steps, with
    `V_clip = V_old + clamp(V - V_old, -value_clip, value_clip)`; 0-d float32."""
    old = batch.old_values
    clipped = old + (values - old).clamp(-value_clip, value_clip)
    worst = torch.max((values - batch.returns) ** 2, (clipped - batch.returns) ** 2)
    return 0.5 * masked_mean(worst, batch.valid)


class NonFiniteUpdateError(FloatingPointError):
    """An update whose losses (or KL) came out NaN or infinite: raised at the epoch's check,
    before that epoch's Adam step, so a NaN never reaches the weights through this epoch.

    The message is one line naming the epoch, the non-finite losses, the inputs that hold
    non-finite values on stored steps (how many, of how many, and which: nan, inf) and
    whether the weights changed since the update began (an earlier epoch's step).
    """

    def __init__(self, epoch: int, losses: dict[str, float],
                 inputs: dict[str, tuple[int, int, str]], steps_taken: int) -> None:
        self.epoch = epoch
        """Index of the epoch whose check failed."""
        self.losses = losses
        """The non-finite losses of that epoch, name -> value (nan, inf or -inf)."""
        self.inputs = {name: count for name, (count, _, _) in inputs.items()}
        """Inputs with non-finite entries on stored steps, name -> how many: rewards,
        bootstrap_values, states, old_log_probs[head], old_values, advantages, returns,
        initial_hidden, policy parameters."""
        self.weights_changed = steps_taken > 0
        """Whether an earlier epoch of this update took an Adam step."""
        losses_text = ", ".join(f"{k} {v}" for k, v in losses.items())
        found = "; ".join(f"{name} ({count} of {total} {kind})"
                          for name, (count, total, kind) in inputs.items())
        steps = ("no Adam step was taken, the weights are as before the update" if not steps_taken
                 else f"{steps_taken} Adam step{'s were' if steps_taken > 1 else ' was'} taken "
                      "before it, so the weights changed")
        super().__init__(f"PPO update, epoch {epoch}: non-finite losses ({losses_text}); "
                         f"non-finite inputs on stored steps and weights: {found or 'none'}; "
                         f"{steps}")


def _non_finite_kind(x: torch.Tensor) -> str:
    """'nan', 'inf', '-inf' or a mix ('nan, inf') of the non-finite values in `x`."""
    kinds = torch.stack([x.isnan().any(), (x == math.inf).any(), (x == -math.inf).any()])
    return ", ".join(k for k, present in zip(("nan", "inf", "-inf"), kinds.tolist()) if present)


class PPOAgent:
    """Owns the policy's optimiser and runs PPO updates from a `RolloutBuffer`.

    Args:
        policy: the actor-critic; moved to `device`.
        config: hyper-parameters.
        device: where the update runs; Adam is fused on CUDA.
    """

    def __init__(
        self,
        policy: FactoredRecurrentActorCritic,
        config: PPOConfig = PPOConfig(),
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = check_device("PPOAgent: device", device)
        self.policy = policy.to(self.device)
        self.config = config
        self.optimizer = torch.optim.Adam(
            self.policy.parameters(),
            lr=config.learning_rate,
            eps=config.adam_eps,
            fused=True if self.device.type == "cuda" else None,
        )
        self._causal_table = causal_head_table(self.device)

    def update(self, buffer) -> dict[str, float]:
        """GAE, advantage normalisation, then up to `update_epochs` full-batch epochs.

        Returns:
            `policy_loss`, `value_loss`, `entropy`, `clip_fraction`: means over the epochs
            evaluated (including one stopped by the KL check); `approx_kl`: the last KL
            checked; `epochs_run`: Adam steps taken; `early_stop_epoch`: index of the epoch
            stopped by the KL check (KL above `kl_stop_factor * target_kl`, or NaN), or -1.

        Raises:
            ValueError: the buffer holds no step.
            NonFiniteUpdateError: an epoch's total loss is NaN or infinite, or its KL is
                NaN (raised before that epoch's step; an infinite KL with finite losses
                is a policy that moved far, and stops early as in the original).
        """
        with record_function("update"):
            batch = self._prepare(buffer)
            history: list[PPOLosses] = []
            stop_epoch = -1
            limit = self.config.kl_stop_factor * self.config.target_kl
            for epoch in range(self.config.update_epochs):
                losses = self._evaluate_losses(batch)
                history.append(losses)
                # host sync: one read per epoch, before backward: the early stop, and
                # whether the loss may be stepped at all (a NaN loss would make every
                # weight NaN through Adam)
                kl, total = torch.stack([losses.approx_kl, losses.total.detach()]).tolist()
                if math.isnan(kl) or not math.isfinite(total):
                    raise self._non_finite(buffer, batch, losses, epoch)
                if not kl <= limit:
                    stop_epoch = epoch
                    break
                self._step(losses.total)
            return _metrics(history, stop_epoch)

    def _non_finite(self, buffer, batch: UpdateBatch, losses: PPOLosses, epoch: int
                    ) -> NonFiniteUpdateError:
        """The error for an epoch whose losses are not finite, saying which inputs are not
        (host syncs: on this failure path only)."""
        values = torch.stack([x.detach().float() for x in losses]).tolist()
        bad_losses = {name: v for name, v in zip(PPOLosses._fields, values) if not math.isfinite(v)}
        valid, stored = batch.valid, buffer.valid_mask().to(buffer.rewards.device)
        # (values, the entries that count), per input; masks broadcast over trailing dims
        checked = {
            "rewards": (buffer.rewards, stored),
            "bootstrap_values": (buffer.bootstrap_values, stored & buffer.truncated),
            "states": (batch.states, valid),
            **{f"old_log_probs[{h}]": (batch.old_log_probs[h], valid) for h in HEAD_NAMES},
            "old_values": (batch.old_values, valid),
            "advantages": (batch.advantages, valid),
            "returns": (batch.returns, valid),
            "initial_hidden": (torch.cat(batch.initial_hidden), None),
            "policy parameters": (torch.cat([p.detach().flatten().float()
                                             for p in self.policy.parameters()]), None),
        }
        inputs = {}
        for name, (x, mask) in checked.items():
            if mask is not None:
                x = x[mask.view(mask.shape + (1,) * (x.dim() - mask.dim())).expand_as(x)]
            count = int((~torch.isfinite(x)).sum())
            if count:
                inputs[name] = (count, x.numel(), _non_finite_kind(x))
        return NonFiniteUpdateError(epoch, bad_losses, inputs, steps_taken=epoch)

    def _prepare(self, buffer) -> UpdateBatch:
        # the buffer labels this "gae" itself: a second range here would count its time twice
        buffer.compute_advantages_and_returns(self.config.gamma, self.config.gae_lambda)
        buffer.normalize_advantages()
        batch = prepare_batch(update_sequences(buffer, self.device), self._causal_table)
        # host sync: once per update, so an empty rollout fails loudly instead of a no-op,
        # and so that rows holding one episode each (the usual case) take one LSTM call
        any_step, interior_end = torch.stack([batch.valid.any(), batch.dones.any()]).tolist()
        if not any_step:
            raise ValueError("buffer: expected at least one stored step; got none")
        return batch if interior_end else batch._replace(dones=None)

    def _evaluate_losses(self, batch: UpdateBatch) -> PPOLosses:
        with torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=self.config.amp_bf16
        ):
            ev = self.policy.evaluate(
                batch.states, batch.actions, batch.masks, batch.initial_hidden, batch.dones
            )
        # losses in float32, outside autocast: evaluate returns float32 outputs
        return ppo_losses(ev, batch, self.config)

    def _step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm)
        self.optimizer.step()


def _metrics(history: list[PPOLosses], stop_epoch: int) -> dict[str, float]:
    """Per-epoch 0-d tensors -> floats, read in one transfer. The first epoch's value loss
    and entropy (`first_value_loss`, `first_entropy`) are those of the policy before any
    step: the same whatever rounded differently in earlier epochs."""
    per_epoch = torch.stack([torch.stack(losses[1:]) for losses in history])  # [E, 5]
    # means over epochs, the last epoch's KL, the first epoch's value and entropy: [5+1+2]
    summary = torch.cat([per_epoch.mean(0), per_epoch[-1, 3:4], per_epoch[0, 1:3]])
    # host sync: the single read of all metrics, at the end of the update
    policy, value, entropy, _, clip_fraction, last_kl, first_value, first_entropy = (
        summary.tolist())
    epochs_run = len(history) - (1 if stop_epoch >= 0 else 0)
    return {
        "policy_loss": policy,
        "value_loss": value,
        "entropy": entropy,
        "approx_kl": last_kl,
        "clip_fraction": clip_fraction,
        "epochs_run": float(epochs_run),
        "early_stop_epoch": float(stop_epoch),
        "first_value_loss": first_value,
        "first_entropy": first_entropy,
    }
