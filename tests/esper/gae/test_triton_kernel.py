"""The Triton GAE kernel, run by Triton's CPU interpreter, equals the float64 reference.

TRITON_INTERPRET must be set before triton is imported, so the kernel runs in a fresh
Python process with it in the environment. Shapes cover several programs (envs past
BLOCK_ENVS = 8), several tiles (steps past BLOCK_STEPS = 64), ragged step counts
(0 and full included), stale NaN padding, random true terminals and truncations inside rows,
in float64, float32, bfloat16 and float16 (the last two computed in float32 and rounded
once: a 16-bit carry drifts past these tolerances).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import torch
from esper.gae import DEVICE_TYPES, compute_gae
from esper.gae.reference import reference_gae
from tests.gae_inputs import make_case

assert DEVICE_TYPES["triton"] == ("cpu",), DEVICE_TYPES.get("triton")
# relative to the largest |value|: float32 accumulation; for 16-bit inputs, one unit in
# the last place of the output dtype (the interpreter truncates a cast to bfloat16 where
# a GPU rounds to nearest); computing the carry in bfloat16 misses this by 2x and more
DTYPES = ((torch.float64, 1e-10), (torch.float32, 1e-5),
          (torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10))
shapes = [(1, 1, None), (3, 70, [0, 70, 33]), (9, 130, None), (17, 64, [64] * 17)]
for seed, (envs, steps, counts) in enumerate(shapes):
    for dtype, tolerance in DTYPES:
        case = make_case(envs, steps, seed, p_done=0.1, p_trunc=0.1, dtype=dtype,
                         step_counts=counts)
        for counts_as_tensor in (False, True):
            adv, ret = compute_gae(*case.args(counts_as_tensor), gamma=0.99, gae_lambda=0.95,
                                   method="triton")
            want_adv, want_ret = reference_gae(*case.args(), gamma=0.99, gae_lambda=0.95)
            assert adv.dtype == dtype and adv.shape == (envs, steps)
            for got, want in ((adv, want_adv), (ret, want_ret)):
                scale = max(1.0, want.abs().max().item())
                err = (got.double() - want).abs().max().item()
                assert err <= tolerance * scale, (envs, steps, dtype, err)


# host data per call: with tensor step counts none (gamma and lambda are filled on the
# device); a list of step counts becomes a tensor from host data on every call
from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


case = make_case(3, 10, 0, dtype=torch.float32)
for counts_as_tensor, from_host in ((True, False), (False, True)):
    args = case.args(counts_as_tensor)
    with Ops() as ops:
        compute_gae(*args, gamma=0.99, gae_lambda=0.95, method="triton")
    assert ("aten.lift_fresh" in ops.names) == from_host, (counts_as_tensor, ops.names[:8])
print("ok", len(shapes))
"""


@pytest.mark.slow
@pytest.mark.integration  # a Python process under TRITON_INTERPRET=1
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the `dev` extra installs it on Linux)")
def test_triton_kernel_under_the_interpreter_equals_the_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok 4"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_launch_happens_under_the_inputs_device():
    """Triton launches on the current CUDA device and its current stream; `gae_triton`
    makes the inputs' device current around the launch. Without a GPU this checks the
    guard it launches under; `test_triton_on_a_second_gpu` runs it where there are two."""
    import contextlib

    import torch

    from esper.gae.triton_kernel import launch_device

    guard = launch_device(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(launch_device(torch.device("cpu")), contextlib.nullcontext)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or _cuda_devices() < 2,
                    reason="needs two CUDA devices")
def test_triton_on_a_second_gpu():
    import torch

    from esper.gae import compute_gae
    from esper.gae.reference import reference_gae
    from tests.gae_inputs import make_case

    case = make_case(9, 130, 5, p_done=0.1, p_trunc=0.1, dtype=torch.float32, stale_padding=False)
    args = [t.to("cuda:1") if isinstance(t, torch.Tensor) else t for t in case.args()]
    with torch.cuda.device(0):
        adv, ret = compute_gae(*args, gamma=0.99, gae_lambda=0.95, method="triton")
        torch.cuda.synchronize("cuda:1")
    want_adv, want_ret = reference_gae(*case.args(), gamma=0.99, gae_lambda=0.95)
    assert adv.device == torch.device("cuda:1")
    torch.testing.assert_close(adv.cpu().double(), want_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.cpu().double(), want_ret, rtol=1e-5, atol=1e-5)
