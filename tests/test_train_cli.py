"""Tests of `python -m esper.train`: a subprocess smoke run with resume, and bad input."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from esper.train import main

REPO_ROOT = Path(__file__).resolve().parents[1]

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
    assert f"argument {flag}: expected a positive int; got {value}" in err


def test_resume_of_another_config_exits_2_naming_the_mismatch(capsys, tmp_path):
    checkpoint = str(tmp_path / "run.pt")
    tiny = ("--envs", "1", "--steps", "2", "--device", "cpu")
    assert main([*tiny, "--iterations", "1", "--checkpoint", checkpoint]) == 0
    err = run_main(capsys, "--envs", "1", "--steps", "3", "--device", "cpu", "--resume", checkpoint)
    assert "config mismatch: " in err and "max_steps: checkpoint has 2, this run has 3" in err


def test_resume_of_a_missing_checkpoint_exits_2(capsys, tmp_path):
    err = run_main(capsys, "--device", "cpu", "--resume", str(tmp_path / "absent.pt"))
    assert "absent.pt" in err
