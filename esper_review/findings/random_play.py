"""Whole episodes of one env under uniformly random masked actions: how the stability
findings (C1, C3) drive the env's optimizers through every seed lifecycle (germinate,
blend, fossilize, prune) without a trained policy.

The actions come from a generator seeded by the episode's seed, and the masks depend on
slot stages only, never on weights: the same seed gives the same actions under every
variant, so outcomes pair up by seed.
"""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES
from esper.env.environment import MorphoEnv


def random_masked_action(env: MorphoEnv, gen: torch.Generator) -> dict[str, int]:
    """Each head uniformly among the choices its mask allows (what `act` does with
    all-equal logits; `esper.training.evaluate.evaluate_random` draws the same way)."""
    masks = env.action_masks()
    return {h: int(torch.multinomial(masks[h].float(), 1, generator=gen)) for h in HEAD_NAMES}


def play_episode(env: MorphoEnv, seed: int) -> list[list[float]]:
    """One episode (`max_steps` epochs) of `env` from its current state, actions drawn
    from a generator seeded by `seed`. Returns each epoch's `[train_loss, val_loss,
    val_acc]` (nats, nats, fraction)."""
    gen = torch.Generator().manual_seed(seed)
    metrics = []
    for _ in range(env.config.max_steps):
        env.apply_action(random_masked_action(env, gen))
        epoch = env.launch_epoch().cpu()  # host sync: once per epoch, as the trainer's
        env.observe(epoch)
        metrics.append(epoch.tolist())
    return metrics
