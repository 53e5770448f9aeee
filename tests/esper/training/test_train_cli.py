"""Tests of `python -m esper.train`: a subprocess smoke run with resume, and bad input."""

from __future__ import annotations

import io
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import esper.train
from esper.train import MAX_ENVS, MAX_THREADS, Progress, main
from esper.training.trainer import VectorizedTrainer

REPO_ROOT = Path(__file__).resolve().parents[3]

#: One metrics line per iteration (see `IterationStats.line`).
METRICS_LINE = re.compile(
    r"^iter +(\d+)  return [+-]\d+\.\d{4}  pi [+-]\d+\.\d{4}  v \d+\.\d{4}  ent \d\.\d{3}  "
    r"kl -?\d+\.\d{4}  env_step=\d+\.\d{3}s policy_forward=\d+\.\d{3}s buffer_add=\d+\.\d{3}s "
    r"gae=\d+\.\d{3}s update=\d+\.\d{3}s$"
)


pytestmark = pytest.mark.usefixtures("one_thread")


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "esper.train", "--device", "cpu", "--threads", "1", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )


def iterations_printed(stdout: str) -> list[int]:
    return [int(m.group(1)) for m in map(METRICS_LINE.match, stdout.splitlines()) if m]


@pytest.mark.slow
@pytest.mark.integration  # launches a Python process
def test_smoke_run_then_resume(tmp_path):
    checkpoint = tmp_path / "run.pt"
    first = train("--envs", "2", "--steps", "3", "--iterations", "2",
                  "--checkpoint", str(checkpoint))
    assert first.returncode == 0, first.stderr
    assert iterations_printed(first.stdout) == [1, 2], first.stdout
    assert "variants reset=clone,step_counts=list,gae=loop,sync=stream" in first.stdout
    assert checkpoint.is_file()

    resumed = train("--envs", "2", "--steps", "3", "--resume", str(checkpoint),
                    "--iterations", "3", "--variants", "ours")
    assert resumed.returncode == 0, resumed.stderr
    assert iterations_printed(resumed.stdout) == [3], resumed.stdout  # 1 and 2 were done


def run_main(capsys, *argv: str) -> str:
    """Run the CLI in this process, expecting exit status 2 and one error line on stderr
    (no usage block, no traceback); returns that line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m esper.train: error: "), err
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_exits_2_with_a_clear_message(capsys):
    err = run_main(capsys, "--device", "cuda")
    assert ("error: --device: device: expected a device this machine has; got 'cuda', but this "
            "torch has no CUDA (torch.cuda.is_available() is False): use 'cpu'") in err


@pytest.mark.parametrize("spec, message", [
    ("gae=nope", "--variants: Variants.gae: expected one of loop, batched, scan"),
    ("speed=max", "--variants: variant spec: unknown axis 'speed'; valid axes: reset, "
                  "step_counts, gae, sync"),
    ("fast", "--variants: variant spec: expected 'axis=value' or a preset (original, "
             "reviews, ours); got 'fast'"),
    ("", "--variants: expected a preset (original, reviews, ours) or axis=value pairs; "
         "got ''"),
    (" ", "--variants: expected a preset (original, reviews, ours) or axis=value pairs; "
          "got ' '"),
])
def test_bad_variants_exit_2_naming_the_valid_ones(capsys, spec, message):
    assert message in run_main(capsys, "--variants", spec)


@pytest.mark.parametrize("flag", ["--envs", "--steps", "--iterations"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_non_positive_sizes_exit_2_naming_the_argument(capsys, flag, value):
    err = run_main(capsys, flag, value, "--device", "cpu")
    expected = f"an int in [1, {MAX_ENVS + 1})" if flag == "--envs" else "a positive int"
    assert err.endswith(f"error: {flag}: expected {expected}; got {value}")


def test_resume_of_another_config_exits_2_naming_the_mismatch(capsys, tmp_path):
    checkpoint = str(tmp_path / "run.pt")
    tiny = ("--envs", "1", "--steps", "2", "--device", "cpu")
    assert main([*tiny, "--iterations", "1", "--checkpoint", checkpoint]) == 0
    capsys.readouterr()
    err = run_main(capsys, "--envs", "1", "--steps", "3", "--device", "cpu", "--resume", checkpoint)
    assert "config mismatch: " in err and "max_steps: checkpoint has 2, this run has 3" in err


def test_resume_of_a_missing_checkpoint_exits_2(capsys, tmp_path):
    err = run_main(capsys, "--device", "cpu", "--resume", str(tmp_path / "absent.pt"))
    assert err.endswith(f"--resume: expected a checkpoint file; got {tmp_path / 'absent.pt'}, "
                        "which does not exist")


def test_resume_of_a_file_that_is_not_a_checkpoint_says_so_in_one_line(capsys, tmp_path):
    """torch.load's own message for it is a page that suggests weights_only=False: loading
    an unknown file that way can run arbitrary code, so the error must not pass that on."""
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    err = run_main(capsys, "--device", "cpu", "--resume", str(text))
    assert f"--resume: checkpoint {text}: expected a checkpoint written by save_checkpoint" in err
    assert "UnpicklingError" in err and "weights_only" not in err


# ------------------------------------------------------ bad input, limits and signals

TINY = ("--envs", "1", "--steps", "2", "--device", "cpu")


@pytest.mark.parametrize("flag", ["--checkpoint", "--resume"])
def test_an_empty_path_exits_2(capsys, flag):
    """`--checkpoint ''` used to train and silently write no checkpoint."""
    err = run_main(capsys, *TINY, flag, "")
    assert f"{flag}: expected a file path; got ''" in err


@pytest.mark.parametrize("flag", ["--checkpoint", "--resume"])
def test_a_folder_as_checkpoint_exits_2_before_training(capsys, tmp_path, flag):
    err = run_main(capsys, *TINY, flag, str(tmp_path))
    want = "a file to write" if flag == "--checkpoint" else "a checkpoint file"
    assert f"{flag}: expected {want}; got {tmp_path}, a folder" in err


def test_a_checkpoint_that_cannot_be_written_exits_2_before_training(capsys, tmp_path):
    """Its folder would be a plain file: nothing can be written there (whoever runs it,
    root included, which ignores permission bits)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    err = run_main(capsys, *TINY, "--checkpoint", str(blocker / "run.pt"))
    assert "--checkpoint: expected a writable location" in err and "not-a-folder" in err


def test_resuming_a_checkpoint_at_or_past_iterations_exits_2_saying_so(capsys, tmp_path):
    """It used to do nothing and say nothing."""
    checkpoint = str(tmp_path / "run.pt")
    assert main([*TINY, "--iterations", "2", "--checkpoint", checkpoint]) == 0
    capsys.readouterr()
    for iterations in ("1", "2"):
        err = run_main(capsys, *TINY, "--resume", checkpoint, "--iterations", iterations)
        assert err == (f"python -m esper.train: error: --resume {checkpoint}: the checkpoint is "
                       f"at iteration 2, and --iterations {iterations} asks for no more; pass "
                       f"--iterations above 2 to train further")


@pytest.mark.parametrize("value", ["4097", "1000000000000"])
def test_too_many_envs_exit_2_naming_the_maximum(capsys, value):
    """`--envs 1000000000000` used to hang building envs."""
    err = run_main(capsys, "--envs", value, "--device", "cpu")
    assert f"--envs: expected an int in [1, {MAX_ENVS + 1}); got {value}" in err


def test_a_rollout_larger_than_memory_exits_2_naming_the_sizes(capsys):
    err = run_main(capsys, "--envs", "4", "--steps", "1000000000000", "--device", "cpu")
    assert "--envs x --steps: expected a rollout that fits in memory" in err
    assert "4 x 1000000000000 steps" in err and "GiB" in err


@pytest.mark.parametrize("value", ["-1", str(2**64), "1.5"])
def test_a_seed_outside_the_seedable_range_exits_2(capsys, value):
    """`--seed -1` ended in a traceback from NumPy's SeedSequence."""
    err = run_main(capsys, "--seed", value, "--device", "cpu")
    assert f"--seed: expected an int in [0, {2**64}); got " in err and value in err


def test_help_lists_every_exit_status(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for code in ("0", "2", "3", "130", "143"):
        assert re.search(rf"^  {code} ", out, re.M), (code, out)


@pytest.mark.slow
@pytest.mark.integration  # launches a Python process
def test_sigterm_exits_143_leaving_only_whole_checkpoints(tmp_path):
    """SIGTERM ends a run like Ctrl-C: exit 143, and the checkpoint, if one was written, is
    whole (saved with the signal held off; no temporary file is left behind)."""
    checkpoint = tmp_path / "run.pt"
    process = subprocess.Popen(
        [sys.executable, "-m", "esper.train", "--device", "cpu", "--threads", "1", "--envs", "1",
         "--steps", "2", "--iterations", "100000", "--checkpoint", str(checkpoint)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        # wait (at most 120 s) until training runs, and checkpoints, for real
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            line = process.stdout.readline() if ready else ""
            if line.startswith("iter") and int(line.split()[1]) >= 2:
                break
            assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 143, stderr
    assert "terminated (SIGTERM)" in stderr and "Traceback" not in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["iteration"] >= 1  # iteration 2 printed; its save may not have begun


def test_a_sigterm_that_another_thread_receives_waits_for_the_held_section_to_end():
    """The kernel hands a process's signal to any thread that does not block it, and
    Python then runs its handler in the main thread: a signal mask on the main thread held
    nothing (a SIGTERM mid-checkpoint ended the run with exit 3, torch's zip writer left
    at an unexpected position, or was lost and the run went on). Here a torch-like
    thread receives it while the main thread is inside `signals_held`."""
    import threading

    receiver = threading.Event()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: (receiver.set(), stop.wait(30)), daemon=True)
    worker.start()
    receiver.wait(5)
    finished_inside = False
    try:
        with pytest.raises(esper.train.Terminated):
            with esper.train.sigterm_raises():
                with esper.train.signals_held():
                    signal.pthread_kill(worker.ident, signal.SIGTERM)
                    for _ in range(1000):  # bytecodes, where Python runs its handlers
                        time.sleep(0)
                    finished_inside = True
    finally:
        stop.set()
        worker.join()
    assert finished_inside
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ------------------------------------------------------ checkpoints that cannot be resumed

def _saved_state(tmp_path) -> dict:
    """The state of a 1-iteration run of TINY, as its checkpoint holds it."""
    path = tmp_path / "good.pt"
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(path)]) == 0
    return torch.load(path, weights_only=True)


def _without_policy(state):
    del state["policy"]


def _policy_as_list(state):
    state["policy"] = [1, 2, 3]


def _old_format(state):
    state["format_version"] = 2


@pytest.mark.parametrize("damage, field_message", [
    (_without_policy, "policy: expected to be present; got nothing: the key is missing"),
    (_policy_as_list, "policy: expected a dict; got a list of 3 items"),
    (_old_format, "format_version: expected 3"),
])
def test_resume_of_a_damaged_checkpoint_exits_2_naming_the_file_and_the_field(
        capsys, tmp_path, damage, field_message):
    """A checkpoint without `policy` used to end in a KeyError traceback (exit 3)."""
    state = _saved_state(tmp_path)
    damage(state)
    damaged = tmp_path / "damaged.pt"
    torch.save(state, damaged)
    capsys.readouterr()
    err = run_main(capsys, *TINY, "--iterations", "2", "--resume", str(damaged))
    assert f"error: --resume: checkpoint {damaged}: {field_message}" in err


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_resume_of_a_truncated_checkpoint_exits_2(capsys, tmp_path, keep):
    good = tmp_path / "good.pt"
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(good)]) == 0
    cut = tmp_path / "cut.pt"
    data = good.read_bytes()
    cut.write_bytes(data[: int(len(data) * keep)])
    capsys.readouterr()
    err = run_main(capsys, *TINY, "--iterations", "2", "--resume", str(cut))
    assert f"--resume: checkpoint {cut}: expected a checkpoint written by save_checkpoint; got a " \
           "file torch.load cannot read" in err


def test_resume_of_a_torch_file_that_is_not_a_checkpoint_exits_2(capsys, tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(torch.zeros(2, 3), weights)
    err = run_main(capsys, *TINY, "--resume", str(weights))
    assert err.endswith(f"--resume: checkpoint {weights}: expected a checkpoint written by "
                        "save_checkpoint (a dict); got a torch file holding a float32 tensor of "
                        "shape [2, 3]")


# ------------------------------------------------------ checkpoint paths never clobber a file

def test_a_checkpoint_over_a_file_that_is_not_one_exits_2_and_leaves_it(capsys, tmp_path):
    """`--checkpoint notes.txt` (a typo for another name) used to overwrite the file."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    err = run_main(capsys, *TINY, "--checkpoint", str(notes))
    assert err.endswith(f"--checkpoint: expected a new file or a checkpoint to replace; got "
                        f"{notes}, an existing file that is not a checkpoint (it would be "
                        "overwritten)")
    assert notes.read_text() == "my notes"


def test_a_checkpoint_over_a_checkpoint_replaces_it(capsys, tmp_path):
    path = tmp_path / "run.pt"
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(path)]) == 0
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(path), "--seed", "5"]) == 0
    assert torch.load(path, weights_only=True)["identity"]["seed"] == 5


@pytest.mark.parametrize("path, got", [
    ("/dev/null", "/dev/null, not a regular file"),
    ("/proc/self/status", "/proc/self/status, an existing file that is not a checkpoint"),
    ("/proc/self/new.pt", "/proc/self/new.pt (/proc/self: "),
    ("a\0b.pt", "expected a path without NUL characters; got 'a\\x00b.pt'"),
])
def test_a_checkpoint_that_must_not_be_written_exits_2(capsys, path, got):
    """`--checkpoint /dev/null` run as root would have replaced the device by a file."""
    err = run_main(capsys, *TINY, "--checkpoint", path)
    assert "--checkpoint: expected " in err and got in err
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("path, got", [
    ("/dev/zero", "/dev/zero, not a regular file"),  # a read that never ends
    ("a\0b.pt", "expected a path without NUL characters; got 'a\\x00b.pt'"),
])
def test_a_resume_that_is_not_a_regular_file_exits_2(capsys, path, got):
    err = run_main(capsys, *TINY, "--resume", path)
    assert "--resume: expected " in err and got in err


def test_a_checkpoint_that_cannot_be_written_mid_run_exits_2_keeping_the_last(capsys, tmp_path):
    """A real failed write (the file-size limit stands in for a full disk; SIGXFSZ is
    ignored so that the write fails with EFBIG): one line, exit 2, the previous
    checkpoint whole, no temporary file."""
    path = tmp_path / "run.pt"
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(path)]) == 0
    before = path.read_bytes()
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        status = main([*TINY, "--iterations", "2", "--resume", str(path), "--checkpoint", str(path)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert status == 2
    err = capsys.readouterr().err
    assert (f"error: --checkpoint: expected a writable location; got {path}, where iteration 2's "
            "checkpoint could not be written (File too large); the previous one, if any, is "
            "unchanged") in err and "Traceback" not in err
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]


def test_the_next_start_removes_temporary_files_of_dead_writers_saying_so(capsys, tmp_path):
    path = tmp_path / "run.pt"
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it
    orphan = tmp_path / f"run.pt.{dead_pid}.tmp"
    orphan.write_bytes(b"half a checkpoint")
    working = tmp_path / "run.pt.1.tmp"  # pid 1 (init) is alive: a writer at work, kept
    working.write_bytes(b"")
    assert main([*TINY, "--iterations", "1", "--checkpoint", str(path)]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("removed")] == [
        f"removed {orphan}: a temporary checkpoint file of writer {dead_pid}, which is no "
        "longer running"]
    assert not orphan.exists() and working.exists()


# ------------------------------------------------------ threads, devices, NaN

@pytest.mark.parametrize("value", ["0", "-1", str(2**31), "1.5", ""])
def test_threads_outside_one_to_the_cpu_count_exit_2(capsys, value):
    """`--threads 2147483648` used to be passed to torch, which then fails to start them."""
    err = run_main(capsys, *TINY, "--threads", value)
    assert f"--threads: expected an int in [1, {MAX_THREADS + 1}); got " in err


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda:-1", "cpu:0:1", ""])
def test_a_device_that_is_not_one_exits_2_naming_it(capsys, value):
    err = run_main(capsys, "--envs", "1", "--device", value)
    assert "error: --device: " in err


class NaNRewards(VectorizedTrainer):
    """A planted fault: a NaN reward written into the buffer after each rollout, past
    `RolloutBuffer.add`'s own check (as a bug upstream of the update would)."""

    def rollout(self) -> float:
        mean_return = super().rollout()
        self.buffer.rewards[0, 0] = float("nan")
        return mean_return


def test_an_update_that_goes_nan_exits_3_in_one_line_naming_what(capsys, monkeypatch, tmp_path):
    """It used to print `pi nan` and train on with NaN weights (exit 0)."""
    monkeypatch.setattr(esper.train, "VectorizedTrainer", NaNRewards)
    path = tmp_path / "run.pt"
    assert main([*TINY, "--iterations", "3", "--checkpoint", str(path)]) == 3
    out, err = capsys.readouterr()
    assert "iter" not in out and "Traceback" not in err
    (line,) = [l for l in err.splitlines() if "error" in l]
    assert line.startswith("python -m esper.train: internal error (exit 3): PPO update, epoch 0: "
                           "non-finite losses (total nan, policy nan, value nan)")
    assert "rewards (1 of 2 nan)" in line
    assert not path.exists()  # no checkpoint of NaN weights


# ------------------------------------------------------ progress: a bar on a terminal only

def test_progress_in_a_log_is_plain_lines_without_carriage_returns(capsys):
    """Written into a log file, tqdm's bar was a run of carriage returns."""
    assert main([*TINY, "--iterations", "3"]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out and "\r" not in err
    assert iterations_printed(out) == [1, 2, 3]
    progress = [line for line in err.splitlines() if line.startswith("progress:")]
    # the first iteration, then (iterations of a few ms: never 30 s apart) the last
    assert [line.split(",")[0] for line in progress] == [
        "progress: iteration 1/3 (33%)", "progress: iteration 3/3 (100%)"]
    assert re.fullmatch(r"progress: iteration 3/3 \(100%\), \d+\.\d s, about 0\.0 s left",
                        progress[-1])


def test_progress_lines_come_every_so_many_seconds():
    stream = io.StringIO()
    progress = Progress(total=5, done=1, stream=stream, every_s=0.0)  # a resumed run
    for _ in range(4):
        progress.update()
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        f"progress: iteration {i}/5 ({100 * i // 5}%)" for i in (2, 3, 4, 5)]


class Terminal(io.StringIO):
    """A stand-in for a terminal: a text stream that says it is one (tqdm then draws its
    bar with carriage returns, as on a real terminal: the integration test uses a pty)."""

    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_a_live_bar(capsys, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([*TINY, "--iterations", "2"]) == 0
    assert "\r" in terminal.getvalue() and "2/2" in terminal.getvalue()
    assert "progress:" not in terminal.getvalue()
    assert iterations_printed(capsys.readouterr().out) == [1, 2]


@pytest.mark.slow
@pytest.mark.integration  # launches a Python process on a pseudo-terminal
def test_progress_on_a_real_terminal_is_a_live_bar(tmp_path):
    import fcntl
    import pty
    import struct
    import termios
    import threading

    leader, follower = pty.openpty()
    # 24 rows x 80 columns, as a terminal window says (a new pty says 0 x 0: no room for a bar)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    chunks: list[bytes] = []

    def read_terminal():  # while it runs: what is left unread at its exit may be dropped
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    process = subprocess.Popen(
        [sys.executable, "-m", "esper.train", *TINY, "--threads", "1", "--iterations", "2"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    out, _ = process.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(leader)
    terminal = b"".join(chunks).decode()
    assert process.returncode == 0, terminal
    assert "\r" in terminal and "2/2" in terminal and "progress:" not in terminal
    assert "\r" not in out and iterations_printed(out) == [1, 2]


# ------------------------------------------------------ found by tests/esper/test_train_fuzz.py

@pytest.mark.parametrize("option", ["--envs", "--variants", "--checkpoint"])
def test_an_option_given_the_end_of_options_marker_exits_2(capsys, option):
    """argparse 3.11 reads `--envs=--` as an empty list, which ended in an AttributeError;
    3.12 reads the string '--' (a checkpoint file named '--'). One answer on both."""
    err = run_main(capsys, *TINY, f"{option}=--")
    assert re.search(rf"error: {option}: expected one value; got (\[\]|'--')$", err), err


@pytest.mark.parametrize("path", ["a\nb.pt", "a\rb.pt", "a\x1eb.pt", "\udcff.pt"])
def test_a_message_quoting_a_path_with_line_breaks_stays_one_line(capsys, path):
    """`str.splitlines` also breaks at \\r and \\x1c-\\x1e: they are escaped."""
    err = run_main(capsys, *TINY, "--resume", path)
    escaped = path.encode("unicode_escape").decode("ascii")
    assert err.endswith(f"--resume: expected a checkpoint file; got {escaped}, which does not "
                        "exist")
