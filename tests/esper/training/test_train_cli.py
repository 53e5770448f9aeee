"""Tests of `python -m esper.train`: a subprocess smoke run with resume, and bad input."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from esper.train import MAX_ENVS, main

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
                    "--iterations", "3", "--variants", "optimized")
    assert resumed.returncode == 0, resumed.stderr
    assert iterations_printed(resumed.stdout) == [3], resumed.stdout  # 1 and 2 were done


def run_main(capsys, *argv: str) -> str:
    """Run the CLI in this process, expecting exit status 2; returns its stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_exits_2_with_a_clear_message(capsys):
    err = run_main(capsys, "--device", "cuda")
    assert "error: device: 'cuda' was asked for, but torch.cuda.is_available() is False" in err


@pytest.mark.parametrize("spec, message", [
    ("gae=nope", "Variants.gae: expected one of loop, batched, scan"),
    ("speed=max", "unknown axis 'speed'; valid axes: reset, step_counts, gae, sync"),
    ("fast", "expected 'axis=value' or 'original'/'optimized'; got 'fast'"),
])
def test_bad_variants_exit_2_naming_the_valid_ones(capsys, spec, message):
    assert message in run_main(capsys, "--variants", spec)


@pytest.mark.parametrize("flag", ["--envs", "--steps", "--iterations"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_non_positive_sizes_exit_2_naming_the_argument(capsys, flag, value):
    err = run_main(capsys, flag, value, "--device", "cpu")
    expected = f"an int in [1, {MAX_ENVS}]" if flag == "--envs" else "a positive int"
    assert f"argument {flag}: expected {expected}; got {value}" in err


def test_resume_of_another_config_exits_2_naming_the_mismatch(capsys, tmp_path):
    checkpoint = str(tmp_path / "run.pt")
    tiny = ("--envs", "1", "--steps", "2", "--device", "cpu")
    assert main([*tiny, "--iterations", "1", "--checkpoint", checkpoint]) == 0
    err = run_main(capsys, "--envs", "1", "--steps", "3", "--device", "cpu", "--resume", checkpoint)
    assert "config mismatch: " in err and "max_steps: checkpoint has 2, this run has 3" in err


def test_resume_of_a_missing_checkpoint_exits_2(capsys, tmp_path):
    err = run_main(capsys, "--device", "cpu", "--resume", str(tmp_path / "absent.pt"))
    assert "absent.pt" in err


def test_resume_of_a_file_that_is_not_a_checkpoint_says_so_in_one_line(capsys, tmp_path):
    """torch.load's own message for it is a page that suggests weights_only=False: loading
    an unknown file that way can run arbitrary code, so the error must not pass that on."""
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    err = run_main(capsys, "--device", "cpu", "--resume", str(text))
    (line,) = [l for l in err.splitlines() if "error:" in l]
    assert f"resume {text}: expected a checkpoint written by save_checkpoint" in line
    assert "UnpicklingError" in line
    assert "weights_only" not in err and len(err.splitlines()) <= 8  # the usage, then one line


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
    assert "iter" not in capsys.readouterr().out


def test_a_checkpoint_that_cannot_be_written_exits_2_before_training(capsys, tmp_path):
    """Its folder would be a plain file: nothing can be written there (whoever runs it,
    root included, which ignores permission bits)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    err = run_main(capsys, *TINY, "--checkpoint", str(blocker / "run.pt"))
    assert "--checkpoint: expected a writable location" in err and "not-a-folder" in err
    assert "iter" not in capsys.readouterr().out


def test_resuming_a_checkpoint_at_or_past_iterations_exits_2_saying_so(capsys, tmp_path):
    """It used to do nothing and say nothing."""
    checkpoint = str(tmp_path / "run.pt")
    assert main([*TINY, "--iterations", "2", "--checkpoint", checkpoint]) == 0
    capsys.readouterr()
    for iterations in ("1", "2"):
        err = run_main(capsys, *TINY, "--resume", checkpoint, "--iterations", iterations)
        lines = [line for line in err.splitlines() if line.startswith("python -m esper.train: error")]
        assert lines == [f"python -m esper.train: error: --resume {checkpoint}: the checkpoint is "
                         f"at iteration 2, and --iterations {iterations} asks for no more; pass "
                         f"--iterations above 2 to train further"], err


@pytest.mark.parametrize("value", ["4097", "1000000000000"])
def test_too_many_envs_exit_2_naming_the_maximum(capsys, value):
    """`--envs 1000000000000` used to hang building envs."""
    err = run_main(capsys, "--envs", value, "--device", "cpu")
    assert f"argument --envs: expected an int in [1, {MAX_ENVS}]" in err and value in err


def test_a_rollout_larger_than_memory_exits_2_naming_the_sizes(capsys):
    err = run_main(capsys, "--envs", "4", "--steps", "1000000000000", "--device", "cpu")
    assert "--envs x --steps: expected a rollout that fits in memory" in err
    assert "4 x 1000000000000 steps" in err and "GiB" in err


@pytest.mark.parametrize("value", ["-1", str(2**64), "1.5"])
def test_a_seed_outside_the_seedable_range_exits_2(capsys, value):
    """`--seed -1` ended in a traceback from NumPy's SeedSequence."""
    err = run_main(capsys, "--seed", value, "--device", "cpu")
    assert "argument --seed" in err and value in err


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
