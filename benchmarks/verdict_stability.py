"""Do the harness's verdict words hold? A benchmark on real runs, not a unit test.

Each part measures one claim of the statistics (docs/statistics.md) on this machine and
writes its raw results as JSON into OUT; `table` turns them into the markdown table the
docs quote. Parts, in the order the docs give them:

    python benchmarks/verdict_stability.py repeat --runs 10 OUT
        default runs of this commit (reports included), one after the other: how often a
        row's word changes between consecutive runs, how often it moves between decisive
        words (faster, slower, same), every run's placebo rows (the noise floor) and the
        run time;
    python benchmarks/verdict_stability.py quick --runs 3 OUT
        `--quick` runs, reports included: their run time;
    python benchmarks/verdict_stability.py planted OUT
        one run of benchmarks/planted_findings.py: a +10% planted slowdown should read
        slower, a +3% one never faster;
    python benchmarks/verdict_stability.py processes --processes 5 OUT
        eight rows from 50 ns to 50 ms calls, each timed in fresh processes by this
        harness's sampling and by torch.utils.benchmark (each corrected for its own loop
        cost, measured with an empty call): the per-process offsets of a ratio, and the
        independent timer's cross-process median that `repeat`'s intervals should hold;
    python benchmarks/verdict_stability.py gate --runs 60 OUT
        check c of the gate, as `python -m harness.gate --against HEAD` runs it, on
        unchanged code (false alarms per gate run) and with the scan GAE planted 5, 10, 15
        and 25% slower (power; `--slowdowns` picks them), in chunks saved as they finish
        (a second call goes on to the counts asked for);
    python benchmarks/verdict_stability.py duet --processes 5 --seconds 3 OUT
        duet rounds (Bulej et al. 2020) against this harness's interleaved rounds, for the
        same seconds: two workers, one pinned to each core, time the baseline and the
        variant at one signal, swapping roles each round; per mode, the interval widths
        and the spread of fresh processes' estimates against their standard errors;
    python benchmarks/verdict_stability.py table OUT
        the tables (`docs/generate.py` puts them into the docs from the copy of OUT's
        JSON files committed in benchmarks/results/).

Run it on an idle machine: every part measures time. Measured on the 2-core development
CPU: `repeat` takes about 2.3 minutes a run, `quick` 40 s a run, `planted` 3 minutes,
`processes` about 12 minutes, `gate` 71-81 s a gate run (six worker sessions, each
timing both trees' 24 B4-CR-03 cells and compiling the `compiled` GAE for each).
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
    ("B4-PT-05", "num_envs=4,max_steps=25", "tensor"),
    ("B4-DRL-03", "num_envs=16,max_steps=150,dones=episode", "mask"),
)
DECISIVE = ("faster", "slower", "same")


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          **kwargs)


def _save(out: Path, name: str, document) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    temp.write_text(json.dumps(document, separators=(",", ":")))
    os.replace(temp, path)  # a killed benchmark leaves its last whole save
    print(f"wrote {out / name}.json", file=sys.stderr)


def _load(out: Path, name: str):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


#: the fields of a summary row the tables read (the rest is left out of the saved results)
ROW_FIELDS = ("finding", "case", "variant", "verdict", "placebo", "headline", "ratio",
              "ci_low", "ci_high", "status", "log_se", "process_sd", "processes")


def _summary_rows(results: Path) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from harness.results import load_run

    run = load_run(None, results)
    rows = run.summary.astype(object).where(run.summary.notna(), None).to_dict("records")
    return [{k: r.get(k) for k in ROW_FIELDS} for r in rows]


def _timed_runs(args, name: str, extra: tuple[str, ...]) -> None:
    """`args.runs` runs of this commit (with their reports, as a user runs them), one after
    the other, each into its own results folder; saved after each."""
    runs = _load(args.out, name) or []
    for index in range(len(runs), args.runs):
        results = args.out / name / f"run{index}"
        started = time.perf_counter()
        done = _python("-m", "harness.run", "--out", str(results), *extra, *args.run_args)
        seconds = time.perf_counter() - started
        if done.returncode not in (0, 1):
            raise SystemExit(f"run {index} failed ({done.returncode}): {done.stderr[-2000:]}")
        runs.append({"seconds": seconds, "rows": _summary_rows(results)})
        print(f"{name}: run {index + 1}/{args.runs} in {seconds:.0f} s", file=sys.stderr)
        _save(args.out, name, runs)


def repeat(args) -> None:
    """Default runs of this commit, reports included: stability, placebos, run time."""
    _timed_runs(args, "repeat", ())


def quick(args) -> None:
    """`--quick` runs of this commit, reports included: their run time."""
    _timed_runs(args, "quick", ("--quick",))


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
        for key in sorted(a.keys() & b.keys()):  # a set: its order changes with the hash seed
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

#: the start of every worker: argv[1] the row (finding, case, variant) as JSON, argv[2] the
#: torch threads; its baseline's and variant's calls built from seed 0, first calls not made
ROW_CALLS = r"""
import gc, json, math, os, random, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from harness import findings as registry
finding_id, case_label, variant = json.loads(sys.argv[1])
finding = registry.planned(registry.select([finding_id])[0], False)
case = next(c for c in finding.cases(False) if c.label == case_label)
inputs = finding.build(case, torch.device("cpu"), 0)
calls = {"baseline": finding.make_call(finding.baseline, inputs),
         "variant": finding.make_call(variant, inputs)}
"""

#: the harness's own interleaved rounds of `calls`: argv[3] seconds of sampling, at most
#: argv[4] rounds
INTERLEAVED_ROUNDS = r"""
from harness.measure.estimate import rounds_estimate
from harness.measure.timing import CpuClock, Sampling, measure_interleaved
ours = measure_interleaved(calls, CpuClock(), finding=finding_id, case=case_label,
                           reference="baseline",
                           sampling=Sampling(time_budget_s=float(sys.argv[3]), min_rounds=8,
                                             max_rounds=int(sys.argv[4]), sequential=False,
                                             seed=random.randrange(1 << 30)))
"""

WORKER = ROW_CALLS + INTERLEAVED_ROUNDS + r"""
import torch.utils.benchmark as tb
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
"""


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
                       "400", timeout=600)
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

def _merge_gate(saved: list[dict], chunk: list[dict]) -> list[dict]:
    """`saved` with `chunk`'s gate runs added to the scenario of the same condition."""
    per_run = ("exit_codes", "seconds", "ranks", "rows")  # one entry per gate run
    by_condition = {s["condition"]: s for s in saved}
    for scenario in chunk:
        mine = by_condition.setdefault(scenario["condition"], {
            **{k: v for k, v in scenario.items() if k not in per_run}, **{k: [] for k in per_run}})
        for key in per_run:
            mine[key] += scenario.get(key, [])
    return list(by_condition.values())


def _slowdown(condition: str) -> float:
    """1.0 for "unchanged", 1.15 for "scan 1.15x slower"."""
    return 1.0 if condition == "unchanged" else float(condition.rsplit(" ", 2)[-2][:-1])


def _gate_plan(counts: dict[str, int], runs: int, planted_runs: int,
               slowdowns: str) -> tuple[int, int, list[str]]:
    """What the next chunk still has to run, from the saved runs per condition: unchanged
    runs, planted runs per slowdown, and the slowdowns short of `planted_runs` (each goes
    on to its own count, so a second call may add slowdowns)."""
    factors: dict[float, str] = {}
    for text in slowdowns.split(","):
        try:
            factor = float(text)
        except ValueError:
            factor = math.nan
        if not factor > 1:
            raise SystemExit(f"--slowdowns: expected factors above 1, comma-separated; got "
                             f"{text!r}")
        factors.setdefault(factor, text)  # "1.1" and "1.10" are one condition
    saved = {_slowdown(condition): n for condition, n in counts.items()}
    needed = {text: planted_runs - saved.get(factor, 0) for factor, text in factors.items()}
    lacking = [text for text, n in needed.items() if n > 0]
    return (max(0, runs - counts.get("unchanged", 0)),
            min((needed[text] for text in lacking), default=0), lacking)


def gate(args) -> None:
    """Gate runs in chunks (each a `harness.gate.quality` invocation), merged into
    gate-runs.json after each chunk: a stopped benchmark keeps every chunk it finished,
    and a second call goes on to the counts asked for."""
    args.out.mkdir(parents=True, exist_ok=True)
    for _ in range(max(args.runs, args.planted_runs)):
        saved = _load(args.out, "gate-runs") or []
        counts = {s["condition"]: len(s["exit_codes"]) for s in saved}
        unchanged, planted, lacking = _gate_plan(counts, args.runs, args.planted_runs,
                                                 args.slowdowns)
        if not unchanged and not planted:
            return
        chunk = args.out / "gate-chunk.json"
        done = subprocess.run(
            [sys.executable, "-m", "harness.gate.quality", "--counters-runs", "0",
             "--invariant-runs", "0", "--ab-runs", str(min(unchanged, args.chunk)),
             "--ab-planted-runs", str(min(planted, args.planted_chunk)),
             "--ab-slowdowns", ",".join(lacking) or args.slowdowns, "--json", str(chunk)],
            cwd=REPO, text=True, stdout=subprocess.PIPE)
        if done.returncode != 0:
            raise SystemExit(f"harness.gate.quality failed ({done.returncode})")
        print(done.stdout)
        _save(args.out, "gate-runs", _merge_gate(saved, json.loads(chunk.read_text())))
        chunk.unlink()


def gate_table(document: list[dict]) -> list[dict]:
    """Per condition, by planted slowdown (unchanged first): gate runs, how many failed the
    gate, with the 95% Wilson interval of that rate, and the median seconds per run."""
    from harness.measure.stats import wilson_interval

    out = []
    for scenario in sorted(document, key=lambda s: _slowdown(s["condition"])):
        runs = len(scenario["exit_codes"])
        flagged = sum(code == 1 for code in scenario["exit_codes"])
        out.append({"condition": scenario["condition"], "runs": runs, "flagged": flagged,
                    "rate_interval": wilson_interval(flagged, runs) if runs else None,
                    "seconds": statistics.median(scenario["seconds"]) if runs else None})
    return out


# ------------------------------------------------------------------------------- table

def _pct(part: int, whole: int, digits: int = 1) -> str:
    return f"{100 * part / max(whole, 1):.{digits}f}%"


def _stability_table(folder: Path) -> list[str]:
    runs = _load(folder, "repeat")
    if not runs:
        return ["(not measured: run `repeat`)"]
    s, p = stability(runs), placebos(runs)
    lines = ["| claim | bar | measured |", "|---|---|---|",
             f"| consecutive default runs of one commit: rows moving between decisive words "
             f"(faster, slower, same) | 0 | {s['moved']} of {s['compared']} "
             f"({s['pairs']} pairs) |",
             f"| ... rows changing word at all | at most 3% | {s['changed']} of "
             f"{s['compared']} ({_pct(s['changed'], s['compared'])}) |",
             f"| placebo rows (baseline against itself) reading faster or slower | at most 1% "
             f"| {p['decisive']} of {p['cells']} ({_pct(p['decisive'], p['cells'])}) |",
             f"| placebo rows reading same | at least 90% | {p['same']} of {p['cells']} "
             f"({_pct(p['same'], p['cells'], 0)}) |"]
    if s["moved_examples"]:
        lines += ["", "Rows that moved: " + "; ".join(s["moved_examples"]) + "."]
    if p["decisive_examples"]:
        lines += ["", "Decisive placebos: " + "; ".join(p["decisive_examples"]) + "."]
    return lines


def _run_times_table(folder: Path) -> list[str]:
    lines = ["| run (report included) | bar | runs | median | range |", "|---|---|---|---|---|"]
    for name, label, bar in (("repeat", "default `python -m harness.run`", "150 s"),
                             ("quick", "`python -m harness.run --quick`", "40 s")):
        runs = _load(folder, name)
        if runs:
            seconds = [r["seconds"] for r in runs]
            lines.append(f"| {label} | {bar} | {len(runs)} | {statistics.median(seconds):.0f} s "
                         f"| {min(seconds):.0f}-{max(seconds):.0f} s |")
        else:
            lines.append(f"| {label} | {bar} | 0 | (not measured: run `{name}`) | |")
    return lines


def _planted_table(folder: Path) -> list[str]:
    rows = _load(folder, "planted")
    if not rows:
        return ["(not measured: run `planted`)"]
    lines = ["| planted slowdown | bar | trials | slower | same | faster | inconclusive | "
             "median ratio |", "|---|---|---|---|---|---|---|---|"]
    bars = {"PLANTED-10": "slower in at least 95%", "PLANTED-3": "never faster"}
    for r in planted_table(rows):
        median = f"{r['median_ratio']:.3g}" if r["median_ratio"] is not None else "-"
        lines.append(f"| {r['finding']} | {bars[r['finding']]} | {r['trials']} | {r['slower']} "
                     f"| {r['same']} | {r['faster']} | {r['inconclusive']} | {median} |")
    return lines


def _processes_table(folder: Path) -> list[str]:
    results = _load(folder, "processes")
    if not results:
        return ["(not measured: run `processes`)"]
    lines = ["| row | call | processes | per-process ratios | offset sd | within se | "
             "torch.utils.benchmark raw / loop-corrected | runs whose interval holds it |",
             "|---|---|---|---|---|---|---|---|"]
    held = total = 0
    for r in process_table(results, _load(folder, "repeat")):
        held, total = held + r["runs_holding"], total + r["runs"]
        lines.append(
            f"| {r['row']} | {r['seconds'] * 1e6:.3g} us | {r['processes']} | "
            f"{', '.join(f'{x:.3f}' for x in r['ratios'])} | {100 * r['process_sd']:.2f}% | "
            f"{100 * r['within_se']:.2f}% | {r['reference_raw']:.3f} / "
            f"{r['reference_corrected']:.3f} | {r['runs_holding']} of {r['runs']} |")
    lines += ["", f"(row, run) pairs whose interval holds the independent timer's "
              f"cross-process median: {held} of {total} ({_pct(held, total, 0)}; bar: at "
              f"least 90%)."]
    return lines


def _gate_table(folder: Path) -> list[str]:
    document = _load(folder, "gate-runs")
    if not document:
        return ["(not measured: run `gate`)"]
    lines = ["| gate check c on | bar | gate runs | failed the gate | 95% interval of the rate "
             "| seconds per run |", "|---|---|---|---|---|---|"]
    for r in gate_table(document):
        bar = "at most 1 in 60" if "unchanged" in r["condition"] else (
            "at least 90%" if "1.15x" in r["condition"] else "-")
        seconds = f"{r['seconds']:.0f}" if r["seconds"] is not None else "-"
        low, high = r["rate_interval"] or (math.nan, math.nan)
        lines.append(f"| {r['condition']} | {bar} | {r['runs']} | {r['flagged']} "
                     f"({_pct(r['flagged'], r['runs'], 0)}) | {100 * low:.0f}-{100 * high:.0f}% "
                     f"| {seconds} |")
    return lines


# -------------------------------------------------------------------------------- duet

#: rows of `duet`: calls of 35 us to 2 ms, long enough that two workers' start signals
#: (tens of microseconds apart) overlap most of a sample
DUET_ROWS = (
    ("B4-PT-05", "num_envs=4,max_steps=25", "tensor"),
    ("H5-mask-stacking", "num_envs=4", "preallocated"),
    ("B4-DRL-03", "num_envs=4,max_steps=25,dones=episode", "mask"),
)

#: a duet worker: pinned to CPU argv[3] before it loads anything, one torch thread, the
#: row's calls built from seed 0; first prints each call's seconds (the fastest of 5
#: samples of at least 1 ms), then reads "name number" lines and answers the seconds per
#: call of `number` calls of `name`
DUET_WORKER = r"""
import os, sys
os.sched_setaffinity(0, {int(sys.argv[3])})
""" + ROW_CALLS + r"""
def sample(fn, number):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number
per_call = {}
for name, fn in calls.items():
    fn(); fn()
    number = 1
    while sample(fn, number) * number < 1e-3 and number < 1 << 16:
        number *= 2
    per_call[name] = min(sample(fn, number) for _ in range(5))
print(json.dumps(per_call), flush=True)
gc.disable()
for line in sys.stdin:
    name, number = line.split()
    print(repr(sample(calls[name], int(number))), flush=True)
"""

#: one interleaved process: the harness's own rounds, one thread, for the same seconds
INTERLEAVED_WORKER = ROW_CALLS + INTERLEAVED_ROUNDS + r"""
print(json.dumps({"variant": ours["variant"].samples, "baseline": ours["baseline"].samples}))
"""


def _answer(worker: subprocess.Popen) -> str:
    """The worker's next line; a worker that died is an error, not an empty answer."""
    line = worker.stdout.readline()
    if not line:
        raise SystemExit(f"duet: a worker exited ({worker.wait()}) before answering; its "
                         "error is above")
    return line


def _duet_process(row: tuple, seconds: float) -> dict:
    """Two workers, one per CPU, for `seconds` of rounds: in round k the worker on the
    first CPU samples the baseline when k is even and the variant when it is odd, the
    other worker the other one, both at one signal. Each sample of either call lasts
    about as long (the longer call, at least 1 ms), so neither runs a tail alone."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    workers = [subprocess.Popen([sys.executable, "-c", DUET_WORKER, json.dumps(row), "1",
                                 str(cpu)], cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for cpu in cpus]
    try:
        per_call = [json.loads(_answer(w)) for w in workers]
        slowest = {name: max(p[name] for p in per_call) for name in per_call[0]}
        length = max(1e-3, *slowest.values())
        number = {name: max(1, round(length / t)) for name, t in slowest.items()}
        samples = {"baseline": [], "variant": []}
        started = time.perf_counter()
        k = 0
        while k < 8 or time.perf_counter() - started < seconds:
            roles = ("baseline", "variant") if k % 2 == 0 else ("variant", "baseline")
            for worker, name in zip(workers, roles):
                worker.stdin.write(f"{name} {number[name]}\n")
                worker.stdin.flush()
            for worker, name in zip(workers, roles):
                samples[name].append(float(_answer(worker)))
            k += 1
        return samples
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


def duet(args) -> None:
    """Each row in `args.processes` duet runs and as many interleaved processes, shuffled,
    each `args.seconds` of sampling; every paired sample list saved as it comes."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("duet: expected at least 2 CPUs to pin one worker to each; got "
                         f"{len(os.sched_getaffinity(0))}")
    jobs = [(row, mode, index) for row in DUET_ROWS for mode in ("duet", "interleaved")
            for index in range(args.processes)]
    random.Random(0).shuffle(jobs)
    results = _load(args.out, "duet") or []
    done_jobs = {(tuple(r["row"]), r["mode"], r["process"]) for r in results}
    for row, mode, index in jobs:
        if (row, mode, index) in done_jobs:
            continue
        started = time.perf_counter()
        if mode == "duet":
            samples = _duet_process(row, args.seconds)
        else:
            done = _python("-c", INTERLEAVED_WORKER, json.dumps(row), "1", str(args.seconds),
                           "100000", timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"{row}: {done.stderr[-2000:]}")
            samples = json.loads(done.stdout.strip().splitlines()[-1])
        results.append({"row": list(row), "mode": mode, "process": index, **samples,
                        "wall_s": time.perf_counter() - started})
        _save(args.out, "duet", results)


def duet_table(document: list[dict]) -> list[dict]:
    """Per row and mode: the processes' paired estimates, their median interval half-width,
    and how far apart the processes' estimates sit against their own standard errors."""
    from harness.measure.estimate import rounds_estimate

    out = []
    for row in DUET_ROWS:
        for mode in ("interleaved", "duet"):
            runs = [r for r in document if tuple(r["row"]) == row and r["mode"] == mode]
            if not runs:
                continue
            estimates = [rounds_estimate(r["variant"], r["baseline"]) for r in runs]
            logs = [e.log_ratio for e in estimates]
            halves = [e.interval()[1] / e.ratio - 1 for e in estimates]
            spread = statistics.stdev(logs) if len(logs) > 1 else float("nan")
            rms_se = math.sqrt(statistics.fmean(e.se ** 2 for e in estimates))
            out.append({"row": "/".join(row), "mode": mode, "processes": len(runs),
                        "rounds": statistics.median(len(r["variant"]) for r in runs),
                        "ratios": [math.exp(x) for x in logs],
                        "half_width": statistics.median(halves),
                        "spread_over_se": spread / rms_se if rms_se > 0 else float("nan")})
    return out


def _duet_table(folder: Path) -> list[str]:
    document = _load(folder, "duet")
    if not document:
        return ["(not measured: run `duet`)"]
    lines = ["| row | rounds | processes | ratio per process | median 95% half-width | "
             "spread of the processes / their standard error |", "|---|---|---|---|---|---|"]
    for r in duet_table(document):
        lines.append(f"| {r['row']} ({r['mode']}) | {r['rounds']:.0f} | {r['processes']} | "
                     f"{', '.join(f'{x:.3f}' for x in r['ratios'])} | "
                     f"+-{100 * r['half_width']:.2f}% | {r['spread_over_se']:.1f} |")
    return lines


TABLES = {"stability": _stability_table, "run-times": _run_times_table,
          "planted": _planted_table, "processes": _processes_table, "gate-power": _gate_table,
          "duet": _duet_table}


def markdown(kind: str, folder: Path) -> str:
    """The markdown table `kind` (a key of TABLES) from the results saved in `folder`."""
    return "\n".join(TABLES[kind](folder))


def table(args) -> None:
    print("\n\n".join(markdown(kind, args.out) for kind in TABLES))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    sub = p.add_subparsers(dest="part", required=True)
    for name in ("repeat", "quick", "planted", "processes", "gate", "duet", "table"):
        part = sub.add_parser(name)
        part.add_argument("out", type=Path)
        if name in ("repeat", "quick", "planted"):
            part.add_argument("--run-args", nargs=argparse.REMAINDER, default=[],
                              help="more options for harness.run")
    sub.choices["repeat"].add_argument("--runs", type=int, default=10)
    sub.choices["quick"].add_argument("--runs", type=int, default=3)
    sub.choices["processes"].add_argument("--processes", type=int, default=5)
    sub.choices["processes"].add_argument("--threads", type=int, default=2)
    sub.choices["processes"].add_argument("--budget", type=float, default=1.0)
    sub.choices["duet"].add_argument("--processes", type=int, default=5)
    sub.choices["duet"].add_argument("--seconds", type=float, default=3.0)
    sub.choices["gate"].add_argument("--runs", type=int, default=60)
    sub.choices["gate"].add_argument("--planted-runs", type=int, default=10)
    sub.choices["gate"].add_argument("--slowdowns", default="1.05,1.10,1.15,1.25")
    sub.choices["gate"].add_argument("--chunk", type=int, default=4,
                                     help="unchanged gate runs per saved chunk")
    sub.choices["gate"].add_argument("--planted-chunk", type=int, default=1,
                                     help="gate runs per slowdown per saved chunk")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(REPO))
    {"repeat": repeat, "quick": quick, "planted": planted,
     "processes": processes, "gate": gate, "duet": duet, "table": table}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
