"""The run's default thread count on a machine where other processes keep cores busy
(`harness.ranks.free_threads`): real processes, counted from /proc/stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.gate.quality import busy_processes
from harness.ranks import LoadWatch, busy_cores, free_threads, shares_cores, usable_cores

linux_only = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")


@linux_only
@pytest.mark.usefixtures("cores_alone")
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
@pytest.mark.usefixtures("cores_alone")
def test_the_runs_own_processes_are_not_counted_busy():
    """The run's spare worker imports while the run looks (`harness.spawn`): a core it
    keeps busy is not another process's. Windows taken in turn, three each: the spinner's
    core is in every one; what else runs beside the test moves both kinds alike."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    with busy_processes(1) as (spinner,):
        counted, left_out = [], []
        for _ in range(3):
            counted.append(busy_cores(window_s=0.5))
            left_out.append(busy_cores(window_s=0.5, own=[spinner.pid]))
    assert None not in counted + left_out
    # about one core, the spinner's; under a loaded test run its fair share of one (half a
    # core beside three more busy threads on two cores), never the 0 of a core counted twice
    assert sum(counted) / 3 - sum(left_out) / 3 >= 0.4
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


@linux_only
@pytest.mark.usefixtures("cores_alone")
def test_a_load_watch_counts_every_process_the_run_started_as_the_runs_grandchildren_included():
    """Two watches over the same second, one rooted at this process, one at a sleeping
    child of it: a spinner this process started through a shell (a grandchild) is the
    first's own work and the second's other load (which threads on every core shared:
    `seen`); what else runs beside the test (the other test workers) moves both alike. A
    watch whose root is gone says nothing."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    spin = "import time\nends = time.monotonic() + 30\nwhile time.monotonic() < ends: pass"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    spinner = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{spin}"; true'],
                               start_new_session=True)
    try:
        time.sleep(0.5)  # the interpreters have started
        mine, the_sleepers = LoadWatch(), LoadWatch(root=sleeper.pid)
        time.sleep(1.0)
        own_run, seen = mine.others_cores(), the_sleepers.seen(usable_cores())
    finally:
        os.killpg(spinner.pid, 9)
        sleeper.kill()
        spinner.wait()
        sleeper.wait()
    assert own_run is not None and seen
    other_run = seen["others_busy_cores"]
    assert other_run - own_run >= 0.5  # the spinner's core, or its fair share of one
    assert seen["timed_beside_load"] is True  # threads on every core shared one with it
    assert 0.0 <= own_run <= usable_cores() + 0.05
    gone = LoadWatch(root=sleeper.pid)
    assert gone.others_cores() is None
    assert gone.seen(1) == {}  # nothing to record where /proc cannot say


@pytest.mark.usefixtures("cores_alone")
def test_threads_share_their_cores_from_half_a_core_of_other_work():
    """The rule that marks a cell timed beside another job's load (`shares_cores`)."""
    cores = usable_cores()
    assert not shares_cores(cores, 0.0) and not shares_cores(cores, 0.45)
    assert shares_cores(cores, 0.5)
    assert shares_cores(1, float(cores))  # every core busy: one thread waits too
    if cores >= 2:
        assert not shares_cores(cores - 1, 1.0)  # the core it left free
        assert shares_cores(cores - 1, 1.6)
