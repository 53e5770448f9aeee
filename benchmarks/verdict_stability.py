"""Do the harness's verdict words hold? A benchmark on real runs, not a unit test.

Each part measures one claim of the statistics (docs/statistics.md) on this machine and
writes its raw results as JSON into OUT; `table` turns them into the markdown table the
docs quote. Parts, in the order the docs give them:

    python benchmarks/verdict_stability.py repeat --runs 10 OUT
        default runs of this commit, one after the other: how often a row's word changes
        between consecutive runs, how often it moves between decisive words (faster,
        slower, same), and every run's placebo rows (the noise floor);
    python benchmarks/verdict_stability.py planted OUT
        one run of benchmarks/planted_findings.py: a +10% planted slowdown should read
        slower, a +3% one never faster;
    python benchmarks/verdict_stability.py processes --processes 5 OUT
        eight rows from 50 ns to 50 ms calls, each timed in fresh processes by this
        harness's sampling and by torch.utils.benchmark (each corrected for its own loop
        cost, measured with an empty call): the per-process offsets of a ratio, and the
        independent timer's cross-process median that `repeat`'s intervals should hold;
    python benchmarks/verdict_stability.py gate --runs 60 OUT
        check c of the gate on unchanged code (false alarms per gate run) and with the
        scan GAE planted 5, 10, 15 and 25% slower (power);
    python benchmarks/verdict_stability.py table OUT
        the tables.

Run it on an idle machine: every part measures time. `repeat` takes about 2.5 minutes a
run, `processes` about 15 minutes, `gate` about a minute a gate run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: rows timed by `processes`: (finding, case, variant), about 50 ns to 50 ms per call
ROWS = (
    ("H2-redundant-is-cuda", "batch_size=128", "stream"),
    ("L2-fused-accumulators", "values=0-d", "stacked"),
    ("H4-bootstrap-tensor", "num_envs=4", "copy"),
    ("H5-mask-stacking", "num_envs=4", "preallocated"),
    ("B4-CR-03", "num_envs=4,max_steps=25,dones=episode", "scan"),
    ("B4-DRL-03", "num_envs=4,max_steps=25,dones=episode", "mask"),
    ("C1-grad-scaler", "train_batches=2", "per_optimizer"),
    ("B4-DRL-03", "num_envs=16,max_steps=150,dones=episode", "mask"),
)
DECISIVE = ("faster", "slower", "same")


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          **kwargs)


def _save(out: Path, name: str, document) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(document, indent=1))
    print(f"wrote {out / name}.json", file=sys.stderr)


def _load(out: Path, name: str):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _summary_rows(results: Path) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from harness.results import load_run

    run = load_run(None, results)
    return run.summary.astype(object).where(run.summary.notna(), None).to_dict("records")


# ----------------------------------------------------------------------------- repeat

def repeat(args) -> None:
    """`args.runs` default runs, one after the other, each into its own results folder."""
    runs = []
    for index in range(args.runs):
        results = args.out / "repeat" / f"run{index}"
        started = time.perf_counter()
        done = _python("-m", "harness.run", "--out", str(results), "--no-report",
                       *args.run_args)
        seconds = time.perf_counter() - started
        if done.returncode not in (0, 1):
            raise SystemExit(f"run {index} failed ({done.returncode}): {done.stderr[-2000:]}")
        runs.append({"seconds": seconds, "rows": _summary_rows(results)})
        print(f"repeat: run {index + 1}/{args.runs} in {seconds:.0f} s", file=sys.stderr)
        _save(args.out, "repeat", runs)


def _words(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["finding"], r["case"], r["variant"]): r for r in rows
            if r.get("verdict") in (*DECISIVE, "inconclusive") and not r.get("placebo")}


def stability(runs: list[dict]) -> dict:
    """Consecutive pairs of runs: rows compared, rows whose word changed, rows that moved
    between two decisive words."""
    compared = changed = moved = 0
    examples = []
    for first, second in zip(runs, runs[1:]):
        a, b = _words(first["rows"]), _words(second["rows"])
        for key in a.keys() & b.keys():
            compared += 1
            wa, wb = a[key]["verdict"], b[key]["verdict"]
            if wa != wb:
                changed += 1
                if wa in DECISIVE and wb in DECISIVE:
                    moved += 1
                    examples.append(f"{'/'.join(key)}: {wa} -> {wb}")
    return {"pairs": len(runs) - 1, "compared": compared, "changed": changed, "moved": moved,
            "moved_examples": examples[:10]}


def placebos(runs: list[dict]) -> dict:
    rows = [r for run in runs for r in run["rows"] if r.get("placebo") and r.get("ratio")]
    words = [r["verdict"] for r in rows]
    return {"cells": len(rows), "same": words.count("same"),
            "decisive": sum(w in ("faster", "slower") for w in words),
            "inconclusive": words.count("inconclusive"),
            "decisive_examples": [f"{r['finding']} {r['case']}: {r['verdict']} {r['ratio']:.3g} "
                                  f"[{r['ci_low']:.3g}-{r['ci_high']:.3g}]" for r in rows
                                  if r["verdict"] in ("faster", "slower")]}


# ----------------------------------------------------------------------------- planted

def planted(args) -> None:
    results = args.out / "planted"
    done = _python("-m", "harness.run", "--findings-module", "benchmarks.planted_findings",
                   "--out", str(results), "--no-report", "--no-profile", *args.run_args)
    if done.returncode not in (0, 1):
        raise SystemExit(f"planted run failed ({done.returncode}): {done.stderr[-2000:]}")
    _save(args.out, "planted", _summary_rows(results))


def planted_table(rows: list[dict]) -> list[dict]:
    out = []
    for finding in ("PLANTED-10", "PLANTED-3"):
        mine = [r for r in rows if r["finding"] == finding and r["variant"] == "planted"
                and r.get("verdict") in (*DECISIVE, "inconclusive")]
        words = [r["verdict"] for r in mine]
        out.append({"finding": finding, "trials": len(mine),
                    **{w: words.count(w) for w in (*DECISIVE, "inconclusive")},
                    "median_ratio": statistics.median(r["ratio"] for r in mine) if mine else None})
    return out


# --------------------------------------------------------------------------- processes

WORKER = r'''
import gc, json, math, random, sys, time
import torch
import torch.utils.benchmark as tb
torch.set_num_threads(int(sys.argv[2]))
from harness import findings as registry
from harness.measure.estimate import rounds_estimate
from harness.measure.timing import CpuClock, Sampling, measure_interleaved
finding_id, case_label, variant = json.loads(sys.argv[1])
finding = registry.planned(registry.select([finding_id])[0], False)
case = next(c for c in finding.cases(False) if c.label == case_label)
inputs = finding.build(case, torch.device("cpu"), 0)
calls = {"baseline": finding.make_call(finding.baseline, inputs),
         "variant": finding.make_call(variant, inputs)}
ours = measure_interleaved(calls, CpuClock(), finding=finding_id, case=case_label,
                           reference="baseline",
                           sampling=Sampling(time_budget_s=float(sys.argv[3]), min_rounds=8,
                                             max_rounds=400, sequential=False,
                                             seed=random.randrange(1 << 30)))
estimate = rounds_estimate(ours["variant"].samples, ours["baseline"].samples)
empty = lambda: None
timers = {name: tb.Timer("fn()", globals={"fn": fn}) for name, fn in
          {**calls, "empty": empty}.items()}
reference = {name: [] for name in timers}
for _ in range(15):
    order = list(timers)
    random.shuffle(order)
    for name in order:
        reference[name].append(timers[name].blocked_autorange(min_run_time=0.05).median)
corrected = [(v - e) / (b - e) for v, b, e in zip(reference["variant"], reference["baseline"],
                                                  reference["empty"])]
print(json.dumps({"log_ratio": estimate.log_ratio, "se": estimate.se,
                  "seconds": min(ours["baseline"].median, ours["variant"].median),
                  "rounds": ours["variant"].n,
                  "reference_raw": [v / b for v, b in zip(reference["variant"],
                                                           reference["baseline"])],
                  "reference_corrected": corrected,
                  "reference_empty_s": reference["empty"],
                  "call_overhead_s": ours["variant"].call_overhead_s}))
'''


def processes(args) -> None:
    """Each row in `args.processes` fresh processes, in a shuffled order of (row, process)."""
    jobs = [(row, index) for row in ROWS for index in range(args.processes)]
    random.Random(0).shuffle(jobs)
    results = _load(args.out, "processes") or []
    done_jobs = {(tuple(r["row"]), r["process"]) for r in results}
    for count, (row, index) in enumerate(jobs):
        if (row, index) in done_jobs:
            continue
        done = _python("-c", WORKER, json.dumps(row), str(args.threads), str(args.budget),
                       timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{row}: {done.stderr[-2000:]}")
        results.append({"row": list(row), "process": index,
                        **json.loads(done.stdout.strip().splitlines()[-1])})
        _save(args.out, "processes", results)
        print(f"processes: {count + 1}/{len(jobs)} {row[0]} {row[2]}", file=sys.stderr)


def process_table(results: list[dict], runs: list[dict] | None) -> list[dict]:
    """Per row: our per-process ratios, their spread and what the rounds explain (the
    offset between processes), the independent timer's cross-process median (raw and
    loop-corrected), and how many of `runs`' intervals hold it."""
    out = []
    for row in ROWS:
        mine = [r for r in results if tuple(r["row"]) == row]
        if not mine:
            continue
        thetas = [r["log_ratio"] for r in mine]
        within = statistics.mean(r["se"] ** 2 for r in mine)
        spread = statistics.variance(thetas) if len(thetas) > 1 else float("nan")
        offset = math.sqrt(max(0.0, spread - within)) if len(thetas) > 1 else float("nan")
        raw = statistics.median(statistics.median(r["reference_raw"]) for r in mine)
        corrected = statistics.median(statistics.median(r["reference_corrected"]) for r in mine)
        held = total = 0
        for run in runs or []:
            found = [r for r in run["rows"] if (r["finding"], r["case"], r["variant"]) == row
                     and r.get("ci_low") is not None]
            if found:
                total += 1
                held += found[0]["ci_low"] <= corrected <= found[0]["ci_high"]
        out.append({"row": "/".join(row), "seconds": statistics.median(r["seconds"] for r in mine),
                    "processes": len(mine),
                    "ratios": [round(math.exp(t), 4) for t in thetas],
                    "process_sd": offset, "within_se": math.sqrt(within),
                    "reference_raw": raw, "reference_corrected": corrected,
                    "runs_holding": held, "runs": total})
    return out


# -------------------------------------------------------------------------------- gate

def gate(args) -> None:
    document = args.out / "gate-runs.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness.gate.quality", "--counters-runs", "0",
         "--invariant-runs", "0", "--ab-runs", str(args.runs),
         "--ab-planted-runs", str(args.planted_runs), "--ab-slowdowns", args.slowdowns,
         "--json", str(document)], cwd=REPO, text=True, stdout=subprocess.PIPE)
    if done.returncode != 0:
        raise SystemExit(f"harness.gate.quality failed ({done.returncode})")
    print(done.stdout)


def gate_table(document: list[dict]) -> list[dict]:
    out = []
    for scenario in document:
        runs = len(scenario["exit_codes"])
        flagged = sum(code == 1 for code in scenario["exit_codes"])
        out.append({"condition": scenario["condition"], "runs": runs, "flagged": flagged,
                    "seconds": statistics.median(scenario["seconds"]) if runs else None})
    return out


# ------------------------------------------------------------------------------- table

def table(args) -> None:
    runs = _load(args.out, "repeat")
    lines = []
    if runs:
        s = stability(runs)
        p = placebos(runs)
        lines += ["| claim | measured |", "|---|---|",
                  f"| two default runs of one commit: rows moving between decisive words | "
                  f"{s['moved']} of {s['compared']} ({s['pairs']} consecutive pairs) |",
                  f"| ... rows changing word at all | {s['changed']} of {s['compared']} "
                  f"({100 * s['changed'] / max(s['compared'], 1):.1f}%) |",
                  f"| placebo rows reading faster or slower | {p['decisive']} of {p['cells']} "
                  f"({100 * p['decisive'] / max(p['cells'], 1):.1f}%) |",
                  f"| placebo rows reading same | {p['same']} of {p['cells']} "
                  f"({100 * p['same'] / max(p['cells'], 1):.0f}%) |",
                  f"| default run time (median of {len(runs)}) | "
                  f"{statistics.median(r['seconds'] for r in runs):.0f} s |"]
        if s["moved_examples"]:
            lines += ["", "Moved: " + "; ".join(s["moved_examples"])]
        if p["decisive_examples"]:
            lines += ["", "Decisive placebos: " + "; ".join(p["decisive_examples"])]
    rows = _load(args.out, "planted")
    if rows:
        lines += ["", "| planted | trials | slower | same | faster | inconclusive | median ratio |",
                  "|---|---|---|---|---|---|---|"]
        for r in planted_table(rows):
            lines.append(f"| {r['finding']} | {r['trials']} | {r['slower']} | {r['same']} | "
                         f"{r['faster']} | {r['inconclusive']} | {r['median_ratio']:.3g} |")
    results = _load(args.out, "processes")
    if results:
        lines += ["", "| row | call | processes | per-process ratios | offset sd | within se | "
                  "torch.utils.benchmark raw / loop-corrected | runs whose interval holds it |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in process_table(results, runs):
            lines.append(
                f"| {r['row']} | {r['seconds'] * 1e6:.3g} us | {r['processes']} | "
                f"{', '.join(f'{x:.3f}' for x in r['ratios'])} | {100 * r['process_sd']:.2f}% | "
                f"{100 * r['within_se']:.2f}% | {r['reference_raw']:.3f} / "
                f"{r['reference_corrected']:.3f} | {r['runs_holding']} of {r['runs']} |")
    document = _load(args.out, "gate-runs")
    if document:
        lines += ["", "| gate check c | runs | failed the gate | seconds per run |",
                  "|---|---|---|---|"]
        for r in gate_table(document):
            lines.append(f"| {r['condition']} | {r['runs']} | {r['flagged']} | "
                         f"{r['seconds']:.0f} |")
    print("\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    sub = p.add_subparsers(dest="part", required=True)
    for name in ("repeat", "planted", "processes", "gate", "table"):
        part = sub.add_parser(name)
        part.add_argument("out", type=Path)
        if name in ("repeat", "planted"):
            part.add_argument("--run-args", nargs=argparse.REMAINDER, default=[],
                              help="more options for harness.run")
    sub.choices["repeat"].add_argument("--runs", type=int, default=10)
    sub.choices["processes"].add_argument("--processes", type=int, default=5)
    sub.choices["processes"].add_argument("--threads", type=int, default=2)
    sub.choices["processes"].add_argument("--budget", type=float, default=1.0)
    sub.choices["gate"].add_argument("--runs", type=int, default=60)
    sub.choices["gate"].add_argument("--planted-runs", type=int, default=10)
    sub.choices["gate"].add_argument("--slowdowns", default="1.05,1.10,1.15,1.25")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(REPO))
    {"repeat": repeat, "planted": planted, "processes": processes, "gate": gate,
     "table": table}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
