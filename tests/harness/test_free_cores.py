"""The run's default thread count on a machine where other processes keep cores busy
(`harness.ranks.free_threads`): real processes, counted from /proc/stat."""

from __future__ import annotations

import os

import pytest

from harness.gate.quality import busy_processes
from harness.ranks import busy_cores, free_threads, usable_cores

linux_only = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")


@linux_only
def test_a_process_spinning_a_core_is_seen_and_leaves_the_run_one_thread_fewer():
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs two cores")
    with busy_processes(1):  # whatever else runs beside the test, this one core is busy
        busy = busy_cores()
        assert busy is not None and 0.7 <= busy <= cores + 0.05
        assert free_threads(cores) <= cores - 1
    # never more than asked, never fewer than one
    assert free_threads(1) == 1


@linux_only
def test_the_runs_own_processes_are_not_counted_busy():
    """The run's spare worker imports while the run looks (`harness.spawn`): a core it
    keeps busy is not another process's. Windows taken in turn, three each: the spinner's
    core is in every one; what else runs beside the test moves both kinds alike."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    with busy_processes(1) as (spinner,):
        counted, left_out = [], []
        for _ in range(3):
            counted.append(busy_cores())
            left_out.append(busy_cores(own=[spinner.pid]))
    assert None not in counted + left_out
    assert sum(counted) / 3 - sum(left_out) / 3 >= 0.6  # about one core, the spinner's
    assert min(left_out) >= 0.0


def test_without_proc_stat_the_count_is_kept(monkeypatch, tmp_path):
    monkeypatch.setattr("harness.ranks.PROC_STAT", str(tmp_path / "absent"))
    assert busy_cores() is None
    assert free_threads(3) == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_usable_cores_are_the_affinity_s_not_the_machine_s():
    """A process allowed one core (as `taskset` or a container's cpuset leaves it) counts one,
    however many the machine has; run in a child, so this process keeps its cores."""
    import subprocess
    import sys

    program = ("import os\nos.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
               "from harness.ranks import usable_cores\nprint(usable_cores())\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"
    assert usable_cores() == len(os.sched_getaffinity(0))
