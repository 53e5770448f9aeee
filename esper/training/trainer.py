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

Reviewed choices of the vectorized-training review that act here, besides `sync`:
`env_pool` (H1: each rollout's envs recreated, or reset in place; `esper.env.pool`),
`masks` (H5: each env's masks built on the device and stacked per head, copied row by row
into pre-allocated tensors, or built on the host and moved in one packed transfer;
`esper.env.mask_batch`) and `bootstrap` (H4: per env a state tensor, a batch-1 forward and
a read, the same with a pre-allocated state buffer, or one packed batched forward;
`esper.env.bootstrap_states`). `scaler`, `seed_clip`, `stream_guard`, `accumulators` and
`validation` act inside each env.

`Variants.sync` decides the epoch boundary of the env phase on CUDA (`env_phase`); both
values train as esper-lite does, batches outer and envs inner, each env on its stream:
- `stream` (the original): the host synchronizes every env stream and reads each env's
  training results, then launches validation on the env streams, then synchronizes and
  reads again: 2N `stream.synchronize()` and 4N `.item()` per step, and every stream idle
  while the host reads.
- `event` (the review's H3 fix): each env stream records an event that the default
  stream waits on; validation runs on the default stream with no host wait; the host
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
from esper.checks import check_bool, check_choice, check_device, check_int
from esper.env.bootstrap_states import BootstrapStates
from esper.env.config import EnvConfig
from esper.env.mask_batch import MaskBatcher
from esper.env.pool import EnvBatches
from esper.env.vectorized import VectorizedMorphoEnv
from esper import gae
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
    return check_device("device", device)


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
        self.device = check_device("VectorizedTrainer: device", device)
        runs_on = gae.DEVICE_TYPES.get(config.variants.gae, ())
        if self.device.type not in runs_on:  # else it fails an iteration in, in the kernel
            raise ValueError(f"VectorizedTrainer: config.variants.gae: {config.variants.gae!r} "
                             f"runs on {', '.join(runs_on) or 'no device of this machine'}; "
                             f"got device {self.device.type}")
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
        """Run one epoch in every env; returns metrics `[N, 3]` float32 on the CPU
        (train_loss, val_loss, val_acc per env).

        On CUDA the epoch is esper-lite's (2df957ed src/esper/simic/training/
        vectorized.py:1155-1375): training batches in the outer loop and envs in the inner
        one, each env's batch on its own stream after that stream waits for the default
        stream (once before the batches and once per batch, as the original, whose shared
        iterator copies each batch on the default stream); then the epoch boundary of
        `Variants.sync` (`_validate_after_stream_syncs` or `_validate_after_events`).
        """
        if self.streams is None:
            launched = [env.launch_epoch() for env in self.envs.envs]
            start = time.perf_counter()
            metrics = torch.stack(launched).cpu()  # host sync: the one read of the step
            self._blocked_seconds += time.perf_counter() - start
            return metrics
        default = torch.cuda.current_stream(self.device)
        with record_function("env_train"):
            trained = self._launch_train(default)
        if self.config.variants.sync == "stream":
            return self._validate_after_stream_syncs(trained, default)
        return self._validate_after_events(trained, default)

    def _launch_train(self, default) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every env's training batches on its stream, batches outer and envs inner
        (vectorized.py:1162-1231); each env's `(train_loss, correct)` 0-d device tensors."""
        envs = self.envs.envs
        for stream in self.streams:
            # once before the batches, as the original (1162-1166), whose accumulators are
            # zeroed on the default stream (ours: on the env stream, in batch 0)
            stream.wait_stream(default)
        for b in range(self.config.env_config.train_batches):
            for env, stream in zip(envs, self.streams):
                stream.wait_stream(default)  # per env per batch, as the original (1188-1189)
                with torch.cuda.stream(stream):
                    env.launch_train_batch(b)
        trained = []
        for env, stream in zip(envs, self.streams):
            with torch.cuda.stream(stream):
                trained.append(env.train_metrics())
        return trained

    def _validate_after_stream_syncs(self, trained, default) -> torch.Tensor:
        """`sync=stream`, the original's epoch boundary: the host synchronizes every env
        stream and reads 2 values per env (vectorized.py:1233-1240), then launches
        validation on the env streams (1272-1311), then synchronizes and reads 2 values
        per env again (1368-1375). Every stream is idle from the end of its training until
        the host has read every env's training results and launched its validation."""
        envs = self.envs.envs
        with record_function("env_train_read"):
            start = time.perf_counter()
            for stream in self.streams:
                stream.synchronize()  # host sync: once per env after training, as the original
            # host sync: 2N reads, the loss and correct-count accumulators of each env (the
            # correct counts are the original's training accuracy, unused here)
            train_losses = [loss.item() for loss, _ in trained]
            _train_corrects = [correct.item() for _, correct in trained]
            self._blocked_seconds += time.perf_counter() - start
        with record_function("env_val"):
            for stream in self.streams:
                stream.wait_stream(default)  # before the validation batches (1272-1276)
            validated = []
            for env, stream in zip(envs, self.streams):
                stream.wait_stream(default)  # per env per validation batch (1301-1302)
                with torch.cuda.stream(stream):
                    validated.append(env.launch_val())
        with record_function("env_val_read"):
            start = time.perf_counter()
            for stream in self.streams:
                stream.synchronize()  # host sync: once per env after validation
            val_losses = [loss.item() for loss, _ in validated]  # host sync: N reads
            val_accs = [acc.item() for _, acc in validated]  # host sync: N reads
            self._blocked_seconds += time.perf_counter() - start
        return torch.tensor(list(zip(train_losses, val_losses, val_accs)), dtype=torch.float32)

    def _validate_after_events(self, trained, default) -> torch.Tensor:
        """`sync=event`, the review's H3 fix: an event recorded on each env stream after
        its training, the default stream waits on every event, and validation runs on
        the default stream; the host does not wait between training and validation and
        reads every env's results once, at the end."""
        with record_function("env_val"):
            events = []
            for stream in self.streams:
                event = torch.cuda.Event()
                event.record(stream)
                events.append(event)
            for event in events:
                # the review's `torch.cuda.current_stream().wait_event(event)`, on our device:
                # the device waits; the host does not
                default.wait_event(event)
            for loss, correct in trained:
                # made on an env stream, read on the default stream from here on
                loss.record_stream(default)
                correct.record_stream(default)
            validated = [env.launch_val() for env in self.envs.envs]  # on the default stream
        with record_function("env_read"):
            stacked = torch.stack([torch.stack([loss, correct, val_loss, val_acc])
                                   for (loss, correct), (val_loss, val_acc)
                                   in zip(trained, validated)])  # [N, 4]
            start = time.perf_counter()
            metrics = stacked.cpu()  # host sync: the single blocking read of the step
            self._blocked_seconds += time.perf_counter() - start
        return metrics[:, [0, 2, 3]]  # [N, 4] -> [N, 3]: train_loss, val_loss, val_acc

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
            # {head: [K]} each, on the device or the host as `masks` says
            per_env_masks = [env.action_masks(self.mask_batcher.source) for env in envs.envs]
            with self._phase("policy_forward"):
                masks = self.mask_batcher(per_env_masks)  # {head: [N, K]} on the device
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
                    # the carried state after this step, on the normalised next observation
                    # built from each env's features; the step's masks as the original
                    bootstrap = self.bootstrap_states(
                        [env.observation_features() for env in envs.envs],
                        self.normalizer.normalize, self.policy, out.hidden, masks)
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
