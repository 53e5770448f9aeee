"""The vectorized PPO loop: rollout over N envs (one CUDA stream each), GAE, update.

One iteration, read top to bottom (`VectorizedTrainer.iteration`):

    reset envs and the LSTM state
    for each of max_steps steps:
        policy_forward  one batched act() for all envs on normalised observations
        (bookkeeping)   actions to the host, applied to each env's host network
        env_step        each env trains one epoch on its own CUDA stream; sync by variant
        (bookkeeping)   rewards normalised online, env by env (esper-lite's reward normaliser)
        policy_forward  at the last step: bootstrap values with the carried LSTM state
        buffer_add      one add() per env
    observation normaliser update (frozen during the rollout), then PPO update (gae, update)

Each phase runs inside a `torch.profiler.record_function` range of that name, so a
profiler attributes time to it, and its host wall time is summed per iteration. On CUDA
its device time is summed too (`esper.rollout.device_spans`): the host time of a phase that
launches work without waiting for it (scan, compiled or Triton GAE) counts launches, and
its kernels' time would otherwise land in the next phase that syncs.

Each step's action masks reach the device in one transfer (`esper.env.mask_batch`) that both
the policy and the buffer read, instead of one blocking copy per head and env.

Reviewed choices of the vectorized-training review that act here, besides `sync`:
`env_pool` (H1: each rollout's envs recreated, or reset in place; `esper.env.pool`),
`masks` (H5: each step's masks stacked anew, or written into pre-allocated tensors) and
`bootstrap` (H4: the bootstrap states made as new tensors, or copied into a pre-allocated
buffer). `scaler`, `seed_clip`, `stream_guard` and `accumulators` act inside each env.

`Variants.sync` decides how the env phase waits for the env streams on CUDA:
- `stream` (the original): the host blocks on `stream.synchronize()` once per env before
  reading that env's metrics.
- `event`: each env stream records an event that the default stream waits on; the host
  blocks once, when it reads all metrics together.
On the CPU there are no streams: both values run the same code. `torch.cuda.Stream()`
hands out streams round-robin from a pool of `STREAM_POOL_SIZE` per device and priority:
above that many envs, envs share streams (and serialize); the trainer warns once and
records the distinct count in `env_streams`.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.profiler import record_function

from esper.agent.heads import HEAD_NAMES
from esper.agent.observation_normalizer import OBS_NORMALIZERS, make_obs_normalizer
from esper.agent.policy import FactoredRecurrentActorCritic
from esper.agent.ppo import PPOAgent, PPOConfig
from esper.agent.reward_normalizer import RewardNormalizer
from esper.checks import check_bool, check_choice, check_int
from esper.env.bootstrap_states import BootstrapStates
from esper.env.config import EnvConfig
from esper.env.mask_batch import MaskBatcher
from esper.env.pool import EnvBatches
from esper.env.vectorized import VectorizedMorphoEnv
from esper.rollout.buffer import RolloutBuffer
from esper.rollout.device_spans import DeviceSpans
from esper.variants import Variants

PHASES = ("env_step", "policy_forward", "buffer_add", "gae", "update")
#: CUDA streams per device and priority in PyTorch's pool (c10/cuda/CUDAStream.cpp);
#: `torch.cuda.Stream()` cycles through them.
STREAM_POOL_SIZE = 32
_warned_shared_streams = False

#: How an episode's end at `max_steps` is stored (see `TrainConfig.time_limit`).
TIME_LIMITS = ("truncated", "terminal")


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without CUDA is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device: expected auto, cpu or cuda; got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for, but torch.cuda.is_available() is False")
    return torch.device(device)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (what a resumed run must match).

    Each field names esper-lite's value and where it is set (`leyline` is
    `src/esper/leyline/__init__.py`); `tests/esper/test_original_defaults.py` holds every
    default to its original and lists the ones that differ on purpose.
    """

    num_envs: int = 4
    """Parallel environments, one rollout row each. Original: `4`,
    src/esper/leyline/__init__.py:71 @599f3895 (DEFAULT_N_ENVS)."""
    max_steps: int = 25
    """Steps (host epochs) per episode; one episode per env per iteration (see time_limit).
    Original: `25`, src/esper/leyline/__init__.py:61 @599f3895 (DEFAULT_EPISODE_LENGTH:
    max_epochs, max_steps_per_env and chunk_length)."""
    seed: int = 0
    """Seeds policy init, action sampling and the environments. Original: `42`,
    src/esper/simic/training/config.py:115 @599f3895 (and train_ppo_vectorized's default,
    vectorized.py:491). Differs on purpose: a seed picks data, not behaviour; every run,
    baseline and number recorded in this repository was made with 0, and 42 would change
    them all without changing what is measured."""
    variants: Variants = field(default_factory=Variants.original)
    """The reviewed choices (GAE method, reset, step_counts, stream sync, ...).
    Original: none: the axes are this project's; `Variants.original()`, the default,
    is the reviewed code's choice on every axis."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters. Original: none: a `PPOConfig`, whose fields cite theirs."""
    env: EnvConfig | None = None
    """Environment sizes; None: `EnvConfig` defaults with this num_envs, max_steps and seed.
    Original: none: the synthetic environment stands in for esper-lite's CIFAR-10 host
    (esper/env); `EnvConfig` cites the options that reproduce the original's."""
    hidden_dim: int = 128
    """LSTM hidden size of the policy. Original: `128`,
    src/esper/leyline/__init__.py:66 @599f3895 (DEFAULT_LSTM_HIDDEN_DIM, one LSTM layer)."""
    time_limit: str = "truncated"
    """How the last step of an episode (always cut at `max_steps`) is stored.
    `truncated` (the reviewed system's behaviour): a truncation, bootstrapping from
    V(s_T) computed with the carried LSTM state, although the value head is never
    trained on s_T. `terminal`: a true terminal, no bootstrap (and no bootstrap forward):
    the observation holds the epoch counter, so the time limit is part of the task.
    Original: `"truncated"`, src/esper/simic/training/vectorized.py:1906 @2df957ed
    (`truncated = done`, every episode ends at max_epochs)."""
    obs_normalizer: str = "ema"
    """How observations are normalised (`esper.agent.observation_normalizer`): `ema`,
    esper-lite's exponential moving average (momentum 0.99, float32 on the device, eps
    1e-4, clip 10), or `welford`, full-history statistics in float64 (this project's
    earlier choice). Either is frozen during a rollout and updated after it from the
    observations the actions were taken on. Original: `"ema"`,
    src/esper/simic/training/vectorized.py:551 @2df957ed (`RunningMeanStd((state_dim,),
    device=device, momentum=0.99)`, updated from each batch's raw states at 1574)."""
    reward_normalizer: bool = True
    """Store each reward divided by the running std of every reward so far, clipped to
    +-10 (`esper.agent.reward_normalizer`), normalised online as the rollout produces
    them; reported returns stay raw. False: store raw rewards. Original: `True`,
    src/esper/simic/training/vectorized.py:555 @2df957ed (`RewardNormalizer(clip=10.0)`,
    applied to every reward at 1899)."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "max_steps"):
            check_int(f"TrainConfig.{name}", getattr(self, name))
        check_choice("TrainConfig.time_limit", self.time_limit, TIME_LIMITS)
        check_choice("TrainConfig.obs_normalizer", self.obs_normalizer, OBS_NORMALIZERS)
        check_bool("TrainConfig.reward_normalizer", self.reward_normalizer)

    @property
    def env_config(self) -> EnvConfig:
        base = self.env if self.env is not None else EnvConfig()
        return dataclasses.replace(base, num_envs=self.num_envs, max_steps=self.max_steps,
                                   seed=self.seed)

    def identity(self) -> dict:
        """The fields a checkpoint must agree on to be resumed (variants excluded: they
        change speed, not results)."""
        return {
            "num_envs": self.num_envs,
            "max_steps": self.max_steps,
            "seed": self.seed,
            "hidden_dim": self.hidden_dim,
            "time_limit": self.time_limit,
            "obs_normalizer": self.obs_normalizer,
            "reward_normalizer": self.reward_normalizer,
            "ppo": dataclasses.asdict(self.ppo),
            "env": dataclasses.asdict(self.env_config),
        }


@dataclass
class IterationStats:
    """What one iteration did: mean episode return, update metrics, seconds per phase."""

    iteration: int
    mean_return: float
    update: dict[str, float]
    phase_seconds: dict[str, float]
    """Host wall seconds per phase (`update` without the `gae` inside it)."""
    host_blocked_seconds: float
    """Host time spent waiting for env streams (synchronize / metric reads) in env_step."""
    phase_device_seconds: dict[str, float] = field(default_factory=dict)
    """On CUDA, device-timeline seconds per phase (`esper.rollout.device_spans`; `update` without
    `gae`); empty on the CPU, where host and device time are one."""

    def line(self) -> str:
        phases = " ".join(f"{p}={self.phase_seconds.get(p, 0.0):.3f}s" for p in PHASES)
        if self.phase_device_seconds:
            phases += "  device " + " ".join(
                f"{p}={self.phase_device_seconds.get(p, 0.0):.3f}s" for p in PHASES)
        u = self.update
        return (f"iter {self.iteration:4d}  return {self.mean_return:+.4f}  "
                f"pi {u['policy_loss']:+.4f}  v {u['value_loss']:.4f}  "
                f"ent {u['entropy']:.3f}  kl {u['approx_kl']:.4f}  {phases}")


def make_env_streams(num_envs: int, device: torch.device, make_stream=None) -> tuple[list, int]:
    """One CUDA stream per env from `make_stream(device=...)` (default `torch.cuda.Stream`),
    and how many of them are distinct.

    PyTorch's pool gives out `STREAM_POOL_SIZE` streams per device and priority in turn, so
    above that many envs some share a stream; that is warned about once per process.
    """
    global _warned_shared_streams
    make_stream = torch.cuda.Stream if make_stream is None else make_stream
    streams = [make_stream(device=device) for _ in range(num_envs)]
    distinct = len({stream.cuda_stream for stream in streams})
    if distinct < num_envs and not _warned_shared_streams:
        _warned_shared_streams = True
        warnings.warn(
            f"{num_envs} envs share {distinct} CUDA streams on {device}: torch.cuda.Stream() "
            f"cycles through a pool of {STREAM_POOL_SIZE} streams per device and priority, "
            "so envs on one stream run one after another; use at most "
            f"{STREAM_POOL_SIZE} envs per device for a stream each",
            RuntimeWarning, stacklevel=2,
        )
    return streams, distinct


class VectorizedTrainer:
    """Owns the envs, policy, PPO agent, buffer and normaliser of one run."""

    def __init__(self, config: TrainConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        torch.manual_seed(config.seed)
        self.streams: list | None = None
        self.env_streams: int | None = None
        """Distinct CUDA streams the envs run on (None on the CPU)."""
        on_cuda = self.device.type == "cuda"
        self.env_batches = EnvBatches(config.env_config, self.device, config.variants,
                                      self._new_streams if on_cuda else None)
        obs_dim = self.envs.obs_dim
        self.policy = FactoredRecurrentActorCritic(obs_dim, hidden_dim=config.hidden_dim)
        self.agent = PPOAgent(self.policy, config.ppo, self.device)
        self.buffer = RolloutBuffer(
            config.num_envs, config.max_steps, obs_dim, lstm_hidden_dim=config.hidden_dim,
            num_lstm_layers=self.policy.lstm_layers, device=self.device, variants=config.variants,
        )
        self.normalizer = make_obs_normalizer(config.obs_normalizer, obs_dim, self.device)
        self.reward_normalizer = RewardNormalizer() if config.reward_normalizer else None
        self.sampler = torch.Generator(device=self.device).manual_seed(config.seed)
        self.mask_batcher = MaskBatcher(config.num_envs, self.device, config.variants.masks)
        self.bootstrap_states = BootstrapStates(config.num_envs, obs_dim, self.device,
                                                config.variants.bootstrap)
        self.hidden = self.policy.initial_hidden(config.num_envs, self.device)
        self.iteration_count = 0
        self._phase_seconds: dict[str, float] = defaultdict(float)
        self._device_spans = DeviceSpans(self.device)
        self._blocked_seconds = 0.0

    @property
    def envs(self) -> VectorizedMorphoEnv:
        """The current batch's envs (`esper.env.pool.EnvBatches`)."""
        return self.env_batches.envs

    def _new_streams(self, num_envs: int, device: torch.device) -> list:
        self.streams, self.env_streams = make_env_streams(num_envs, device)
        return self.streams

    # ------------------------------------------------------------------ phases

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with record_function(name), self._device_spans.span(name):
            yield
        self._phase_seconds[name] += time.perf_counter() - start

    def env_phase(self) -> torch.Tensor:
        """Run one epoch in every env; returns metrics [N, 3] on the CPU.

        On CUDA each env's epoch is enqueued on its own stream, after that stream waits for
        the default stream (where actions changed the host networks).
        """
        if self.streams is None:
            launched = [env.launch_epoch() for env in self.envs.envs]
            start = time.perf_counter()
            metrics = torch.stack(launched).cpu()
            self._blocked_seconds += time.perf_counter() - start
            return metrics
        default = torch.cuda.current_stream(self.device)
        launched = []
        for env, stream in zip(self.envs.envs, self.streams):
            stream.wait_stream(default)
            with torch.cuda.stream(stream):
                launched.append(env.launch_epoch())
        if self.config.variants.sync == "stream":
            return self._read_after_stream_syncs(launched)
        return self._read_after_events(launched, default)

    def _read_after_stream_syncs(self, launched: list[torch.Tensor]) -> torch.Tensor:
        rows = []
        for stream, metrics in zip(self.streams, launched):
            start = time.perf_counter()
            stream.synchronize()  # host sync: once per env, as the original
            rows.append(metrics.cpu())
            self._blocked_seconds += time.perf_counter() - start
        return torch.stack(rows)

    def _read_after_events(self, launched: list[torch.Tensor], default) -> torch.Tensor:
        for stream, metrics in zip(self.streams, launched):
            done = torch.cuda.Event()
            done.record(stream)
            default.wait_event(done)  # the device waits; the host does not
            metrics.record_stream(default)  # used on the default stream from here on
        stacked = torch.stack(launched)  # [N, 3] on the default stream, after every event
        start = time.perf_counter()
        metrics = stacked.cpu()  # host sync: the single blocking read of the step
        self._blocked_seconds += time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ rollout

    def rollout(self) -> float:
        """Fill the buffer with one episode per env; returns the mean episode return.

        Each row is one episode, so the LSTM state is reset only here, at the row's start
        (a rollout running several episodes per row would zero an env's state after
        storing its done step, as `FactoredRecurrentActorCritic.evaluate` assumes)."""
        n, steps = self.config.num_envs, self.config.max_steps
        self.buffer.reset()
        envs, obs = self.env_batches.next_batch()  # new or reset envs; obs [N, D] raw, CPU
        seen = [obs]
        self.hidden = self.policy.initial_hidden(n, self.device)
        returns = torch.zeros(n)
        for t in range(steps):
            norm_obs = self.normalizer.normalize(obs).to(self.device)
            per_env_masks = [env.action_masks() for env in envs.envs]  # {head: [K]} CPU each
            with self._phase("policy_forward"):
                # {head: [N, K]}, to the device in one transfer, read by act() and add()
                masks = self.mask_batcher(per_env_masks)
                out = self.policy.act(norm_obs, masks, self.hidden, generator=self.sampler)
                # host sync: actions, log-probs and values in one transfer
                packed = torch.stack(
                    [out.actions[h].float() for h in HEAD_NAMES]
                    + [out.log_probs[h] for h in HEAD_NAMES] + [out.value]
                ).cpu()  # [17, N]
            actions = packed[: len(HEAD_NAMES)].long().T.tolist()  # [N][8]
            for env, row in zip(envs.envs, actions):
                env.apply_action(dict(zip(HEAD_NAMES, row)))
            with self._phase("env_step"):
                metrics = self.env_phase()
            results = [env.observe(row) for env, row in zip(envs.envs, metrics)]
            next_obs = torch.stack([o for o, _ in results])
            rewards = [r for _, r in results]
            returns += torch.tensor(rewards)  # raw: what the episode earned
            if self.reward_normalizer is not None:  # stored normalised, env by env
                rewards = [self.reward_normalizer.update_and_normalize(r) for r in rewards]
            seen.append(next_obs)
            last = t == steps - 1
            truncated = last and self.config.time_limit == "truncated"
            bootstrap = torch.zeros(n)
            if truncated:
                with self._phase("policy_forward"):
                    # the carried state after this step, on the normalised next observation,
                    # built on the device from each env's features as the reviewed system
                    raw = self.bootstrap_states([env.observation_features() for env in envs.envs])
                    bootstrap = self.policy.value(self.normalizer.normalize(raw), out.hidden).cpu()
            with self._phase("buffer_add"):
                self._add_step(norm_obs, packed, rewards, masks, last, truncated, bootstrap)
            self.hidden = out.hidden
            obs = next_obs
        # after the rollout (frozen during it), from the observations the actions were
        # taken on, as esper-lite's (vectorized.py:1574): the final one only bootstraps
        self.normalizer.update(torch.cat(seen[:-1]))
        return float(returns.mean())

    def _add_step(self, obs, packed, rewards, masks, last, truncated, bootstrap) -> None:
        """obs [N, D] normalised, on the device: the observations the actions were sampled on;
        masks {head: [N, K]} on the device, so that add() copies device to device."""
        heads = len(HEAD_NAMES)
        h, c = self.hidden
        per_env = packed.T.tolist()  # [17, N] -> [N][17]
        boot = bootstrap.tolist()
        for i, row in enumerate(per_env):
            self.buffer.add(
                i,
                obs[i],
                actions={hd: int(row[k]) for k, hd in enumerate(HEAD_NAMES)},
                log_probs={hd: row[heads + k] for k, hd in enumerate(HEAD_NAMES)},
                value=row[2 * heads],
                reward=rewards[i],
                done=last,
                masks={hd: m[i] for hd, m in masks.items()},
                hidden_h=h[:, i : i + 1],  # [L, N, H] -> [L, 1, H]
                hidden_c=c[:, i : i + 1],
                truncated=truncated,
                bootstrap_value=boot[i],
            )

    # ------------------------------------------------------------------ iteration

    def iteration(self) -> IterationStats:
        """One rollout and one PPO update."""
        self._phase_seconds = defaultdict(float)
        self._device_spans.clear()
        self._blocked_seconds = 0.0
        mean_return = self.rollout()
        start = time.perf_counter()
        # ranges "gae" and "update" inside; a device span here, not a second "update" range
        with self._device_spans.span("update"):
            update = self.agent.update(self.buffer)  # ends with a host sync (its metrics)
        gae_seconds = self.buffer.last_gae_seconds
        self._phase_seconds["gae"] += gae_seconds
        self._phase_seconds["update"] += time.perf_counter() - start - gae_seconds
        device_seconds = self._device_spans.seconds()  # after the update's sync: no wait
        if device_seconds:
            device_seconds["gae"] = self.buffer.last_gae_device_seconds
            device_seconds["update"] -= device_seconds["gae"]
        self.iteration_count += 1
        return IterationStats(
            iteration=self.iteration_count,
            mean_return=mean_return,
            update=update,
            phase_seconds=dict(self._phase_seconds),
            host_blocked_seconds=self._blocked_seconds,
            phase_device_seconds=device_seconds,
        )
