"""The environments of each batch of episodes: recreated, or reset in place (review H1).

The reviewed system creates new envs for every batch of episodes (`create_env_state`:
host network, optimizers, CUDA stream), and drops the old ones: the allocator frees and
allocates every host's parameters again, and streams are made anew. The review proposes
"environment pooling where models are reset rather than recreated", with a sketch:
`reset_env_state` restores the host's weights from a checkpoint
(`env_state.model.reset_to_checkpoint()`) and resets the rest of the env's state.
`Variants.env_pool` picks `recreate` (the original), `checkpoint` (the review's sketch:
each env's host weights copied when it is made, restored by `load_state_dict` at each
reset) or `pool` (this project's: the weights drawn again in place, no copy kept). All
three start each batch from the same state: a reset env draws its seed generator (and,
in `pool`, its host's weights) from the same (seed, env index) streams a new env is
built from, and the data, drawn once, are shared by recreated envs as by pooled ones.
"""

from __future__ import annotations

import torch

from esper.checks import check_device
from esper.env.config import EnvConfig
from esper.env.vectorized import VectorizedMorphoEnv
from esper.variants import Variants


class EnvBatches:
    """Hands out the envs (and, on CUDA, their streams) of each new batch of episodes.

    `streams` is a function `(num_envs, device) -> list of streams` called for each set
    of envs built (None on the CPU: no streams); `envs` and `env_streams` are the
    current batch's.
    """

    def __init__(self, config: EnvConfig, device: torch.device | str,
                 variants: Variants | None = None, make_streams=None) -> None:
        self.config = config
        self.device = check_device("EnvBatches: device", device)
        self.variants = variants if variants is not None else Variants.original()
        self.mode = self.variants.env_pool
        self._make_streams = make_streams
        self.envs = VectorizedMorphoEnv(config, self.device, self.variants)
        self.streams: list | None = None
        self._attach_streams()
        self._fresh = True  # built just now: the first batch needs no reset
        # the review's checkpoint: each env's host weights as made (copies, kept)
        self._checkpoints = ([{name: t.detach().clone() for name, t in
                               env.host_network.state_dict().items()} for env in self.envs.envs]
                             if self.mode == "checkpoint" else None)

    def next_batch(self) -> tuple[VectorizedMorphoEnv, torch.Tensor]:
        """The envs of a new batch, at their episode's start, and their observations
        `[N, obs_dim]` f32 CPU: new envs (`recreate`) or the same ones reset (`pool`,
        `checkpoint`)."""
        if self._fresh:
            self._fresh = False
            return self.envs, self.envs.observations()
        if self.mode == "pool":
            return self.envs, self.envs.reset()
        if self.mode == "checkpoint":
            return self.envs, self.envs.reset(self._checkpoints)
        tasks = self.envs.tasks  # the data are drawn once and shared
        self.envs = VectorizedMorphoEnv(self.config, self.device, self.variants, tasks)
        self._attach_streams()
        return self.envs, self.envs.observations()

    def _attach_streams(self) -> None:
        if self._make_streams is None:
            return
        self.streams = self._make_streams(len(self.envs.envs), self.device)
        for env, stream in zip(self.envs.envs, self.streams):
            env.stream = stream
