"""The agent: the factored action space, the recurrent actor-critic, its PPO update and
the normalisers of its observations and rewards.

- `heads`: the 8 action heads, their sizes, and which heads each op uses;
- `policy`: `FactoredRecurrentActorCritic`, one LSTM trunk, 8 masked heads, a value head;
- `ppo`: `PPOConfig` and `PPOAgent`, the update over a whole rollout;
- `observation_normalizer`: running mean / std of observations (esper-lite's EMA, or Welford);
- `reward_normalizer`: esper-lite's reward normaliser, rewards over their running std.
"""
