"""TEST-short and TEST-long: a findings module with one long finding, which runs only when
named or with --all."""

from __future__ import annotations

import torch

from harness.findings import About, Case, Finding, max_abs_difference, register


def _finding(finding_id: str, long: bool) -> Finding:
    return Finding(
        id=finding_id, title="sum vs doubling then halving", claim="as fast",
        variants=("sum", "double"), baseline="sum", cases=[Case.of(n=64)],
        build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64),
        make_call=lambda v, x: (lambda: x.sum()) if v == "sum" else (lambda: (x + x).sum() / 2),
        check=max_abs_difference, tolerance=1e-9, long=long,
        about=About(
            duration_s=(20.0, 600.0) if long else None,
        ),
    )


register(_finding("TEST-short", long=False))
register(_finding("TEST-long", long=True))
