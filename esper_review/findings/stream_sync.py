"""H3 (vectorized-training review): the epoch boundary of per-env CUDA streams, host
`stream.synchronize()` and reads before validation vs CUDA events."""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from esper.training.trainer import TrainConfig, VectorizedTrainer
from esper.variants import Variants
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from harness.measure.counters import profiling
from esper_review.findings.e2e import stream_fields
from esper_review.findings.trainer_size import nearest_trainer_size

STEPS_FOR_BLOCKED_TIME = 10
#: env steps run under the profiler for the train -> validation window (each step is one
#: host epoch of every env; the profiler slows launches, not the device's idle gap)
PROFILED_STEPS = 3
#: the trainer's record_function ranges of one env step (esper.training.trainer.env_phase)
TRAIN_RANGE, VAL_RANGE = "env_train", "env_val"
#: where each variant reads the training results: `stream` right after training, `event`
#: with everything else at the step's end
TRAIN_READ_RANGE = {"stream": "env_train_read", "event": "env_read"}


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 12))]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One trainer per variant, same seed: their envs evolve identically."""
    return {
        sync: VectorizedTrainer(
            TrainConfig(num_envs=case["num_envs"], seed=seed, variants=Variants(sync=sync)), device
        )
        for sync in ("stream", "event")
    }


def _make_call(variant: str, trainers: dict):
    return trainers[variant].env_phase  # one vectorized env step: metrics [N, 3] on the CPU


class Span(NamedTuple):
    """A host range (`name`, start and end in ns on the profiler's clock)."""

    name: str
    start_ns: int
    end_ns: int


class Kernel(NamedTuple):
    """Device work (a kernel, a copy, a memset): when it ran and when the host launched it,
    in ns on the profiler's clock (Kineto puts the device's on the host's), and its stream."""

    start_ns: int
    end_ns: int
    launched_ns: int
    stream: int = 0


def boundary_windows(ranges: Iterable[Span], kernels: Iterable[Kernel],
                     train_read: str) -> list[dict[str, float]]:
    """Per env step, from the k-th `env_train`, `env_val` and `train_read` host ranges:

    - `train_val_gap_s`: from the end of the step's last training kernel (any stream) to
      the start of its first validation kernel: the device's idle gap at the epoch
      boundary (negative when validation started before training ended elsewhere);
    - `stream_train_val_gap_s`: per stream that trained, from its last training kernel's
      end to the start of its first validation kernel (on that stream, as `stream`
      validates; else on any, as `event` validates on the default stream), averaged
      over the streams: how long each env's stream sits between its training and
      validation;
    - `val_before_train_read_s`: device time of validation kernels before the host
      finished reading the training results (the end of the `train_read` range): the
      overlap H3 asks for; 0 when the host reads before it launches validation.

    A kernel belongs to the range its launch lies in. Steps missing a range or the
    kernels of one are left out.
    """
    by_name: dict[str, list[Span]] = {}
    for span in sorted(ranges, key=lambda s: s.start_ns):
        by_name.setdefault(span.name, []).append(span)
    kernels = list(kernels)
    windows = []
    steps = zip(by_name.get(TRAIN_RANGE, []), by_name.get(VAL_RANGE, []),
                by_name.get(train_read, []))
    for train, val, read in steps:
        trained = [k for k in kernels if train.start_ns <= k.launched_ns <= train.end_ns]
        validated = [k for k in kernels if val.start_ns <= k.launched_ns <= val.end_ns]
        if not trained or not validated:
            continue
        first_val = min(k.start_ns for k in validated)
        gap = first_val - max(k.end_ns for k in trained)
        stream_gaps = []
        for stream in sorted({k.stream for k in trained}):
            trained_end = max(k.end_ns for k in trained if k.stream == stream)
            own = [k.start_ns for k in validated if k.stream == stream]
            stream_gaps.append((min(own) if own else first_val) - trained_end)
        before_read = sum(max(0, min(k.end_ns, read.end_ns) - k.start_ns) for k in validated)
        windows.append({"train_val_gap_s": gap * 1e-9,
                        "stream_train_val_gap_s": sum(stream_gaps) / len(stream_gaps) * 1e-9,
                        "val_before_train_read_s": before_read * 1e-9})
    return windows


def _trace_spans(prof) -> tuple[list[Span], list[Kernel]]:
    """The env step's host ranges and the device work of a CUDA profile: a device event
    links to the host op that launched it (`linked_correlation_id`), whose start is the
    launch time."""
    events = prof.profiler.kineto_results.events()
    names = {TRAIN_RANGE, VAL_RANGE, *TRAIN_READ_RANGE.values()}
    host_start: dict[int, int] = {}
    ranges, device = [], []
    for event in events:
        if event.device_type() == torch.autograd.DeviceType.CPU:
            if event.name() in names:
                ranges.append(Span(event.name(), event.start_ns(), event.end_ns()))
            if event.linked_correlation_id() == 0:  # an op, not a runtime call
                host_start[event.correlation_id()] = event.start_ns()
        elif event.linked_correlation_id() > 0 and event.name() not in names:
            device.append(event)  # not the device-side copy of an annotation range
    kernels = [Kernel(e.start_ns(), e.end_ns(), host_start[e.linked_correlation_id()],
                      e.device_resource_id())
               for e in device if e.linked_correlation_id() in host_start]
    return ranges, kernels


def _epoch_boundary(variant: str, trainers: dict) -> dict[str, float]:
    """Host-blocked seconds per step (the trainer's clock around its synchronizes and
    reads), and the train -> validation window of `PROFILED_STEPS` profiled steps."""
    trainer = trainers[variant]
    trainer._blocked_seconds = 0.0
    for _ in range(STEPS_FOR_BLOCKED_TIME):
        trainer.env_phase()
    out = {"host_blocked_s_per_step": trainer._blocked_seconds / STEPS_FOR_BLOCKED_TIME}
    torch.cuda.synchronize(trainer.device)
    with profiling(trainer.device) as prof:
        for _ in range(PROFILED_STEPS):
            trainer.env_phase()
        torch.cuda.synchronize(trainer.device)
    windows = boundary_windows(*_trace_spans(prof), TRAIN_READ_RANGE[variant])
    if windows:
        for name in windows[0]:
            out[name] = sum(w[name] for w in windows) / len(windows)
    return {**out, **stream_fields(trainer.env_streams, trainer.config.num_envs)}


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    return None if device.type == "cuda" else "needs CUDA"


register(Finding(
    id="H3-stream-sync",
    title="The epoch boundary on per-env CUDA streams: host synchronize and reads before "
          "validation vs CUDA events",
    claim="Sync all streams ONCE at epoch end ... Consider using CUDA events for "
          "dependency instead of synchronization",
    variants=("stream", "event"),
    baseline="stream",
    proposed="event",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 1e-5,
    skip=_skip,
    gated=False,  # needs CUDA, and the gate counts on the CPU: it would have no cell
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1162-1240, 1272-1375 @2df957ed",
        fix="vectorized-training-review.md H3: after training, `event.record(env_state.stream)` "
            "per env stream, `torch.cuda.current_stream().wait_event(event)` for each, and "
            "validation on the default stream after them, with no host wait between training "
            "and validation",
        notes=(
            "One timed call = one env step of every env, as the reviewed epoch: training "
            "batches outer and envs inner, each env's batch on its own stream after a "
            "wait_stream(default) (per env per batch, as the original), then the epoch "
            "boundary. stream (the original): per env stream.synchronize() and 2 .item() "
            "after training, validation on the env streams, then per env synchronize and 2 "
            ".item() again (2N syncs and 4N reads per step); event (the review's fix): an "
            "event per env stream, the default stream waits on each, validation runs on the "
            "default stream, one read of every result at the end.",
            f"host_blocked_s_per_step: the host's wait in synchronize and reads, averaged over "
            f"{STEPS_FOR_BLOCKED_TIME} steps. From the profiler trace of {PROFILED_STEPS} "
            "steps: train_val_gap_s, from the end of the last training kernel to the start "
            "of the first validation kernel (the idle gap that H3 is about); "
            "stream_train_val_gap_s, the same per env stream (to its own first validation "
            "kernel for stream, to the first on the default stream for event), averaged; and "
            "val_before_train_read_s, validation's device time before the host finished "
            "reading the training results (0 for stream: it reads, then launches).",
            "host_syncs (CUDA, one step): 2N stream synchronizes and 4N blocking reads for "
            "stream, 1 read for event.",
            "With event, validation of all envs runs on one stream (the default), in "
            "sequence; with stream, on the env streams side by side: the fix trades that "
            "parallelism for the gap.",
            "env_streams is how many distinct CUDA streams the envs ran on: torch.cuda.Stream() "
            "cycles through a pool of 32 per device, so above 32 envs some share one.",
            "On a machine without CUDA every row reads 'needs CUDA'; the ordering of both "
            "variants is checked race-free on the CPU (tests/esper/training/"
            "test_stream_races.py).",
        ),
    ),
    recording=Recording(
        extra_metrics=_epoch_boundary,
    ),
    reading=Reading(
        headline_case=nearest_trainer_size,
    ),
))
