"""The main job agrees with itself on any CPU: every variant's check passes under other
kernel paths and thread counts, as on another machine.

`ATEN_CPU_CAPABILITY` picks ATen's vectorised kernels (default, avx2, avx512) and
`ONEDNN_MAX_CPU_ISA` caps oneDNN's (SSE41, AVX2): together with the thread count they
decide the rounding of every reduction and matrix product, as another CPU would. Each
condition is one quick run of every finding with sampling cut to the minimum (the checks
are the point, not the timings); it must end in exit 0 with no mismatch row. CI runs
ATen's default path and oneDNN capped at AVX2, at one thread (the other tests run the
machine's own path at its thread count); `-m long` adds ATen's avx2 (two threads) and
avx512 and oneDNN's SSE4.1 (two threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


#: CI runs the first (ATen's slowest path, at one thread); `-m long` every one
CONDITIONS = [
    ({"ATEN_CPU_CAPABILITY": "default"}, 1),
    pytest.param({"ONEDNN_MAX_CPU_ISA": "AVX2"}, 1, marks=pytest.mark.long),
    pytest.param({"ATEN_CPU_CAPABILITY": "avx2"}, 2, marks=pytest.mark.long),
    pytest.param({"ATEN_CPU_CAPABILITY": "avx512"}, 1, marks=[pytest.mark.long, pytest.mark.skipif(
        not _has_avx512(), reason="this CPU has no AVX-512")]),
    pytest.param({"ONEDNN_MAX_CPU_ISA": "SSE41"}, 2, marks=pytest.mark.long),
]


@pytest.mark.integration  # one quick run of every finding per condition
@pytest.mark.parametrize("environment, threads", CONDITIONS,
                         ids=lambda v: v if isinstance(v, int) else ",".join(
                             f"{k}={x}" for k, x in v.items()))
def test_the_main_job_passes_its_checks_under_another_kernel_path(environment, threads,
                                                                   tmp_path):
    env = {**os.environ, **environment}
    done = subprocess.run(
        [sys.executable, "-m", "harness.run", "--quick", "--budget", "1", "--every-cell",
         "--no-profile", "--no-report", "--placebo", "none", "--threads", str(threads),
         "--device", "cpu", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    rows = (json.loads((folders[0] / "run.json").read_text()).get("summary") or []
            if len(folders) == 1 and (folders[0] / "run.json").is_file() else [])
    # what failed, first: a CPU this test never ran on says why in the first lines
    failed = [(r["finding"], r["case"], r["variant"], r.get("status"),
               r.get("error") or r.get("reason")) for r in rows
              if r.get("status") in ("mismatch", "failed")]
    assert failed == [], failed
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    checked = [r for r in rows if r.get("max_error") is not None]
    assert checked, "no variant was checked against a reference"
    if "ATEN_CPU_CAPABILITY" in environment:  # the condition took hold in the run's process
        capability = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
            env=env, capture_output=True, text=True).stdout.strip()
        assert capability.lower() == environment["ATEN_CPU_CAPABILITY"]


def test_a_kernel_path_set_by_the_environment_gets_its_own_compile_cache():
    """inductor keys its cached C++ by neither variable: code built for one path failed to
    compile under another (`ATEN_CPU_CAPABILITY=default` after AVX-512 runs, one cache)."""
    from harness.measure.machine import isolate_compile_cache

    environ = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    folder = isolate_compile_cache(environ)
    assert folder.endswith("kernel-path-aten_cpu_capability-default-onednn_max_cpu_isa-SSE41")
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    # nor in inductor's one folder of precompiled headers for every path
    assert environ["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert isolate_compile_cache({}) is None  # the machine's own path: the usual cache
    mine = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/somewhere"}
    assert isolate_compile_cache(mine) is None and mine["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere"
    assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS" not in mine  # the user's cache: theirs


def test_the_cache_folder_inductor_writes_into_the_environment_is_not_taken_for_a_choice():
    """inductor sets TORCHINDUCTOR_CACHE_DIR to its default folder in the environment of
    any process that compiled, so every child inherits it: a test (or a user's script)
    that compiled before starting a run on another kernel path handed that run the shared
    folder, whose C++ built for the machine's own path failed to compile there (CI:
    `at::vec has not been declared`, B4-CR-03 compiled under ATEN_CPU_CAPABILITY=default)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from harness.measure.machine import isolate_compile_cache

    inherited = {"ATEN_CPU_CAPABILITY": "default", "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    folder = isolate_compile_cache(inherited)
    assert folder is not None and inherited["TORCHINDUCTOR_CACHE_DIR"] == folder != default_cache_dir()
