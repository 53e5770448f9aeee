"""The synthetic morphogenetic environment: a host network that grows seed modules,
and what the trainer needs to run many of them.

One environment, from the bottom up:

- `config`: `EnvConfig`, sizes and training settings;
- `task`: the synthetic classification task and the env's random streams;
- `initialization`: weights drawn from a generator;
- `blueprints`: the 13 seed modules a GERMINATE can grow;
- `seed_slot`: one slot's lifecycle stage, seed and blend weight;
- `host_network`: the host MLP with a slot after each hidden layer;
- `environment`: `MorphoEnv`, one env step = one host training epoch;
- `vectorized`: `VectorizedMorphoEnv`, N envs on one device.

Inside an env's epoch, each a reviewed choice: `optimizers` (host and seed SGD, grad
scalers, seed clipping), `accumulators` (per-epoch sums), `stream_guard` (inputs recorded
on the env's stream). Across envs, for the trainer: `pool` (each batch's envs recreated or
reset), `mask_batch` (one step's masks batched on the device) and `bootstrap_states` (the
bootstrap values at an episode's end).
"""
