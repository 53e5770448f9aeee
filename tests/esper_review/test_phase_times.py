"""Phase times on CUDA are device time beside host time (`esper.rollout.device_spans`).

Host wall time around a sync-free GAE measures its launches; its kernels run later and
their time lands in the update at its first sync. So on CUDA every phase is also timed by
a pair of CUDA events on the device's current stream, read after the iteration's final
sync. There is no GPU here: the CUDA API is a stand-in whose events read a simulated
device clock. That proves which ranges are timed, on which stream, that each end event
is waited on before `elapsed_time`, and how nested GAE is taken out of the update; it
cannot prove any duration (only a GPU run can). On the CPU, rows keep their host-only
fields.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from esper.agent.ppo import PPOConfig
from esper.env.config import EnvConfig
from esper.rollout.device_spans import DeviceSpans
from esper.training.trainer import PHASES, TrainConfig, VectorizedTrainer
from esper.variants import Variants
from esper_review.findings.e2e import phase_seconds


class SimulatedCuda:
    """`torch.cuda`'s `current_stream` and `Event` over a simulated device clock (ms).

    Each `record` stamps the event with the clock, then advances it by `tick_ms` (so a
    span's time counts the events recorded inside it). Like a real event, `elapsed_time`
    raises unless the end event has completed, i.e. been synchronized.
    """

    def __init__(self, tick_ms: float = 0.0) -> None:
        self.now_ms = 0.0
        self.tick_ms = tick_ms
        self.recorded_on: list[str] = []

    def current_stream(self, device):
        return f"current stream of {device}"

    def Event(self, enable_timing: bool = False):  # noqa: N802 (torch.cuda's name)
        assert enable_timing, "a timing event must be created with enable_timing=True"
        cuda = self

        class Event:
            stamp = None
            completed = False

            def record(self, stream):
                cuda.recorded_on.append(stream)
                self.stamp = cuda.now_ms
                cuda.now_ms += cuda.tick_ms

            def synchronize(self):
                self.completed = True

            def elapsed_time(self, end):
                if not end.completed:
                    raise RuntimeError("CUDA error: device not ready")
                return end.stamp - self.stamp

        return Event()


def test_device_spans_sum_per_name_on_the_current_stream():
    cuda = SimulatedCuda()
    spans = DeviceSpans("cuda:1", cuda=cuda)
    with spans.span("update"):
        cuda.now_ms += 5
        with spans.span("gae"):
            cuda.now_ms += 2
        cuda.now_ms += 1
    for ms in (3, 4):
        with spans.span("env_step"):
            cuda.now_ms += ms
    assert spans.seconds() == pytest.approx({"update": 8e-3, "gae": 2e-3, "env_step": 7e-3})
    assert set(cuda.recorded_on) == {"current stream of cuda:1"}
    spans.clear()
    assert spans.seconds() == {}


def test_a_span_ends_even_when_its_body_raises():
    cuda = SimulatedCuda()
    spans = DeviceSpans("cuda:0", cuda=cuda)
    with contextlib.suppress(KeyError), spans.span("update"):
        cuda.now_ms += 3
        raise KeyError("boom")
    assert spans.seconds() == pytest.approx({"update": 3e-3})


def test_on_the_cpu_nothing_is_recorded():
    spans = DeviceSpans("cpu", cuda=None)  # no CUDA API is touched
    with spans.span("gae"):
        pass
    assert not spans.enabled and spans.seconds() == {}


def small_trainer() -> VectorizedTrainer:
    config = TrainConfig(num_envs=2, max_steps=3, seed=0, variants=Variants.ours(),
                         env=EnvConfig(train_batches=1, batch_size=16, val_size=32),
                         hidden_dim=16, ppo=PPOConfig(update_epochs=1))
    return VectorizedTrainer(config, "cpu")


def on_simulated_cuda(trainer: VectorizedTrainer) -> SimulatedCuda:
    """Give the trainer's and its buffer's device spans the simulated CUDA API."""
    cuda = SimulatedCuda(tick_ms=1.0)
    trainer._device_spans = DeviceSpans("cuda:0", cuda=cuda)
    trainer.buffer._gae_spans = DeviceSpans("cuda:0", cuda=cuda)
    return cuda


def test_the_trainer_times_every_phase_on_the_device_and_takes_gae_out_of_the_update():
    trainer = small_trainer()
    on_simulated_cuda(trainer)
    stats = trainer.iteration()
    # 1 ms per event: a span with nothing recorded inside lasts 1 ms; the update's span
    # holds the GAE's two events (3 ms), less the GAE's own 1 ms
    assert stats.phase_device_seconds == pytest.approx({
        "policy_forward": 4e-3,  # 3 steps + the bootstrap value at the last one
        "env_step": 3e-3, "buffer_add": 3e-3, "gae": 1e-3, "update": 2e-3})
    assert set(stats.phase_device_seconds) == set(PHASES)
    assert "  device env_step=0.003s" in stats.line()


def test_on_the_cpu_the_trainer_and_the_e2e_rows_keep_host_time_only():
    trainer = small_trainer()
    stats = trainer.iteration()
    assert stats.phase_device_seconds == {}
    assert "device" not in stats.line()
    row = phase_seconds("x", {"trainers": {"x": trainer}, "last": {"x": stats}})
    assert set(row) == {f"phase_{p}_s" for p in PHASES} | {"gae_share"}
    assert row["phase_gae_s"] == stats.phase_seconds["gae"]


def test_e2e_rows_on_cuda_put_device_time_beside_host_time():
    trainer = small_trainer()
    on_simulated_cuda(trainer)
    trainer.env_streams = 2  # what a CUDA trainer records
    row = phase_seconds("x", {"trainers": {"x": trainer}, "last": {"x": trainer.iteration()}})
    assert {f"phase_{p}_device_s" for p in PHASES} | {"gae_share_device", "env_streams"} \
        <= set(row)
    assert row["phase_gae_device_s"] == pytest.approx(1e-3)
    device_total = sum(row[f"phase_{p}_device_s"] for p in PHASES)
    assert row["gae_share_device"] == pytest.approx(1e-3 / device_total)
    assert row["phase_gae_s"] > 0 and "gae_share" in row  # the host fields stay
    assert torch.isfinite(torch.tensor(row["gae_share"]))
