"""What a run records of the machine, and of what decides the CPU kernels torch runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.measure.machine import (
    FINGERPRINT_FIELDS, KERNEL_FIELDS, describe, fingerprint, fingerprint_changes, kernel_path,
)

REPO = Path(__file__).resolve().parents[3]


def test_the_kernel_path_names_what_decides_the_cpu_kernels():
    path = kernel_path()
    assert set(path) == {"cpu_model", *KERNEL_FIELDS}
    assert path["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert path["threads"] == torch.get_num_threads()
    assert path["env_aten_cpu_capability"] == os.environ.get("ATEN_CPU_CAPABILITY")
    assert path["env_onednn_max_cpu_isa"] == os.environ.get("ONEDNN_MAX_CPU_ISA")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx2 " in flags:  # the flags kept are the kernel-relevant ones the CPU has
        assert "avx2" in path["cpu_flags"].split()
    assert "sse" not in path["cpu_flags"].split() and "fpu" not in path["cpu_flags"].split()
    described = describe(torch.device("cpu"))
    assert {k: described[k] for k in path} == path  # recorded with every run


@pytest.mark.integration
def test_aten_cpu_capability_in_the_environment_changes_the_kernel_path():
    """The same machine, another kernel path: what --compare must not read as a change of
    the code."""
    script = ("from harness.measure.machine import kernel_path; p = kernel_path(); "
              "print(p['aten_cpu_capability'], p['env_aten_cpu_capability'])")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert done.stdout.split() == ["DEFAULT", "default"], done.stderr


def test_a_difference_of_kernel_path_is_told_from_one_of_machine():
    here = describe(torch.device("cpu"))
    assert set(fingerprint(here)) == {*FINGERPRINT_FIELDS, *KERNEL_FIELDS}
    default = {**here, "aten_cpu_capability": "DEFAULT", "env_aten_cpu_capability": "default"}
    assert fingerprint_changes(here, default) == [
        ("aten_cpu_capability", here["aten_cpu_capability"], "DEFAULT"),
        ("env_aten_cpu_capability", here["env_aten_cpu_capability"], "default")]
    older = {k: v for k, v in here.items() if k not in KERNEL_FIELDS or k == "threads"}
    # a run recorded before the kernel path was: compared on what both recorded
    assert fingerprint_changes(older, default) == []
    assert fingerprint_changes(older, {**here, "threads": here["threads"] + 1}) == [
        ("threads", here["threads"], here["threads"] + 1)]
