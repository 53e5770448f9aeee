"""The Triton GAE kernel compiles ahead of time for real GPUs: sm_80 (A100) and sm_90 (H100).

`triton.compile` runs the whole pipeline without a GPU (Triton IR -> LLVM -> PTX, then the
`ptxas` bundled in the triton wheel -> cubin) for each input dtype the kernel accepts, with
the argument types a launch from `gae_triton` passes (16-bit inputs with float32 scalars,
as it computes in float32). With the interpreter test against the reference
(`test_triton_kernel.py`), this shows the kernel both computes the right thing and compiles
for the targets. Registers, spills and shared memory per target and dtype come from the
ptxas log and the kernel's metadata and are printed with the test output.

What only a GPU can tell: the speed, the occupancy actually reached, and the launcher's
own specializations (e.g. 16-byte-aligned pointers), which compile other variants.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest
import torch

pytestmark = [
    pytest.mark.integration,  # triton.compile runs ptxas, a process
    pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                       reason="triton is not installed (the `dev` extra installs it on Linux)"),
]

#: compute capability -> (name, shared memory a block may use, bytes)
TARGETS = {80: ("sm_80", 163 * 1024), 90: ("sm_90", 227 * 1024)}
#: Triton's pointer types for the input dtypes
POINTER = {torch.float64: "*fp64", torch.float32: "*fp32", torch.bfloat16: "*bf16",
           torch.float16: "*fp16"}


def _signature(dtype: torch.dtype) -> dict[str, str]:
    from esper.gae.triton_kernel import compute_dtype

    data, scalars = POINTER[dtype], POINTER[compute_dtype(dtype)]
    return {"rewards": data, "values": data, "dones": "*u8", "truncated": "*u8",
            "bootstrap": data, "step_counts": "*i64", "scalars": scalars,
            "advantages": data, "returns": data, "num_envs": "i32", "max_steps": "i32",
            "BLOCK_ENVS": "constexpr", "BLOCK_STEPS": "constexpr"}


def _ptxas_usage(log: str) -> dict[str, int]:
    """Registers and spill bytes from a `ptxas -v` log."""
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert registers and spills, f"no resource usage in the ptxas log:\n{log}"
    return {"registers": int(registers.group(1)), "spill_stores": int(spills.group(1)),
            "spill_loads": int(spills.group(2))}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[tuple[int, torch.dtype], dict]:
    """(capability, dtype) -> resource usage, compiled once into a fresh cache (a cache
    hit would skip ptxas and its log)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from esper.gae import triton_kernel

    usage = {}
    with triton.knobs.cache.scope(), triton.knobs.nvidia.scope():
        triton.knobs.cache.dir = str(tmp_path_factory.mktemp("triton-cache"))
        triton.knobs.nvidia.dump_ptxas_log = True
        for capability in TARGETS:
            for dtype in POINTER:
                source = ASTSource(
                    fn=triton_kernel._gae_kernel, signature=_signature(dtype),
                    constexprs={"BLOCK_ENVS": triton_kernel.BLOCK_ENVS,
                                "BLOCK_STEPS": triton_kernel.BLOCK_STEPS},
                )
                log = io.StringIO()
                with contextlib.redirect_stdout(log):  # the ptxas log is printed
                    kernel = triton.compile(
                        source, target=GPUTarget("cuda", capability, 32),
                        options={"num_warps": triton_kernel.NUM_WARPS, "enable_fp_fusion": True},
                    )
                usage[capability, dtype] = {
                    **_ptxas_usage(log.getvalue()), "shared_bytes": kernel.metadata.shared,
                    "ptx": kernel.asm["ptx"], "cubin_bytes": len(kernel.asm["cubin"]),
                    "arch": kernel.metadata.target.arch,
                }
    return usage


@pytest.mark.parametrize("capability", sorted(TARGETS))
@pytest.mark.parametrize("dtype", list(POINTER), ids=lambda d: str(d).removeprefix("torch."))
def test_the_kernel_compiles_for_the_target(compiled, capability, dtype):
    got = compiled[capability, dtype]
    name, shared_limit = TARGETS[capability]
    assert got["arch"] == capability and got["cubin_bytes"] > 0
    assert re.search(rf"\.target {name}a?\b", got["ptx"]), f"PTX not for {name}"
    assert ".entry _gae_kernel" in got["ptx"]
    assert got["registers"] <= 255  # the hardware's per-thread maximum
    assert got["spill_stores"] == 0 and got["spill_loads"] == 0  # no local-memory spills
    assert got["shared_bytes"] <= shared_limit


def test_resource_usage_is_reported(compiled, capsys):
    """Prints the table with the test output (`pytest -s` or the `-rA` summary)."""
    lines = ["Triton GAE kernel, ahead of time "
             "(BLOCK_ENVS x BLOCK_STEPS, warps from esper.gae.triton_kernel):"]
    for (capability, dtype), got in sorted(compiled.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        lines.append(f"  {TARGETS[capability][0]} {str(dtype).removeprefix('torch.'):9s} "
                     f"registers {got['registers']:3d}  spills {got['spill_stores']}/"
                     f"{got['spill_loads']} B (store/load)  shared {got['shared_bytes']} B")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == 1 + len(TARGETS) * len(POINTER)
