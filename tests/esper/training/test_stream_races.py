"""The trainer's per-env stream ordering, checked for races by PyTorch's CUDA Sanitizer logic.

`torch.cuda._sanitizer` (CSAN) finds unsynchronized accesses between CUDA streams with
vector clocks per stream and event (`EventHandler`) over the storages each op reads and
writes (`ArgumentHandler`, from the op's schema). This machine has no GPU, so the test
drives that same analysis from the outside, over a real rollout on CPU tensors:

- a `TorchDispatchMode` records every real aten op, the storages it reads and writes and
  the stand-in stream it was issued on (CSAN's own mode looks at CUDA tensors only);
- stand-in `Stream` / `Event` objects and `torch.cuda.stream(...)` / `current_stream` /
  `Event` / `synchronize`, installed only inside the test (pytest's monkeypatch), feed
  record, wait_event, wait_stream, synchronize and query to the `EventHandler`;
- `.cpu()`, `.tolist()`, `.numpy()` and value reads (`aten::_local_scalar_dense`, behind
  `.item()`, `float(t)`, `bool(t)`, or `aten::item` itself for an inference tensor) are a
  read on the current stream followed by a host sync of that stream, as a blocking
  device-to-host copy is on CUDA;
- a storage's history ends when it is freed (the caching allocator's job on CUDA).

A full rollout of the trainer (3 envs, 4 steps) must report no race with `sync=stream`
(esper-lite's epoch: host syncs after training, validation on the env streams) or
`sync=event` (the review's H3 fix: validation on the default stream after it waits on one
event per env stream), and each of the faults planted in the trainer's ordering (by
overriding one of its methods on the test's trainer object: a missing `wait_event`,
`synchronize` or `wait_stream`) must be reported. The stand-ins also count one env step's
stream synchronizes, host reads and waits per variant.

What this cannot check: whether the caching allocator reuses a block while another
stream still reads it (`record_stream`), blocking host-to-device copies (not modelled:
their syncs would only add ordering, so the check is stricter than a GPU), the kernels
themselves, timing and overlap, and more than one device. Only a GPU run shows those.

Cost: about 40 s of CPU time for the six rollouts (each op goes through Python twice).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import types
import weakref

import pytest
import torch
from torch.cuda._sanitizer import (
    DEFAULT_STREAM_ID,
    ArgumentHandler,
    EventHandler,
    FACTORY_FUNCTION_REGEX,
    UnsynchronizedAccessError,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from esper.env.config import EnvConfig
from esper.env.seed_slot import Stage
from esper.training.trainer import TrainConfig, VectorizedTrainer
from esper.variants import Variants

#: CUDA Sanitizer analysis (torch.cuda._sanitizer) of real rollouts on stand-in streams
pytestmark = pytest.mark.integration

aten = torch.ops.aten


def storage_key(tensor: torch.Tensor) -> int | None:
    """The storage a tensor's data lives in (views share it); None when it holds no data."""
    pointer = tensor.untyped_storage().data_ptr()
    return pointer or None


class StorageArguments(ArgumentHandler):
    """CSAN's argument classification (read / written / output, from the schema), over
    the storages of CPU tensors instead of the data pointers of CUDA tensors."""

    def __init__(self, checker: "StreamRaceChecker") -> None:
        super().__init__()
        self._checker = checker

    def _handle_argument(self, value, is_write, metadata_only, name=None, is_output=False):
        if not isinstance(value, torch.Tensor):
            return
        key = self._checker.track(value)
        if key is None:
            return
        if is_write:
            self.dataptrs_written.add(key)
        elif not metadata_only:
            self.dataptrs_read.add(key)
        self.tensor_aliases.setdefault(key, [])
        if name is not None:
            self.tensor_aliases[key].append(name)
        if is_output:
            self.outputs.add(key)


class StandInEvent:
    """A CUDA event for the happens-before analysis: record / wait / synchronize / query."""

    def __init__(self, checker: "StreamRaceChecker", enable_timing: bool = False, **_) -> None:
        self._checker = checker
        self.id = next(checker.ids)
        checker.handler._handle_event_creation(self.id)

    def record(self, stream: "StandInStream | None" = None) -> None:
        stream = stream or self._checker.current
        self._checker.handler._handle_event_record(self.id, stream.id)

    def wait(self, stream: "StandInStream | None" = None) -> None:
        stream = stream or self._checker.current
        self._checker.handler._handle_event_wait(self.id, stream.id)

    def synchronize(self) -> None:
        self._checker.handler._handle_event_synchronization(self.id)

    def query(self) -> bool:
        # reports "done": the host then knows everything before the event has run
        self.synchronize()
        return True


class StandInStream(torch.Stream):
    """A CUDA stream for the analysis, with `torch.cuda.Stream`'s ordering methods (a
    `torch.Stream` on the CPU, so that `Tensor.record_stream` accepts it)."""

    def __new__(cls, checker: "StreamRaceChecker", stream_id: int):
        return super().__new__(cls, device="cpu")

    def __init__(self, checker: "StreamRaceChecker", stream_id: int) -> None:
        self._checker = checker
        self.id = self.cuda_stream = stream_id
        if stream_id != DEFAULT_STREAM_ID:
            checker.handler._handle_stream_creation(stream_id)

    def record_event(self, event: StandInEvent | None = None) -> StandInEvent:
        event = event or StandInEvent(self._checker)
        event.record(self)
        return event

    def wait_event(self, event: StandInEvent) -> None:
        self._checker.calls["wait_event"] += 1
        event.wait(self)

    def wait_stream(self, stream: "StandInStream") -> None:
        self._checker.calls["wait_stream"] += 1
        event = stream.record_event()  # as torch.cuda.Stream.wait_stream
        event.wait(self)

    def synchronize(self) -> None:
        self._checker.calls["synchronize"] += 1
        self._checker.handler._handle_stream_synchronization(self.id)

    def query(self) -> bool:
        self.synchronize()
        return True

    def __repr__(self) -> str:
        return f"stream {self.id}"


class HostReads(TorchFunctionMode):
    """`.cpu()`, `.tolist()`, `.numpy()`: on CUDA a blocking copy to the host, so a read on
    the current stream and a host sync of it. `record_stream` concerns only the
    allocator and is skipped (as CSAN skips it); CPU tensors do not implement it."""

    HOST_COPIES = {"cpu", "tolist", "numpy"}

    def __init__(self, checker: "StreamRaceChecker") -> None:
        super().__init__()
        self._checker = checker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "record_stream":
            return None
        if name in self.HOST_COPIES and isinstance(args[0], torch.Tensor):
            self._checker.host_read(args[0], f"Tensor.{name}")
        return func(*args, **(kwargs or {}))


class StreamRaceChecker(TorchDispatchMode):
    """Every aten op as a kernel launch on the current stand-in stream, through CSAN's
    `EventHandler`; the races it finds are collected in `races`, not raised."""

    def __init__(self) -> None:
        super().__init__()
        self.handler = EventHandler()
        self.races: list[UnsynchronizedAccessError] = []
        self.calls: collections.Counter[str] = collections.Counter()
        """Host-side calls seen: `synchronize` (a stream's), `wait_stream`, `wait_event`
        and `host_read` (a value read or a copy to the host, each a blocking sync on CUDA)."""
        self.ids = itertools.count(1)
        self.default = StandInStream(self, DEFAULT_STREAM_ID)
        self.current = self.default
        self._storages: dict[int, weakref.ref] = {}

    # -- the stand-in torch.cuda API -------------------------------------------------

    def new_stream(self) -> StandInStream:
        return StandInStream(self, next(self.ids))

    def current_stream(self, device=None) -> StandInStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: StandInStream):
        previous, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = previous

    def event(self, enable_timing: bool = False, **kwargs) -> StandInEvent:
        return StandInEvent(self, enable_timing, **kwargs)

    def synchronize(self, device=None) -> None:
        self.handler._handle_device_synchronization()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Route torch.cuda's stream API to the stand-ins, for this test only."""
        monkeypatch.setattr(torch.cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(torch.cuda, "stream", self.stream)
        monkeypatch.setattr(torch.cuda, "Event", self.event)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)

    # -- accesses -----------------------------------------------------------------------

    def track(self, tensor: torch.Tensor) -> int | None:
        """The storage's key; its history is dropped when the storage is freed."""
        key = storage_key(tensor)
        if key is None:
            return None
        storage = tensor.untyped_storage()
        known = self._storages.get(key)
        if known is None or known() is not storage:
            self._storages[key] = weakref.ref(storage, lambda _, key=key: self._freed(key))
        return key

    def _freed(self, key: int) -> None:
        self._storages.pop(key, None)
        if key in self.handler.tensors_accessed.accesses:
            self.handler._handle_memory_deallocation(key)

    def _launch(self, read: set[int], written: set[int], outputs: set[int], operator,
                aliases: dict[int, list[str]]) -> None:
        errors = self.handler._handle_kernel_launch(
            self.current.id, read - written, written, outputs, operator, aliases)
        self.races += [e for e in errors if isinstance(e, UnsynchronizedAccessError)]

    def host_read(self, tensor: torch.Tensor, operator: str) -> None:
        """A blocking copy to the host: a read on the current stream, then a host sync."""
        key = self.track(tensor)
        if key is not None:
            self._launch({key}, set(), set(), operator, {key: ["self"]})
        self.calls["host_read"] += 1
        self.handler._handle_stream_synchronization(self.current.id)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        is_factory = bool(FACTORY_FUNCTION_REGEX.match(func._schema.name))
        arguments = StorageArguments(self)
        arguments.parse_inputs(func._schema, args, kwargs, is_factory=is_factory)
        outputs = func(*args, **kwargs)
        arguments.parse_outputs(func._schema, outputs, is_factory=is_factory)
        self._launch(arguments.dataptrs_read, arguments.dataptrs_written, arguments.outputs,
                     func._schema, arguments.tensor_aliases)
        # .item(), float(t), bool(t); an inference tensor's .item() arrives here undecomposed
        if func in (aten._local_scalar_dense.default, aten.item.default):
            self.calls["host_read"] += 1
            self.handler._handle_stream_synchronization(self.current.id)
        return outputs

    def summary(self) -> list[str]:
        """One line per race: which op on which stream, after which unordered access."""
        def where(access) -> str:
            operator = getattr(access.operator, "name", access.operator)
            return f"{operator} {access.type} on stream {access.stream}"

        return [f"{where(r.current_access)} races with {where(r.previous_access)}"
                for r in self.races]


# -- the rollout under the checker ---------------------------------------------------------

SMALL_ENV = EnvConfig(train_batches=1, batch_size=16, val_size=32)


def rollout_races(monkeypatch, sync: str, plant=None) -> tuple[StreamRaceChecker, VectorizedTrainer]:
    """One rollout (3 envs x 4 steps) of a CPU trainer taking its CUDA-stream path on
    stand-in streams, under the checker; `plant(trainer)` modifies its ordering first."""
    config = TrainConfig(num_envs=3, max_steps=4, seed=0, variants=Variants(sync=sync),
                         env=SMALL_ENV, hidden_dim=16)
    trainer = VectorizedTrainer(config, "cpu")
    checker = StreamRaceChecker()
    checker.install(monkeypatch)
    trainer.streams = [checker.new_stream() for _ in range(config.num_envs)]
    if plant is not None:
        plant(trainer)
    with HostReads(checker), checker:
        trainer.rollout()
    return checker, trainer


def germinated(trainer: VectorizedTrainer) -> bool:
    """Whether some env grew a seed: the default stream then wrote weights an env stream reads."""
    return any(slot.stage != Stage.EMPTY for env in trainer.envs.envs for slot in env.slots)


@pytest.mark.slow  # a whole rollout under the analysis: 2-4 s
@pytest.mark.parametrize("sync", ["stream", "event"])
def test_a_rollout_on_env_streams_has_no_race(monkeypatch, sync):
    checker, trainer = rollout_races(monkeypatch, sync)
    assert checker.summary() == []
    # the analysis saw real cross-stream work: env streams wrote, the default stream read
    streams = {access.stream for info in checker.handler.tensors_accessed.accesses.values()
               for access in info.reads + ([info.write] if info.write else [])}
    assert {DEFAULT_STREAM_ID, *(s.id for s in trainer.streams)} <= streams


# -- planted faults: each a real change to the trainer's ordering ---------------------------
# Each replaces one method of the test's trainer with a copy of the trainer's own code
# (esper/training/trainer.py) that lacks one ordering call.


def no_wait_on_env_events(trainer: VectorizedTrainer) -> None:
    """sync=event: the default stream no longer waits on the env streams' events before
    validating on it (the review's `current_stream().wait_event(event)` left out)."""

    def validate_after_events(self, trained, default):
        for stream in self.streams:
            torch.cuda.Event().record(stream)
            # planted fault: default.wait_event(event) is gone
        for loss, correct in trained:
            loss.record_stream(default)
            correct.record_stream(default)
        validated = [env.launch_val() for env in self.envs.envs]
        stacked = torch.stack([torch.stack([loss, correct, val_loss, val_acc])
                               for (loss, correct), (val_loss, val_acc) in zip(trained, validated)])
        return stacked.cpu()[:, [0, 2, 3]]

    trainer._validate_after_events = types.MethodType(validate_after_events, trainer)


def no_stream_synchronize(trainer: VectorizedTrainer) -> None:
    """sync=stream: the host no longer synchronizes each env stream before its reads."""

    def validate_after_stream_syncs(self, trained, default):
        # planted fault: stream.synchronize() is gone, after training and after validation
        train_losses = [loss.item() for loss, _ in trained]
        validated = []
        for env, stream in zip(self.envs.envs, self.streams):
            stream.wait_stream(default)
            with torch.cuda.stream(stream):
                validated.append(env.launch_val())
        rows = [(t, loss.item(), acc.item()) for t, (loss, acc) in zip(train_losses, validated)]
        return torch.tensor(rows)

    trainer._validate_after_stream_syncs = types.MethodType(validate_after_stream_syncs, trainer)


def no_wait_for_default_stream(trainer: VectorizedTrainer) -> None:
    """Either sync: an env stream no longer waits for the default stream before training."""

    def launch_train(self, default):
        for b in range(self.config.env_config.train_batches):
            for env, stream in zip(self.envs.envs, self.streams):
                # planted fault: stream.wait_stream(default) is gone, here and before the loop
                with torch.cuda.stream(stream):
                    env.launch_train_batch(b)
        trained = []
        for env, stream in zip(self.envs.envs, self.streams):
            with torch.cuda.stream(stream):
                trained.append(env.train_metrics())
        return trained

    trainer._launch_train = types.MethodType(launch_train, trainer)


@pytest.mark.parametrize(("sync", "plant", "reader_stream"), [
    ("event", no_wait_on_env_events, "default"),
    ("stream", no_stream_synchronize, "default"),
    ("event", no_wait_for_default_stream, "env"),
    ("stream", no_wait_for_default_stream, "env"),
], ids=["event-no-wait_event", "stream-no-synchronize", "event-no-wait_stream",
        "stream-no-wait_stream"])
def test_each_planted_ordering_fault_is_reported(monkeypatch, sync, plant, reader_stream):
    checker, trainer = rollout_races(monkeypatch, sync, plant)
    assert checker.races, f"{plant.__name__}: no race reported"
    env_ids = {s.id for s in trainer.streams}
    for race in checker.races:
        current, previous = race.current_access.stream, race.previous_access.stream
        if reader_stream == "default":  # the default stream reads what an env stream wrote
            assert (current, previous in env_ids) == (DEFAULT_STREAM_ID, True), checker.summary()
        else:  # an env stream reads what the default stream wrote (a new seed's weights)
            assert (current in env_ids, previous) == (True, DEFAULT_STREAM_ID), checker.summary()
    if reader_stream == "env":
        assert germinated(trainer)


# -- host syncs per step ------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["stream", "event"])
def test_host_syncs_and_waits_of_one_env_step(monkeypatch, sync):
    """One env step of N envs with B training batches, counted on the stand-in streams.

    `stream` (esper-lite's, 2df957ed vectorized.py:1162-1375): N stream synchronizes and
    2N `.item()` after training, N and 2N again after validation; `event` (the review's
    H3 fix): no synchronize and one read. Both wait for the default stream N + N*B times
    while training; `stream` N + N more before validating on the env streams, `event`
    N waits of the default stream on one event per env instead.

    What this cannot prove: that each read is one blocking copy on CUDA (a
    `cudaMemcpyAsync` closed by a `cudaStreamSynchronize`, which the finding's profiler
    counts there), how long the host waits, or that validation overlaps anything.
    """
    n, batches = 3, 2
    config = TrainConfig(num_envs=n, max_steps=2, seed=0, variants=Variants(sync=sync),
                         env=dataclasses.replace(SMALL_ENV, train_batches=batches),
                         hidden_dim=16)
    trainer = VectorizedTrainer(config, "cpu")
    checker = StreamRaceChecker()
    checker.install(monkeypatch)
    trainer.streams = [checker.new_stream() for _ in range(n)]
    with HostReads(checker), checker:
        metrics = trainer.env_phase()
    assert checker.summary() == []
    assert metrics.shape == (n, 3)
    training_waits = n + n * batches
    if sync == "stream":
        assert checker.calls == {"synchronize": 2 * n, "host_read": 4 * n,
                                 "wait_stream": training_waits + 2 * n}
    else:
        assert checker.calls == {"host_read": 1, "wait_stream": training_waits,
                                 "wait_event": n}
