"""The synthetic morphogenetic environment, and what the trainer needs to run many of them.

- `environment`: the host network, its seed slots and the environment itself;
- inside an env's epoch, each a reviewed choice: `optimizers`, `accumulators`,
  `stream_guard`;
- across envs, for the trainer: `pool`, `mask_batch`, `bootstrap_states`.
"""
