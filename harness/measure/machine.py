"""What a run was measured on: versions, device, CPU, threads; and git state."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

#: the metadata fields that must agree for two runs' timings to be comparable
FINGERPRINT_FIELDS = ("device_name", "cpu_model", "torch", "cuda", "threads", "python")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform's answer)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({cpu_model()})"


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding the folder `repo`; (None, None)
    outside git."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, dirty


def describe(device: torch.device) -> dict:
    """Metadata of this process for `device`; call it while threads are pinned."""
    return {
        "device": str(device),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def fingerprint(metadata: dict) -> dict:
    return {k: metadata.get(k) for k in FINGERPRINT_FIELDS}


#: the variables that move CPU kernels off the machine's own path (another machine, simulated)
KERNEL_PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def isolate_compile_cache(environ=os.environ) -> str | None:
    """On a kernel path set by `KERNEL_PATH_VARIABLES`, torch.compile's cache of its own
    (unless TORCHINDUCTOR_CACHE_DIR names one): inductor keys its cached C++ by neither,
    and code built for one capability then fails to compile under another (seen: AVX-512
    code against a header built for ATen's default path). Returns the folder set, or None."""
    path = [f"{name.lower()}-{environ[name]}" for name in KERNEL_PATH_VARIABLES if environ.get(name)]
    if not path or environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    folder = os.path.join(default_cache_dir(), "kernel-path-" + "-".join(path))
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder  # the run's processes inherit it
    return folder
