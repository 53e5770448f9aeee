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

REPO = Path(__file__).resolve().parents[1]

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
print("ok", len(shapes))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the `dev` extra installs it on Linux)")
def test_triton_kernel_under_the_interpreter_equals_the_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok 4"
