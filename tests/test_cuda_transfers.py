"""Host-to-device traffic and stream sharing that only cost anything on CUDA, checked here.

`meta` tensors stand in for a second device: a copy to them is a real `aten::_to_copy`
from a CPU tensor, counted by a dispatch mode, so the number and shape of transfers per
call are proven without a GPU (their time is not). Stream-pool sharing is checked with a
stand-in stream factory that hands out streams as PyTorch's pool does (32 per device and
priority, in turn); only a GPU run shows the serialization it causes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.env.mask_batch import masks_to_device
import esper.training.trainer as trainer_module
from esper.training.trainer import STREAM_POOL_SIZE, make_env_streams
from harness import findings as registry
from harness.findings import Case

META = torch.device("meta")


class HostToDevice(TorchDispatchMode):
    """Records the shape of every copy from a CPU tensor to another device."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu"
                and out.device.type != "cpu"):
            self.copies.append(tuple(args[0].shape))
        return out


def host_masks(num_envs: int) -> dict[str, torch.Tensor]:
    return {h: torch.rand(num_envs, k) < 0.5 for h, k in HEAD_SIZES.items()}


def test_a_step_of_masks_reaches_the_device_in_one_transfer():
    masks = host_masks(5)
    total = sum(HEAD_SIZES.values())
    with HostToDevice() as log:
        moved = masks_to_device(masks, META)
    assert log.copies == [(5, total)]
    assert list(moved) == list(masks)
    offset = 0
    for head, mask in moved.items():  # views of the one copy, heads side by side in order
        k = HEAD_SIZES[head]
        assert (mask.device, mask.dtype, tuple(mask.shape)) == (META, torch.bool, (5, k))
        assert (mask.storage_offset(), mask.stride()) == (offset, (total, 1))
        offset += k


def test_masks_already_on_the_device_are_not_copied():
    masks = host_masks(3)
    with HostToDevice() as log:
        moved = masks_to_device(masks, "cpu")
    assert log.copies == []
    assert all(moved[h] is masks[h] for h in HEAD_NAMES)


@pytest.mark.parametrize("variant", ["none", "checked"])
def test_audit_5_1_times_the_mask_transfer_of_every_step(variant):
    """On a device, the finding's rollout moves each step's masks from the host once, as
    the trainer does (B4-PT-05 timed this rollout before it timed the update's read)."""
    finding = registry.select(["AUDIT-5.1-add-checks"])[0]
    case = Case.of(num_envs=2, max_steps=3)
    call = finding.make_call(variant, finding.build(case, META, seed=0))
    with HostToDevice() as log:
        call()
    masks_shape = (2, sum(HEAD_SIZES.values()))
    assert [shape for shape in log.copies if shape == masks_shape] == [masks_shape] * 3


class PooledStreams:
    """Hands out streams as `torch.cuda.Stream()` does: from a pool of 32, in turn."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device):
        class Stream:
            cuda_stream = 0x7000 + self.calls % STREAM_POOL_SIZE

        self.calls += 1
        return Stream()


def test_more_envs_than_the_stream_pool_warn_once_and_count_distinct_streams(monkeypatch):
    monkeypatch.setattr(trainer_module, "_warned_shared_streams", False)
    with pytest.warns(RuntimeWarning, match=r"40 envs share 32 CUDA streams on cuda:0: "
                                            r"torch.cuda.Stream\(\) cycles through a pool of 32"):
        streams, distinct = make_env_streams(40, torch.device("cuda:0"), PooledStreams())
    assert (len(streams), distinct) == (40, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_env_streams(33, torch.device("cuda:0"), PooledStreams())[1] == 32


def test_up_to_the_pool_size_every_env_has_its_own_stream(monkeypatch):
    monkeypatch.setattr(trainer_module, "_warned_shared_streams", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        streams, distinct = make_env_streams(32, torch.device("cuda:0"), PooledStreams())
    assert distinct == 32
