"""esper: a recurrent, factored-action PPO in which each reviewed choice is a variant.

Its rooms, from the ground up (a room imports only rooms listed before it):

- `checks`, `host_view`: argument checks, and CPU tensor values read without an op;
- `gae/`: advantages, every method behind one `compute_gae` (B4-CR-03, B4-DRL-03);
- `variants`: the reviewed choices, one frozen dataclass every part reads;
- `agent/`: the action heads, the recurrent policy, its PPO update, the normalisers;
- `rollout/`: the rollout buffer and moving it to the update's device;
- `env/`: the synthetic morphogenetic environment, one noun per module;
- `training/`: the vectorized trainer, checkpoints, evaluation;
- `train`: the command, `python -m esper.train`.
"""
