"""The registry of findings: each review claim as data plus a few small functions.

A `Finding` names the ticket, quotes its claim, lists the variants compared (one is the
baseline), the cases (sizes) to run, how inputs are built from a seed, how each variant
is called, and how its output is checked against the reference. Adding the next ticket
means one new module here that calls `register`, not a change to the runner.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

Inputs = Any
Call = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    """One size/setting of a finding; `params` keep their order for display."""

    params: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **params: Any) -> "Case":
        return cls(tuple(params.items()))

    def __getitem__(self, key: str) -> Any:
        return dict(self.params)[key]

    @property
    def label(self) -> str:
        """`num_envs=4,max_steps=25,dones=episode`: the case's identity in results."""
        return ",".join(f"{k}={v}" for k, v in self.params)


def _never(variant: str, case: Case, device: torch.device) -> str | None:
    return None


@dataclass(frozen=True)
class Finding:
    """A review claim turned into a measurement."""

    id: str
    """The ticket id, e.g. `B4-CR-03`."""
    title: str
    claim: str
    """The ticket's claim, quoted short."""
    variants: tuple[str, ...]
    baseline: str
    cases: Callable[[bool], list[Case]]
    """quick -> the cases to run (`quick=True` for CI-sized runs)."""
    build: Callable[[Case, torch.device, int], Inputs]
    """(case, device, seed) -> inputs, built once per case."""
    make_call: Callable[[str, Inputs], Call]
    """(variant, inputs) -> a zero-argument callable: the timed region."""
    check: Callable[[Any, Any], float] | None = None
    """(output, reference output) -> max error; None: nothing to check."""
    reference: Callable[[Inputs], Any] | None = None
    """inputs -> reference output; None: the baseline variant's output is the reference."""
    tolerance: Callable[[Case], float] = lambda case: 0.0
    skip: Callable[[str, Case, torch.device], str | None] = _never
    """(variant, case, device) -> why this cell is not run, or None."""
    extra_metrics: Callable[[str, Inputs], dict[str, float]] | None = None
    """(variant, inputs) -> extra per-variant numbers (phase seconds, host-blocked time)."""
    peers: tuple[str, ...] = ()
    """Variants that are other libraries' code, timed as comparators: reported like the
    others, but neither gated (`harness.gate`) nor counted as our best method."""
    paired: bool = False
    """Round k of every variant does the same work (e.g. iteration k of trainers built from
    one seed, which follow one trajectory): one call per sample, no calibration, and each
    ratio's interval is taken over the per-round ratios, so that what changes from one
    round to the next cancels out instead of widening the interval."""
    sample_metrics: Callable[[str, Inputs], dict[str, float]] | None = None
    """(variant, inputs) -> numbers about the call just sampled, read outside the timed
    region (e.g. that iteration's seconds per phase). Each sample row keeps them; each
    timed row gets their median, and in a paired finding each variant's row gets the
    per-round difference to the baseline, `<name>_diff` with `<name>_diff_low` /
    `<name>_diff_high` (95% bootstrap interval)."""
    min_bytes: Callable[[Case], int] | None = None
    """case -> bytes one call must read and write at least; with the run's copy bandwidth,
    rows get the achieved bandwidth and the cell its bandwidth floor (`harness.measure.bandwidth`)."""
    long: bool = False
    """A long finding (learning runs, many episodes): it runs only when named with
    `--findings` or with `--all`, never in the default run; its quick cases stay CI-sized."""
    duration_s: tuple[float, float] | None = None
    """About how many seconds its quick and its default cases take on a 2-core CPU
    (`harness.run --list` shows it; a long finding should say)."""
    ticket: str = ""
    """Where the claim comes from (a review ticket file name)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What a reader should know about the setup (what is skipped and why)."""

    def __post_init__(self) -> None:
        if self.baseline not in self.variants:
            raise ValueError(
                f"Finding {self.id}: baseline: expected one of {', '.join(self.variants)}; "
                f"got {self.baseline!r}"
            )
        stray = [p for p in self.peers if p not in self.variants]
        if stray:
            raise ValueError(
                f"Finding {self.id}: peers: expected variants of the finding; got {stray}"
            )


def max_abs_difference(output: torch.Tensor, reference: torch.Tensor) -> float:
    """max |output - reference| in float64: the check of findings whose variants must agree."""
    return (output.double().cpu() - reference.double().cpu()).abs().max().item()


FINDINGS: dict[str, Finding] = {}
#: finding id -> where it was registered: `built-in`, or the module that registered it
ORIGINS: dict[str, str] = {}
_loading: list[str] = []  # the modules being imported for their register calls, innermost last


def register(finding: Finding) -> Finding:
    """Add `finding` to the registry (what `harness.run` measures); its id must be new."""
    if not isinstance(finding, Finding):
        raise ValueError(f"register: finding: expected a Finding; got {type(finding).__name__}")
    if finding.id in FINDINGS:
        raise ValueError(f"register: finding id {finding.id!r} is already registered "
                         f"({ORIGINS.get(finding.id, 'by an earlier register call')}); "
                         "choose another id")
    FINDINGS[finding.id] = finding
    ORIGINS[finding.id] = _loading[-1] if _loading else "register()"
    return finding


class FindingsModuleError(ValueError):
    """A findings module that cannot be imported, or whose findings cannot be registered."""


def load_findings_module(name: str) -> list[str]:
    """Import the module `name` (`pkg.module`) for its `register` calls; the ids it added.

    The built-in findings are loaded first, so an id that clashes with one is an error.
    A module that fails to import registers nothing: what it registered before failing
    is taken back, and the error names the module and shows the cause.
    """
    _load_builtin()
    if name in sys.modules:  # imported earlier (by an earlier run in this process)
        return [i for i, origin in ORIGINS.items() if origin == name]
    before = set(FINDINGS)
    _loading.append(name)
    try:
        importlib.import_module(name)
    except Exception as err:  # any error while importing user code: named, with its cause
        for added in set(FINDINGS) - before:
            del FINDINGS[added], ORIGINS[added]
        sys.modules.pop(name, None)
        frames = [f for f in traceback.extract_tb(err.__traceback__)
                  if not f.filename.startswith("<frozen")]  # importlib's own frames say nothing
        where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        raise FindingsModuleError(
            f"--findings-module {name}: expected an importable module that registers "
            f"findings; importing it raised {type(err).__name__}: {err}{where}") from err
    finally:
        _loading.pop()
    return [i for i in FINDINGS if i not in before]


def select(ids: list[str] | None, include_long: bool = False) -> list[Finding]:
    """The findings named by `ids`, in registry order; when None, every finding that is
    not `long` (all of them with `include_long`)."""
    _load_builtin()
    if not ids:
        return [f for f in FINDINGS.values() if include_long or not f.long]
    unknown = [i for i in ids if i not in FINDINGS]
    if unknown:
        raise ValueError(
            f"--findings: unknown id(s) {', '.join(unknown)}; known: {', '.join(FINDINGS)}"
        )
    return [FINDINGS[i] for i in FINDINGS if i in ids]


def _load_builtin() -> None:
    # imported for their `register` calls; late, so that `Finding` exists first
    # in report order: the buffer-level tickets, the vectorized review, end to end
    _loading.append("built-in")
    try:
        from harness.findings import gae_methods, reset_alloc, step_counts  # noqa: F401
        from harness.findings import batched_transfer, stream_sync, env_pooling, redundant_is_cuda, bootstrap_tensor, mask_stacking, grad_scaler, seed_grad_clip, fused_accumulators, time_limit, e2e  # noqa: F401,E501
    finally:
        _loading.pop()
