"""Training runs: the vectorized PPO loop, checkpoints, evaluation.

- `trainer`: `TrainConfig` and `VectorizedTrainer`, rollout over N envs then PPO update;
- `checkpoint`: save and resume a trainer;
- `evaluate`: held-out returns of a policy, and a whole run from a seed.

The command line is `python -m esper.train` (`esper/train.py`).
"""
