"""The bootstrap at an episode's end, per `Variants.bootstrap` (esper.env.bootstrap_states),
held to esper-lite's code: a transcription of its lines, compared on values and counts."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from esper.agent.heads import HEAD_SIZES
from esper.agent.observation_normalizer import EmaNormalizer
from esper.agent.policy import FactoredRecurrentActorCritic
from esper.env.bootstrap_states import MODES, BootstrapStates

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
N, D, H = 3, 11, 16


@pytest.fixture(scope="module")
def episode_end() -> dict:
    """What a trainer holds at an episode's end: features as lists, a normaliser with
    statistics, a policy, the carried LSTM state [1, N, H] and the step's masks [N, K]."""
    g = torch.Generator().manual_seed(0)
    normalizer = EmaNormalizer(D)
    normalizer.update(3.0 * torch.randn(32, D, generator=g) - 1.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = FactoredRecurrentActorCritic(D, H, validate_masks=False)
    masks = {}
    for head, k in HEAD_SIZES.items():
        mask = torch.rand(N, k, generator=g) < 0.5
        mask[:, -1] = True
        masks[head] = mask
    return {"features": torch.randn(N, D, generator=g).tolist(),
            "normalizer": normalizer, "normalize": normalizer.normalize, "policy": policy,
            "hidden": (torch.randn(1, N, H, generator=g), torch.randn(1, N, H, generator=g)),
            "masks": masks}


def original_bootstrap(all_post_action_features, obs_normalizer, agent_network, hidden,
                       masks_batch, device) -> torch.Tensor:
    """esper-lite's per-env bootstrap, 2df957ed src/esper/simic/training/vectorized.py:
    1954-1973, transcribed. The env loop (1655) is the `for`; `agent.network.get_action`
    is our policy's `act(..., deterministic=True)` (LSTM and every head, 8 here, 4 there),
    which takes the masks as a dict; `env_state.lstm_hidden` is env i's `[L, 1, H]` slice
    of the carried state (vectorized.py:1627-1631)."""
    bootstrap_values = []
    for env_idx, post_action_features in enumerate(all_post_action_features):
        lstm_hidden = tuple(t[:, env_idx:env_idx + 1, :].contiguous() for t in hidden)
        # Normalize and get value from critic
        post_action_state = torch.tensor(
            [post_action_features], dtype=torch.float32, device=device
        )
        post_action_normalized = obs_normalizer.normalize(post_action_state)

        # Extract env-specific masks for bootstrap value computation
        env_masks = {key: masks_batch[key][env_idx] for key in masks_batch}

        # Get V(s_{t+1}) - use updated LSTM hidden state from this step
        with torch.inference_mode():
            bootstrap_tensor = agent_network.act(
                post_action_normalized,
                {key: mask.unsqueeze(0) for key, mask in env_masks.items()},
                lstm_hidden,
                deterministic=True,
            ).value
            bootstrap_value = bootstrap_tensor[0].item()
        bootstrap_values.append(bootstrap_value)
    return torch.tensor(bootstrap_values)


def reads_and_forwards(call) -> tuple[object, dict[str, int]]:
    """`call()`'s result, and its host reads (`.item()`) and policy forwards (LSTM calls)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = call()
    counts = {e.key: e.count for e in prof.key_averages()}
    return result, {"reads": counts.get("aten::_local_scalar_dense", 0),
                    "forwards": counts.get("aten::lstm", 0)}


def bootstrap(mode: str, inputs: dict) -> torch.Tensor:
    states = BootstrapStates(N, D, CPU, mode)
    return states(*(inputs[k] for k in ("features", "normalize", "policy", "hidden", "masks")))


def test_the_original_path_gives_the_transcribed_values_with_n_reads_and_n_forwards(episode_end):
    reference, reference_counts = reads_and_forwards(lambda: original_bootstrap(
        episode_end["features"], episode_end["normalizer"], episode_end["policy"],
        episode_end["hidden"], episode_end["masks"], CPU))
    values, counts = reads_and_forwards(lambda: bootstrap("tensor", episode_end))
    assert values.dtype == torch.float32 and values.shape == (N,)
    assert torch.equal(values, reference)
    assert counts == reference_counts == {"reads": N, "forwards": N}


def test_the_review_s_buffer_gives_the_same_values_from_buffers_allocated_once(episode_end):
    states = BootstrapStates(N, D, CPU, "copy")
    args = [episode_end[k] for k in ("features", "normalize", "policy", "hidden", "masks")]
    buffers = [b.data_ptr() for b in states._buffers]
    values, counts = reads_and_forwards(lambda: states(*args))
    assert torch.equal(values, bootstrap("tensor", episode_end))
    assert counts == {"reads": N, "forwards": N}  # the review's fix keeps both
    assert [b.data_ptr() for b in states._buffers] == buffers
    for buffer, row in zip(states._buffers, episode_end["features"]):
        assert buffer.shape == (1, D) and buffer[0].tolist() == pytest.approx(row)


def test_packed_is_one_forward_of_the_value_head_and_one_read(episode_end):
    values, counts = reads_and_forwards(lambda: bootstrap("packed", episode_end))
    # one batched forward and one `.cpu()` (not a value read on the CPU: a sync on CUDA)
    assert counts == {"reads": 0, "forwards": 1}
    # a batch-N and N batch-1 forwards round differently
    torch.testing.assert_close(values, bootstrap("tensor", episode_end), rtol=0, atol=1e-6)


def test_bootstrap_checks_its_mode_and_the_number_of_envs(episode_end):
    assert MODES == ("tensor", "copy", "packed")
    with pytest.raises(ValueError, match="BootstrapStates: mode: expected one of tensor, copy, "
                                         "packed; got 'batched'"):
        BootstrapStates(N, D, CPU, "batched")
    with pytest.raises(ValueError, match="expected the features of 3 envs; got 2"):
        BootstrapStates(N, D, CPU, "tensor")(episode_end["features"][:2], None, None, None, None)
