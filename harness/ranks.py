"""The ranks of a `torchrun` launch: detection, the process group, and who measures what.

    torchrun --nproc-per-node N [--nnodes M ...] -m harness.run [options]

torchrun starts N processes per node and sets `WORLD_SIZE`, `RANK` and `LOCAL_RANK` in
each. `Launch.from_environment` reads them (a plain `python -m harness.run` is a world
of one, and nothing here changes it). The unit of work is a cell (a finding at one
case): all variants of a cell run on one rank, interleaved, so every ratio stays a
within-process comparison. Rank 0 assigns cells to ranks, longest expected first onto
the least-loaded rank (`assign`), and broadcasts the assignment, so that every rank acts
on the same plan even when their file systems differ; at the end it gathers what each
rank did.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from harness.exits import ignore_signals, process_stat
from harness.measure.machine import device_name

#: a rank may measure for hours while another waits at the final gather
TIMEOUT = dt.timedelta(hours=12)


@dataclass(frozen=True)
class Launch:
    """This process's place in the launch."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_environment(cls, environ: dict | None = None) -> "Launch":
        """From torchrun's variables; a world of one where they are absent."""
        environ = os.environ if environ is None else environ
        values = {}
        for field, name, default in (("world_size", "WORLD_SIZE", 1), ("rank", "RANK", 0),
                                     ("local_rank", "LOCAL_RANK", 0),
                                     ("local_world_size", "LOCAL_WORLD_SIZE", 1)):
            text = environ.get(name, str(default))
            try:
                values[field] = int(text)
            except ValueError as err:
                raise ValueError(f"{name}: expected an integer (set by torchrun); got {text!r}") from err
        launch = cls(**values)
        if not 0 <= launch.rank < launch.world_size:
            raise ValueError(f"RANK: expected 0 to {launch.world_size - 1}; got {launch.rank}")
        return launch

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        """Rank 0: creates the run, assigns the cells, writes the result and the report."""
        return self.rank == 0

    def device(self, requested: str) -> str:
        """The device name this rank measures on: `cuda` (and `auto` on a CUDA machine)
        become `cuda:LOCAL_RANK`, so that no two ranks of a node time on one GPU."""
        if not self.distributed:
            return requested
        if requested == "auto":
            requested = "cuda" if torch.cuda.is_available() else "cpu"
        if requested == "cuda":
            return f"cuda:{self.local_rank}"
        if requested.startswith("cuda:"):
            raise ValueError(f"--device: expected cpu, cuda or auto under torchrun (each rank "
                             f"takes cuda:LOCAL_RANK); got {requested!r}, which would put "
                             f"{self.local_world_size} ranks on one GPU")
        return requested

    def default_threads(self) -> int:
        """CPU threads per rank when --threads is not given: the node's cores shared out."""
        return max(1, (os.cpu_count() or 1) // self.local_world_size)


def timing_threads(launch: Launch | None = None) -> int:
    """The torch threads `harness.run` times with when --threads is not given: torch's
    count in this process, or, under torchrun (which sets OMP_NUM_THREADS=1 in every rank),
    the node's cores shared out over its ranks. The gate's timing checks use it too, so
    that the gate guards the regime the run reports."""
    launch = Launch.from_environment() if launch is None else launch
    return launch.default_threads() if launch.distributed else torch.get_num_threads()


#: where Linux counts each core's busy and idle time
PROC_STAT = "/proc/stat"
#: seconds over which `busy_cores` watches the machine
BUSY_WINDOW_S = 0.2
#: cores another process keeps busy before the run leaves one to it
BUSY_CORE = 0.7
#: cores of other work beside a timed cell that take one of the cores its threads ran on
#: (`shares_cores`)
SHARED_CORE = 0.5


def _cpu_times() -> tuple[int, int, int] | None:
    """(busy, total) clock ticks of the cores this process may run on (`usable_cores`'
    lines of /proc/stat; all cores where they are not listed), and how many cores that
    is; None without /proc/stat."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = total = cores = 0
    try:
        with open(PROC_STAT) as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
        for name, *values in lines[1:] if len(lines) > 1 else lines:
            if name != "cpu" and allowed is not None and int(name[3:]) not in allowed:
                continue
            fields = [int(v) for v in values]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            busy, total, cores = busy + sum(fields) - idle, total + sum(fields), cores + 1
    except (OSError, ValueError, IndexError):
        return None
    if len(lines) == 1:  # only the machine's sum: all its cores
        cores = os.cpu_count() or 1
    return (busy, total, cores) if cores else None


def _process_ticks(pid: int) -> int | None:
    """Clock ticks process `pid` has run (user and system, its threads together), from
    /proc/PID/stat; None where it is gone or cannot be read."""
    fields = process_stat(pid)
    try:
        return None if fields is None else int(fields[11]) + int(fields[12])
    except (ValueError, IndexError):
        return None


def _tree_ticks(root: int) -> int | None:
    """Clock ticks process `root` and every process it started (and theirs) have run:
    user and system time, with what their children that ended and were waited for ran
    (/proc's cutime and cstime, so a worker that exits moves no ticks out of the sum);
    None where `root` cannot be read."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc to list
        return None
    stats = {int(name): process_stat(int(name)) for name in names if name.isdigit()}
    stats = {pid: fields for pid, fields in stats.items()
             if fields is not None and len(fields) >= 15}
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += sum(int(v) for v in stats[pid][11:15])
        todo.extend(children.get(pid, ()))
    return total


def _busy_beyond(before, after, own_ticks: int) -> float | None:
    """Cores the machine's processes kept busy between two `_cpu_times` readings, on
    average, less the `own_ticks` of them that the run's own processes ran; None where
    either reading is missing or no tick passed."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy = max(0, after[0] - before[0] - own_ticks)
    return busy / (after[1] - before[1]) * after[2]


class LoadWatch:
    """How many cores processes other than the run's kept busy over a span: from its
    creation to `others_cores()`. The run's are process `root` (by default this one) and
    every process it started (its workers, their compile workers, py-spy); what the
    machine's cores ran beyond them is another job's load, which a timed cell shares its
    cores with."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._machine, self._own = _cpu_times(), _tree_ticks(self.root)

    def others_cores(self) -> float | None:
        """Cores the other processes kept busy since the watch began, on average (0 to
        the usable cores); None where /proc cannot say."""
        machine, own = _cpu_times(), _tree_ticks(self.root)
        if own is None or self._own is None:
            return None
        return _busy_beyond(self._machine, machine, max(0, own - self._own))

    def seen(self, threads: int) -> dict[str, float | bool]:
        """What a timing at `threads` torch threads since the watch began ran beside, as a
        summary row's fields: `others_busy_cores` (`others_cores`) and `timed_beside_load`
        (`shares_cores`); empty where /proc cannot say."""
        others = self.others_cores()
        if others is None:
            return {}
        return {"others_busy_cores": round(others, 2),
                "timed_beside_load": shares_cores(threads, others)}


def busy_cores(window_s: float = BUSY_WINDOW_S, own: Sequence[int] = ()) -> float | None:
    """How many cores the machine's processes kept busy over the next `window_s` seconds
    (this one sleeps through it), in cores, less what the processes `own` (pids: the run's
    spare worker, importing then) ran meanwhile; None where /proc/stat cannot be read."""
    before, own_before = _cpu_times(), [_process_ticks(pid) for pid in own]
    time.sleep(window_s)
    after, own_after = _cpu_times(), [_process_ticks(pid) for pid in own]
    mine = sum(b - a for a, b in zip(own_before, own_after)
               if a is not None and b is not None and b >= a)
    return _busy_beyond(before, after, mine)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS says: a container
    or `taskset` may allow fewer than the machine has), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def _taken(busy: float, core: float = BUSY_CORE) -> int:
    """Cores that `busy` cores of other processes' work take: `core` of a core counts as
    one."""
    return int(busy + (1.0 - core))


def free_threads(threads: int, own: Sequence[int] = ()) -> int:
    """`threads`, less one for each core other processes keep busy (`busy_cores`, a core
    from BUSY_CORE of one; the processes `own` are the run's and not counted), at least 1.
    More torch threads than free cores make every parallel region wait for a thread the
    scheduler has put aside: on 2 cores beside one busy process, a training iteration took
    5-9x longer at 2 threads than at 1."""
    busy = busy_cores(own=own)
    if busy is None:
        return threads
    return max(1, min(threads, usable_cores() - _taken(busy)))


def shares_cores(threads: int, others_cores: float) -> bool:
    """Whether `threads` torch threads shared a core with processes that kept
    `others_cores` cores busy while they were timed: from SHARED_CORE (half a core) each,
    not BUSY_CORE, since a busy process beside a run whose threads fill the cores gets only
    its fair share of one (2/3 of a core beside 2 busy threads on 2 cores), and half a
    core of other work already holds a parallel region back half of the time."""
    return threads > usable_cores() - _taken(others_cores, SHARED_CORE)


def start(launch: Launch, device: torch.device):
    """Initialise torch.distributed (nccl on CUDA, gloo on the CPU); returns the group for
    Python objects (gloo: it needs no device memory), or None in a world of one."""
    if not launch.distributed:
        return None
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=TIMEOUT)
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo", timeout=TIMEOUT)


def stop(launch: Launch) -> None:
    if launch.distributed and dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End the command's process with `code` at once, after flushing its standard
    streams, without Python's finalization and C++'s static destructors. A rank that left
    while another still ran (rank 0 renders the report) aborted or crashed there
    ("terminate called without an active exception", SIGSEGV, with no Python frame left)
    in 1 of 12 launches on a loaded 2-core CPU and in 2 of 3 full test-suite runs, after
    all its work was journaled, and torchrun then reported the whole launch failed; ending
    this way, 24 of 24 loaded launches passed. A process that compiled (torch.compile
    keeps a pool of compile workers) spent 1.5-2 s in finalization on a 2-core CPU, a
    twentieth of a quick run. Everything a command writes is closed (atomic renames)
    before it returns its status, so nothing is lost by skipping finalization."""
    ignore_signals()  # the status is made: a signal while Python exits must not change it
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(code)


def broadcast(value, group, launch: Launch):
    """Rank 0's `value` on every rank."""
    if not launch.distributed:
        return value
    box = [value if launch.leader else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def gather(value, group, launch: Launch) -> list | None:
    """Every rank's `value`, in rank order, on rank 0 (None elsewhere)."""
    if not launch.distributed:
        return [value]
    out = [None] * launch.world_size if launch.leader else None
    dist.gather_object(value, out, dst=0, group=group)
    return out


def assign(expected_seconds: Sequence[float], world_size: int) -> list[int]:
    """The rank of each cell: longest expected first, each onto the least-loaded rank
    (ties: the lower rank; equal cells keep their order). Deterministic.

    The classic greedy for balancing: its makespan is at most 4/3 of the best possible.
    """
    if world_size < 1:
        raise ValueError(f"world_size: expected an integer >= 1; got {world_size!r}")
    bad = [s for s in expected_seconds if not s >= 0]
    if bad:
        raise ValueError(f"expected_seconds: expected seconds >= 0; got {bad[0]!r}")
    load = [0.0] * world_size
    ranks = [0] * len(expected_seconds)
    for index in sorted(range(len(expected_seconds)), key=lambda i: (-expected_seconds[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        ranks[index] = rank
        load[rank] += expected_seconds[index]
    return ranks


def describe_rank(launch: Launch, device: torch.device) -> dict:
    """Who this rank is, for the run's metadata and its cells' fingerprints."""
    return {"rank": launch.rank, "local_rank": launch.local_rank, "host": socket.gethostname(),
            "device": str(device), "device_name": device_name(device)}


def share(count: int, launch: Launch) -> list[int]:
    """The indices of `count` independent jobs this rank runs: every world_size-th from
    its rank (all of them in a world of one)."""
    return list(range(launch.rank, count, launch.world_size))


def gather_jobs(results: dict[int, object], count: int, group, launch: Launch) -> list | None:
    """On rank 0, the results of all `count` jobs in job order, from every rank's
    `results` (job index -> result); None on the other ranks. A rank's failure is a job
    result like any other (each caller says how it records one), so that no rank is left
    waiting for one that stopped."""
    gathered = gather(results, group, launch)
    if gathered is None:
        return None
    merged = {index: result for part in gathered for index, result in part.items()}
    missing = sorted(set(range(count)) - set(merged))
    if missing:
        raise RuntimeError(f"jobs {missing} ran on no rank (world size {launch.world_size})")
    return [merged[index] for index in range(count)]


class Spread:
    """Independent jobs of a command spread over a torchrun launch's ranks (gloo), or run
    in this process alone without torchrun. Rank 0 gets every result and reports."""

    def __init__(self) -> None:
        self.launch = Launch.from_environment()
        self.group = start(self.launch, torch.device("cpu"))

    def run(self, count: int, job) -> list | None:
        """`job(index)` for this rank's share of `count` jobs; on rank 0 every result in
        job order, elsewhere None. A job that raises becomes `{"error": "Type: message"}`."""
        results = {}
        for index in share(count, self.launch):
            try:
                results[index] = job(index)
            except Exception as err:  # sent to rank 0 to report, not left to hang the others
                results[index] = {"error": f"{type(err).__name__}: {err}"}
        return gather_jobs(results, count, self.group, self.launch)

    def agree(self, value):
        """Rank 0's `value` on every rank (e.g. the exit status)."""
        return broadcast(value, self.group, self.launch)

    def close(self) -> None:
        stop(self.launch)
