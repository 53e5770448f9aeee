"""examples/torchrl_gae end to end, as its README runs it: a claim about TorchRL's GAE
measured from the example's own folder (its pyproject.toml names the findings module,
the baseline and the invariants), then gated. Quick cases; about 40 s on a 2-core CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import load_run

#: real launches of the harness (torchrun, fresh processes): `pytest -m integration`; the
#: example needs TorchRL (found, not imported: importing it loads torch._dynamo, 3 s, in
#: every process that merely collects this file)
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("torchrl") is None,
                                 reason="the example needs TorchRL (the peers extra)")]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrl_gae"
VARIANTS = {"ours", "torchrl_module", "torchrl_functional", "torchrl_vec"}


def _run(*args: str, cwd: Path = EXAMPLE) -> subprocess.CompletedProcess:
    """`python -m ARGS` in the example's folder, as a user would type it there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.long  # a minute: the example project end to end; CI runs a user's project (.ci/wheel)
def test_the_example_measures_reports_and_gates_its_claim(tmp_path):
    results, reports = tmp_path / "results", tmp_path / "reports"
    done = _run("harness.run", "--quick", "--out", str(results), "--reports", str(reports))
    assert done.returncode == 0, done.stderr  # every variant agreed with the float64 loop
    run = load_run(None, results)
    assert run.metadata["options"]["findings_module"] == ["gae_findings"]  # from pyproject.toml
    everything = run.summary
    assert set(everything["variant"]) == VARIANTS | {"placebo"}  # the headline's noise floor
    rows = everything[~everything["placebo"].astype(bool)]
    assert set(rows["finding"]) == {"GAE-torchrl"} and set(rows["variant"]) == VARIANTS
    assert set(rows["case"]) == {"num_envs=4,num_steps=1024", "num_envs=64,num_steps=1024"}
    assert (rows["status"] == "ok").all() and (rows["max_error"] <= 1e-4).all()
    compared = rows[rows["variant"] != "ours"]
    assert (compared["ci_low"] <= compared["ratio"]).all()
    assert (compared["ratio"] <= compared["ci_high"]).all()
    syncs = rows.groupby("variant")["host_syncs"].max()
    assert syncs["ours"] == 0 and syncs["torchrl_vec"] > 0  # TorchRL's vec path reads values back
    page = (reports / run.run_id / "index.html").read_text()
    assert "Switch our GAE loop to TorchRL&#39;s GAE module: ~4x faster" in page
    assert "GAE-torchrl" in page and (reports / run.run_id / "GAE-torchrl-speedup.png").is_file()

    baseline = tmp_path / "counters.json"
    done = _run("harness.gate", "--update-baseline", "--baseline", str(baseline))
    assert done.returncode == 0, done.stderr
    entries = json.loads(baseline.read_text())["counters"]
    assert len(entries) == 2 * len(VARIANTS)  # every variant at both quick cases

    # what CI runs in the user's repository: counters, and bench/invariants.json
    done = _run("harness.gate", "--baseline", str(baseline))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("| counters | GAE-torchrl |") == 2 * len(VARIANTS)
    assert "| invariant ours-vs-vec-64x1024 | GAE-torchrl | ours vs torchrl_vec |" in done.stdout
