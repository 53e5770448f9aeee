"""What a run was measured on: versions, device, CPU, the CPU kernel path, git state.

Two runs' timings are comparable when their fingerprints agree: the machine
(`FINGERPRINT_FIELDS`) and what decides which CPU kernels torch runs there (`KERNEL_FIELDS`,
from `kernel_path`). The kernel path can differ on one machine (`ATEN_CPU_CAPABILITY=default`,
another thread count), and a kernel difference reads as a change of the code.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

#: the metadata fields that identify the machine a run was measured on
FINGERPRINT_FIELDS = ("device_name", "cpu_model", "torch", "cuda", "python")
#: the metadata fields of the CPU kernel path (`kernel_path`, without the CPU's model)
KERNEL_FIELDS = ("cpu_flags", "aten_cpu_capability", "env_aten_cpu_capability",
                 "env_onednn_max_cpu_isa", "threads")
#: the CPU's flags that decide which kernels ATen, oneDNN and the compilers pick (x86:
#: vector widths and their integer, bf16 and fp16 forms, AMX; Arm: NEON and SVE)
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimdhp", "sve", "sve2")


def _cpuinfo(key: str) -> str | None:
    """The first `key : value` of /proc/cpuinfo (Linux), or None."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform's answer)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def kernel_path() -> dict:
    """What decides which CPU kernels torch runs in this process, each field with what
    it decides (recorded with every run, `describe`; compared by `fingerprint_changes`):

    - `cpu_model`: the CPU; with it, its caches, clocks and the vector units below.
    - `cpu_flags`: the CPU's kernel-relevant flags (`KERNEL_FLAGS`: avx2, avx512f, amx...,
      space-separated, from /proc/cpuinfo; '' where it cannot say): the widest kernels
      the CPU can run, for ATen, oneDNN and compiled code alike.
    - `aten_cpu_capability`: the vector ISA ATen's kernels dispatch to here
      (`torch.backends.cpu.get_cpu_capability()`: DEFAULT, AVX2, AVX512, ...), the CPU's
      best unless ATEN_CPU_CAPABILITY lowers it.
    - `env_aten_cpu_capability`: the ATEN_CPU_CAPABILITY environment value (None: unset)
      that caps it.
    - `env_onednn_max_cpu_isa`: the ONEDNN_MAX_CPU_ISA environment value (None: unset),
      which caps oneDNN's kernels (convolutions, linear layers, LSTM) the same way.
    - `threads`: torch's intra-op threads: how each kernel splits its work.
    """
    flags = set((_cpuinfo("flags") or _cpuinfo("Features") or "").split())
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": " ".join(flag for flag in KERNEL_FLAGS if flag in flags),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env_aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
        "env_onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "threads": torch.get_num_threads(),
    }


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
        **kernel_path(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "platform": platform.platform(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def fingerprint(metadata: dict) -> dict:
    """The machine and kernel path fields of a run's metadata (absent ones None)."""
    return {k: metadata.get(k) for k in (*FINGERPRINT_FIELDS, *KERNEL_FIELDS)}


def records_kernel_path(metadata: dict) -> bool:
    """Whether a run recorded its kernel path (runs made before it did record only its
    threads)."""
    return "aten_cpu_capability" in metadata


def fingerprint_changes(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for each fingerprint field where two runs' metadata
    differ: the machine's always, the kernel path's where both runs recorded it (their
    threads always)."""
    both = records_kernel_path(old) and records_kernel_path(new)
    fields = [*FINGERPRINT_FIELDS, *(k for k in KERNEL_FIELDS if both or k == "threads")]
    return [(k, old.get(k), new.get(k)) for k in fields if old.get(k) != new.get(k)]


#: the variables that move CPU kernels off the machine's own path (another machine, simulated)
KERNEL_PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def isolate_compile_cache(environ=os.environ) -> str | None:
    """On a kernel path set by `KERNEL_PATH_VARIABLES`, torch.compile's cache of its own
    (unless TORCHINDUCTOR_CACHE_DIR names one other than inductor's default, which inductor
    itself writes into the environment of every process that compiled): inductor keys its cached C++ by neither,
    and code built for one capability then fails to compile under another (seen: AVX-512
    code against a header built for ATen's default path). Inductor's precompiled headers
    stay in one folder for every path whatever TORCHINDUCTOR_CACHE_DIR says (130-150 MB
    each), so on such a path they are not made (TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0
    unless set): a cold compile of the GAE took 14.4 s without one here, 18.4 s making it.
    Returns the folder set, or None."""
    path = [f"{name.lower()}-{environ[name]}" for name in KERNEL_PATH_VARIABLES if environ.get(name)]
    if not path:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # inductor writes its default folder into the environment of any process that
    # compiled, so a child inherits it without anyone having chosen it
    chosen = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return None
    folder = os.path.join(default_cache_dir(), "kernel-path-" + "-".join(path))
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder  # the run's processes inherit it
    environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    return folder
