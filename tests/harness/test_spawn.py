"""The spare worker (`harness.spawn`): started before the run's imports, taken by the run's
first worker, and never left behind. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import spawn
from harness.exits import kill_group
from harness.replica import Worker
from tests.harness.test_replica import _alive, _spec


@pytest.fixture(autouse=True)
def no_spare_left():
    """Each test starts and ends without a spare of this process."""
    spawn.discard_spare()
    yield
    spawn.discard_spare()


@pytest.mark.integration
def test_the_first_worker_is_the_spare_and_measures_as_a_fresh_one(outside_the_repository):
    spawn.start_spare([])
    spare = spawn._spare
    assert spare is not None
    worker = Worker(_spec())
    try:
        assert worker.process is spare.process and spawn.take_spare() is None
        done = worker.measure("NOISE-tiny", "n=64", False, 0.05, ["sum", "double"])
        worker.ready()
        assert worker.startup_s is not None and worker.startup_s > 0
    finally:
        worker.close()
    assert done["failed"] == {} and {r["variant"] for r in done["samples"]} == {"sum", "double"}
    assert all(r["process"] == 2 for r in done["samples"])
    second = Worker(_spec())  # the spare is taken once: the next worker is launched anew
    try:
        assert second.process is not spare.process
    finally:
        second.close()


def test_the_spare_is_the_runs_own_process_until_taken():
    """What the run leaves out of the machine's busy cores (`ranks.free_threads`): the
    spare imports then, and it is the run's."""
    assert spawn.spare_pids() == ()
    spawn.start_spare([])
    pid = spawn._spare.process.pid
    assert spawn.spare_pids() == (pid,)
    taken = spawn.take_spare()
    try:
        assert spawn.spare_pids() == ()
    finally:
        kill_group(taken.process)
        taken.errors.close()


@pytest.mark.parametrize("flag", spawn.MEASURES_NOTHING)
def test_a_run_that_measures_nothing_starts_no_spare(flag):
    spawn.start_spare(["--quick", flag])
    assert spawn.take_spare() is None


def test_a_spare_nothing_takes_is_killed_and_one_whose_input_ends_exits_0():
    spawn.start_spare([])
    spare = spawn._spare
    spawn.discard_spare()
    assert spare.process.returncode is not None and spawn.take_spare() is None
    # a spare whose run ended (its stdin closed) before a spec came does nothing, exits 0
    ended = spawn.launch(spawn.SPARE)
    ended.process.stdin.close()
    assert ended.process.wait(timeout=60) == 0
    assert ended.process.stdout.read() == ""


def test_a_spare_told_no_spec_exits_2_naming_what_it_expected():
    bad = spawn.launch(spawn.SPARE)
    out, _ = bad.process.communicate("not json\n", timeout=60)
    bad.errors.seek(0)
    assert bad.process.returncode == 2 and out == ""
    assert '--spare: expected a first line {"spec": SPEC_JSON, "environ": {NAME: VALUE}} on ' \
        "stdin; got 'not json\\n'" in bad.errors.read()


@pytest.mark.integration
def test_a_spare_takes_the_environment_the_run_has_when_it_is_taken(outside_the_repository,
                                                                     monkeypatch):
    """The run sets variables after its spare started (`isolate_compile_cache`: inductor's
    folder on another kernel path): the spare's worker has them, as a worker started then
    would."""
    spawn.start_spare([])
    spare = spawn._spare
    log = outside_the_repository / "threads.log"
    monkeypatch.setenv("NOISE_THREADS_LOG", str(log))  # the finding's build writes to it
    worker = Worker(_spec())
    try:
        assert worker.process is spare.process
        done = worker.measure("NOISE-tiny", "n=64", False, 0.01, ["sum"])
    finally:
        worker.close()
    assert done["failed"] == {}, done
    assert log.read_text().split()[0] == str(worker.process.pid)


def test_a_workers_imports_leave_inductor_unloaded_so_it_reads_the_runs_environment():
    """Inductor reads its variables when imported: a spare, whose environment comes after
    its imports, has not imported it by then."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, harness.replica; "
         "print(sorted(m for m in sys.modules if m.startswith('torch._inductor')))"],
        capture_output=True, text=True, cwd=Path(spawn.__file__).parents[1], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG, /proc")
def test_a_spare_dies_with_a_run_killed_during_its_imports(tmp_path):
    """A run killed outright while it and its spare still import leaves nothing behind
    (the spare's parent-death signal is set before its imports; this test does not tell
    that from one set after them, which ends the orphan a second or two later)."""
    pid_file = tmp_path / "spare.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from harness import spawn
        spawn.start_spare([])
        open({str(pid_file)!r}, "w").write(str(spawn._spare.process.pid))
        time.sleep(60)
    """)], cwd=Path(spawn.__file__).parents[1])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.02)
    spare = int(pid_file.read_text())
    time.sleep(0.3)  # into its imports (torch: seconds)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(spare) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(spare), "the spare outlived its run"
