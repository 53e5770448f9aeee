"""`python -m harness.gate`: the CI performance regression gate.

Three checks, one markdown table (check, finding, variant, case, baseline, current,
change, verdict) on stdout:

  --counters     a. op calls, host syncs, allocations and allocated bytes of every quick
                    case, exactly against results/baselines/counters.json
  --invariants   b. speed ratios within one process (e.g. scan >= 16x faster than loop at
                    16 x 25), against harness/gate/invariants.json
  --against REV  c. paired A/B timing of this tree against a git revision, both timed in
                    alternation in each of several processes; fails a cell whose 95%
                    interval lies above 1 + threshold

With none of them: --counters --invariants. `--update-baseline` rewrites the counters file.

Exit status: 0 pass; 1 a regression (or a variant that raises); 2 usage error, or a
missing or outdated baseline (the message gives the command that creates it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness import findings as registry
from harness.gate import ab as gate_ab, counters as gate_counters, invariants as gate_invariants
from harness.gate.table import GateRow, UsageError, render_markdown, rows_document, summary_line
from harness.results import atomic_write_text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.gate", description=__doc__.split("\n")[0],
        epilog="exit status: 0 pass, 1 regression, 2 usage error or missing baseline",
    )
    checks = p.add_argument_group("checks (default: --counters --invariants)")
    checks.add_argument("--counters", action="store_true", help="a: exact counters vs the baseline")
    checks.add_argument("--invariants", action="store_true", help="b: in-process speed ratios")
    checks.add_argument("--against", metavar="REV",
                        help="c: paired A/B timing against a git revision (branch, tag, commit)")
    p.add_argument("--update-baseline", action="store_true",
                   help="measure the counters (twice, to prove them deterministic) and rewrite "
                        "the baseline file, then exit")
    p.add_argument("--baseline", type=Path, default=gate_counters.DEFAULT_BASELINE, metavar="FILE",
                   help="counters baseline (default results/baselines/counters.json)")
    p.add_argument("--config", type=Path, default=gate_invariants.DEFAULT_CONFIG, metavar="FILE",
                   help="invariants config (default harness/gate/invariants.json)")
    p.add_argument("--findings", nargs="+", metavar="ID",
                   help="findings for the counters and A/B checks (default: counters "
                        f"{' '.join(gate_counters.GATED_FINDINGS)}; "
                        f"A/B {' '.join(gate_ab.ABOptions.findings)})")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="also write the rows, with their numbers, as JSON to FILE")
    p.add_argument("--sessions", type=int, default=gate_ab.ABOptions.sessions, metavar="N",
                   help="A/B: worker processes, each timing both trees side by side "
                        f"(default {gate_ab.ABOptions.sessions}, at least 6)")
    p.add_argument("--threshold", type=float, default=gate_ab.ABOptions.threshold,
                   metavar="FRACTION",
                   help=f"A/B: slow-down that fails, as a fraction (default "
                        f"{gate_ab.ABOptions.threshold})")
    return p


def _findings(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """`--findings` (or the check's default), each id checked against the registry."""
    ids = tuple(args.findings or default)
    try:
        registry.select(list(ids))
    except ValueError as err:  # the registry names the unknown and the known ids
        raise UsageError(str(err)) from err
    return ids


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _update(args: argparse.Namespace) -> int:
    if args.counters or args.invariants or args.against:
        raise UsageError("--update-baseline: expected on its own; got it with a check option")
    findings = _findings(args, gate_counters.GATED_FINDINGS)
    cells = gate_counters.update_baseline(args.baseline, findings)
    recorded = sum(c.counts is not None for c in cells)
    print(f"wrote {args.baseline}: {recorded} cells of {', '.join(findings)} "
          f"(each counted twice, identical)")
    return 0


def run_checks(args: argparse.Namespace) -> list[GateRow]:
    """The rows of every selected check, in the order a, b, c."""
    run_default = not (args.counters or args.invariants or args.against)
    rows: list[GateRow] = []
    if args.counters or run_default:
        started = time.perf_counter()
        findings = _findings(args, gate_counters.GATED_FINDINGS)
        rows += gate_counters.check_counters(args.baseline, findings)
        _progress(f"counters: {time.perf_counter() - started:.1f} s")
    if args.invariants or run_default:
        started = time.perf_counter()
        rows += gate_invariants.check_invariants(gate_invariants.load_config(args.config))
        _progress(f"invariants: {time.perf_counter() - started:.1f} s")
    if args.against:
        started = time.perf_counter()
        options = gate_ab.ABOptions(
            findings=_findings(args, gate_ab.ABOptions.findings),
            sessions=args.sessions, threshold=args.threshold,
        )
        rows += gate_ab.check_against(args.against, options, progress=_progress)
        _progress(f"A/B: {time.perf_counter() - started:.1f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.update_baseline:
            return _update(args)
        rows = run_checks(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except gate_ab.WorkerFailed as err:
        print(f"error: the current tree cannot be measured: {err}", file=sys.stderr)
        return 1
    print(render_markdown(rows))
    print()
    print(summary_line(rows))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(rows_document(rows), indent=1) + "\n")
    return 1 if any(row.outcome.fails for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
