"""Peers (other libraries' GAE) agree with our reference and sit in B4-CR-03 as comparators."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from esper.gae import METHODS
from esper.gae.reference import reference_gae
from esper_review.findings import peers
from harness.findings import select
from harness.gate.counters import own_variants
from tests.gae_inputs import make_case

GAMMA, LAMBDA = 0.995, 0.98
CPU = torch.device("cpu")


def _b4_cr_03():
    return select(["B4-CR-03"])[0]


def _needs(name: str) -> None:
    if not peers.installed(name):
        pytest.skip(f"{name} needs {peers.PEERS[name].module}: {peers.INSTALL_HINT}")


@pytest.mark.parametrize("name", list(peers.PEERS))
@pytest.mark.parametrize(("num_envs", "max_steps", "seed"),
                         [(1, 1, 0), (2, 2, 1), (3, 17, 2), (8, 300, 3)])
def test_peer_agrees_with_the_reference_on_full_rows(name, num_envs, max_steps, seed):
    """Random true terminals and truncations anywhere (inside rows too), every row full."""
    _needs(name)
    case = make_case(num_envs, max_steps, seed, p_done=0.1, p_trunc=0.05, dtype=torch.float32,
                     step_counts=[max_steps] * num_envs, stale_padding=False)
    if max_steps == 300:  # the large case exercises both kinds of episode end mid-row
        assert (case.truncated[:, :-1]).any() and (case.dones & ~case.truncated).any()
    tensors = case.args()[:5]  # rewards, values, dones, truncated, bootstrap_values [E, T]
    peer = peers.PEERS[name]
    advantages = peer.compute(peer.prepare(*tensors, GAMMA), GAMMA, LAMBDA)
    want, _ = reference_gae(*case.args(), gamma=GAMMA, gae_lambda=LAMBDA)
    assert advantages.shape == (num_envs, max_steps)
    scale = max(1.0, want.abs().max().item())
    err = (advantages.double() - want).abs().max().item()
    assert err <= 1e-5 * scale, f"{name}: max error {err} (scale {scale})"


@pytest.mark.parametrize("name", list(peers.PEERS))
def test_peer_passes_the_findings_check_on_its_inputs(name):
    """B4-CR-03's own path: build (native layout prepared), call, check vs reference."""
    _needs(name)
    finding = _b4_cr_03()
    case = next(c for c in finding.cases(True) if c["dones"] == "random0.05")
    assert finding.skip(name, case, CPU) is None
    inputs = finding.build(case, CPU, 0)
    error = finding.check(finding.make_call(name, inputs)(), finding.reference(inputs))
    assert error <= finding.tolerance(case, torch.device("cpu"))


def test_torchrl_rows_are_skipped_with_the_install_command_when_it_is_missing():
    finding = _b4_cr_03()
    case = finding.cases(True)[0]
    for name in ("torchrl", "torchrl_vec"):
        reason = finding.skip(name, case, CPU, torchrl_installed=False)
        assert "TorchRL is not installed" in reason and 'pip install -e ".[peers]"' in reason
        assert finding.skip(name, case, CPU, torchrl_installed=True) is None
    assert finding.skip("sb3_numpy", case, CPU, torchrl_installed=False) is None


def test_variants_skip_devices_they_do_not_run_on():
    finding = _b4_cr_03()
    case = finding.cases(True)[0]
    cuda = torch.device("cuda")
    assert "sb3_numpy does not run on cuda" in finding.skip("sb3_numpy", case, cuda)
    if "numba" in METHODS:
        assert "numba does not run on cuda" in finding.skip("numba", case, cuda)
    assert finding.skip("scan", case, cuda) is None


def test_peers_are_b4_cr_03_variants_but_not_gated():
    finding = _b4_cr_03()
    assert set(peers.PEERS) <= set(finding.variants)
    assert finding.peers == ("torchrl", "torchrl_vec", "sb3_numpy")
    assert not set(finding.peers) & set(own_variants(finding))
    assert set(own_variants(finding)) == set(METHODS)


def test_importing_torchrl_leaves_the_process_start_method_as_it_was():
    """TorchRL's import sets multiprocessing's start method to spawn; the peer's first call
    puts back what the process had (here none set: fork's default on Linux), in a fresh
    interpreter, as a run's process is."""
    _needs("torchrl")
    program = ("import multiprocessing as mp, torch\n"
               "from esper_review.findings import peers\n"
               "peers._torchrl_function('generalized_advantage_estimate')\n"
               "assert 'torchrl' in __import__('sys').modules\n"
               "print(mp.get_start_method(allow_none=True))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "None"
