"""pytest-benchmark suite: every GAE method, buffer `add` and `get_batched_sequences`.

Left out of the default test run (`--ignore=tests/benchmarks` in pyproject). Run, save
and compare it as docs/gate.md shows. Inputs come from the harness's findings, so these
benchmarks time the same cases the harness reports; torch runs on one thread.
"""

from __future__ import annotations

import pytest
import torch

from esper.gae import METHODS, compute_gae
from harness.findings import Case
from harness.findings import select as select_findings
from esper_review.findings.gae_methods import GAMMA, LAMBDA, build_gae_inputs, gae_args
from esper_review.findings.step_counts import fill

CPU = torch.device("cpu")
#: (num_envs, max_steps); the per-env loop takes ~0.5 s a call at the large size, so it
#: runs at the small one only
GAE_SIZES = ((16, 25), (64, 150))
LOOP_MAX_ENV_STEPS = 16 * 25
BUFFER_CASE = Case.of(num_envs=4, max_steps=25)


pytestmark = pytest.mark.usefixtures("one_thread")


def _gae_params():
    for method in METHODS:
        for num_envs, max_steps in GAE_SIZES:
            if method == "loop" and num_envs * max_steps > LOOP_MAX_ENV_STEPS:
                continue
            yield pytest.param(method, num_envs, max_steps, id=f"{method}-{num_envs}x{max_steps}")


@pytest.mark.parametrize("method, num_envs, max_steps", list(_gae_params()))
def test_gae(benchmark, method, num_envs, max_steps):
    inputs = build_gae_inputs(Case.of(num_envs=num_envs, max_steps=max_steps, dones="random0.05"),
                              CPU, seed=0)
    args = gae_args(inputs, "step_counts_list" if method == "loop" else "step_counts_tensor")
    benchmark.group = f"gae {num_envs}x{max_steps}"
    advantages, _ = benchmark(compute_gae, *args, gamma=GAMMA, gae_lambda=LAMBDA, method=method)
    assert advantages.shape == (num_envs, max_steps)


@pytest.fixture(scope="module")
def rollout():
    """AUDIT-5.1's inputs: one buffer per add_checks value and every step's data."""
    finding = select_findings(["AUDIT-5.1-add-checks"])[0]
    return finding.build(BUFFER_CASE, CPU, 0)


@pytest.mark.parametrize("add_checks", ["none", "checked"])
def test_buffer_add(benchmark, rollout, add_checks):
    buffer, steps = rollout["buffers"][add_checks], rollout["steps"]
    benchmark.group = f"buffer add x{BUFFER_CASE['num_envs'] * BUFFER_CASE['max_steps']}"
    benchmark(fill, buffer, steps)
    assert buffer.get_batched_sequences(CPU)["states"].shape[:2] == (
        BUFFER_CASE["num_envs"], BUFFER_CASE["max_steps"])


@pytest.mark.parametrize("step_counts", ["list", "tensor", "cached"])
def test_get_batched_sequences(benchmark, step_counts):
    """B4-PT-05's timed call: the update's read of a full buffer."""
    finding = select_findings(["B4-PT-05"])[0]
    call = finding.make_call(step_counts, finding.build(BUFFER_CASE, CPU, 0))
    benchmark.group = "get_batched_sequences"
    batch = benchmark(call)
    assert batch["states"].shape[:2] == (BUFFER_CASE["num_envs"], BUFFER_CASE["max_steps"])
