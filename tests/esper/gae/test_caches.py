"""`esper.gae.caches`: whether the disk caches hold the compiled GAE methods yet, read
from the caches themselves after real compiles into empty folders."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

_PROBE = """
import torch
from esper.gae.caches import inductor_cache_cold, numba_cache_cold
from esper.gae.numba_kernel import gae_numba
print(numba_cache_cold(), inductor_cache_cold())
x = torch.zeros((2, 3))
flags = torch.zeros((2, 3), dtype=torch.bool)
gae_numba(x, x, flags, flags, x, torch.full((2,), 3), gamma=0.99, gae_lambda=0.95)
print(numba_cache_cold(), inductor_cache_cold())
torch.compile(lambda t: t * 2 + 1)(x)
print(numba_cache_cold(), inductor_cache_cold())
"""


@pytest.mark.slow  # numba's serial kernel and a torch.compile, from empty caches: 10-20 s
@pytest.mark.integration  # a fresh interpreter: numba reads NUMBA_CACHE_DIR at import
@pytest.mark.long  # two compiles from empty caches; CI warms them in every cold run test
def test_the_caches_read_cold_until_each_method_compiled_into_them(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:3] == ["True True", "False True", "False False"]
