"""The first call of `esper.gae.compiled` on a machine with nothing compiled yet, in a
fresh interpreter whose temp dir and inductor cache are empty folders."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_FIRST_CALL = """
import torch
from esper.gae.compiled import gae_compiled
x = torch.zeros((4, 25))
flags = torch.zeros((4, 25), dtype=torch.bool)
gae_compiled(x, x, flags, flags, x, torch.full((4,), 25), gamma=0.99, gae_lambda=0.95)
"""


@pytest.mark.slow  # one torch.compile from empty caches: 10-20 s
@pytest.mark.integration
@pytest.mark.long  # one cold torch.compile: 40 s on the Xeon
def test_the_first_compile_builds_no_precompiled_header(tmp_path):
    """Inductor precompiles its C++ prefix header (about 150 MB) into a folder of the temp
    dir that no cache setting moves, keyed by the include paths, before compiling a kernel:
    3-4.5 s of the 13.5-15.3 s first call on the 2-core development machine, for the one
    kernel of this graph, and 150 MB more in the temp dir per virtual environment. The
    compiled GAE turns it off: its first call leaves no header in the temp dir."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(temp),
                               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp_path / "inductor").rglob("*.so")), "nothing was compiled"
    headers = [p.relative_to(temp) for p in temp.rglob("*.gch")]
    assert headers == []
