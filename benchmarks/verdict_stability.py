"""Do the harness's words hold, on this machine and on others? A benchmark on real runs.

Each part measures one claim of the statistics (docs/statistics.md) and writes its raw
results as JSON into OUT, saved after every run so that a stopped benchmark goes on where
it stopped; `table` turns them into the markdown tables the docs quote. The rules under
test (the estimator, its pooling and calibration) are committed before these sets are
measured: nothing here is fitted to them.

    python benchmarks/verdict_stability.py series --condition NAME --runs 10 OUT
        default runs of the committed HEAD, reports included, one after the other, as a
        user runs them: from a fresh clone with empty compile caches (numba, inductor,
        Triton) before the first, so the first run is a machine's first run, and kept
        in the results. NAME is a simulated machine (CONDITIONS): `here`, `co-runner` (a
        busy process spinning one core for the whole series) or `other-kernels`
        (ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41, one thread). `--quick`
        makes the runs `--quick` (their own series);
    python benchmarks/verdict_stability.py firsts --condition NAME --pairs 5 OUT
        more first pairs for NAME's series (`--quick` for the quick one's): each a fresh
        clone with empty compile caches, run twice, so that the first-run figures (run
        time, the first run against the second) rest on more than one machine's start;
    python benchmarks/verdict_stability.py reference --condition NAME --rows 40 OUT
        an independent reference for NAME's series: ROWS rows drawn at random from the
        series' first run, stratified by call length, plus every row whose processes
        disagreed in any run of it (two-mode rows), each timed by torch.utils.benchmark in
        20 fresh processes under the same condition, against the baseline the series'
        first run compared it with; the reference is the median over processes of each
        process's ratio, the typical process the runs' intervals aim at;
    python benchmarks/verdict_stability.py planted OUT
        one run of benchmarks/planted_findings.py: a +10% planted slowdown should read
        slower, a +3% one never faster;
    python benchmarks/verdict_stability.py gate --runs 30 --planted-runs 20 OUT
        check c of the gate, as `python -m harness.gate --against HEAD` runs it, on
        unchanged code (false alarms; a third of the runs with `--co-runner`, a busy
        process beside them) and with the scan GAE planted 7.5% and 10% slower (power),
        in chunks saved as they finish;
    python benchmarks/verdict_stability.py duet --processes 5 --seconds 3 OUT
        duet rounds (Bulej et al. 2020) against this harness's interleaved rounds, for the
        same seconds: two workers, one pinned to each core, time the baseline and the
        variant at one signal, swapping roles each round; per mode, the interval widths
        and the spread of fresh processes' estimates against their standard errors;
    python benchmarks/verdict_stability.py table OUT
        the tables (`docs/generate.py` puts them into the docs from the copy of OUT's
        JSON files committed in benchmarks/results/). Sets measured on another machine
        go into OUT/machines/NAME/ (the same files): they get rows of their own in the
        conditions table, named with the CPU their runs recorded.

Each series is measured on an otherwise idle machine (the co-runner being the one
exception, on purpose); the tables say how many runs each figure rests on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.utils.benchmark as tb

REPO = Path(__file__).resolve().parents[1]
DECISIVE = ("faster", "slower", "same")


@dataclass(frozen=True)
class Condition:
    """A simulated machine: its environment, harness.run's options, a co-runner or not."""

    description: str
    environment: dict[str, str] = field(default_factory=dict)
    run_args: tuple[str, ...] = ()
    co_runner: bool = False


CONDITIONS = {
    "here": Condition("the machine idle"),
    "co-runner": Condition("a busy process spinning one core for the whole series",
                           co_runner=True),
    "other-kernels": Condition(
        "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41, one thread (--threads 1)",
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}, ("--threads", "1")),
}


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=kwargs.pop("cwd", REPO),
                          capture_output=True, text=True, **kwargs)


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


@contextlib.contextmanager
def _co_runner(on: bool):
    """A process spinning one CPU core while inside, when `on`."""
    if not on:
        yield
        return
    from harness.gate.quality import busy_processes

    with busy_processes(1):
        yield


#: the fields of a summary row the tables read (the rest is left out of the saved results)
ROW_FIELDS = ("finding", "case", "variant", "verdict", "placebo", "headline", "ratio",
              "ci_low", "ci_high", "ci_level", "status", "log_se", "df", "process_sd",
              "process_p", "processes", "median_s", "first_output_s")


def _summary_rows(results: Path) -> tuple[list[dict], dict, dict]:
    """The reduced rows of the run in `results`, its process level, and its metadata
    (run.json: the torch threads it timed at, the CPU)."""
    sys.path.insert(0, str(REPO))
    from harness.results import load_run

    run = load_run(None, results)
    rows = run.summary.astype(object).where(run.summary.notna(), None).to_dict("records")
    return ([{k: r.get(k) for k in ROW_FIELDS} for r in rows],
            run.metadata.get("process_level") or {}, run.metadata)


def reference_threads(runs: list[dict], condition: Condition) -> int:
    """The torch threads a series' reference times at: those its first run timed at (a run
    beside a busy process leaves it a core: `harness.ranks.free_threads`), else the
    condition's `--threads`, else the machine's cores (series saved before runs kept it)."""
    recorded = runs[0].get("threads") if runs else None
    if recorded:
        return int(recorded)
    if "--threads" in condition.run_args:
        return int(condition.run_args[condition.run_args.index("--threads") + 1])
    return os.cpu_count() or 1


def _series_name(condition: str, quick: bool) -> str:
    return f"series-{condition}" + ("-quick" * quick)


def _fresh_clone(folder: Path) -> Path:
    """A clone of this repository's HEAD in `folder`/clone, and empty compile caches."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    clone = folder / "clone"
    done = subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git clone failed: {done.stderr}")
    return clone


def _head(repository: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True,
                          text=True, check=True).stdout.strip()


def compile_caches(folder: Path) -> dict[str, str]:
    """The environment that keeps numba's, inductor's and Triton's caches in `folder`, and
    the temp dir too (made here): inductor keeps its precompiled C++ headers (150 MB each)
    in a folder of the temp dir whatever TORCHINDUCTOR_CACHE_DIR says, so with the
    machine's temp dir a fresh clone's first run would find them built by earlier ones."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    return {"NUMBA_CACHE_DIR": str(folder / "numba"),
            "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
            "TRITON_CACHE_DIR": str(folder / "triton"),
            "TMPDIR": str(folder / "tmp")}


def _measured_run(clone: Path, results: Path, extra: tuple[str, ...],
                  environment: dict[str, str]) -> dict:
    """One `harness.run` of `clone` into `results`: its seconds, exit status, reduced rows
    and calibration. A run that neither succeeded nor found a finding stops the benchmark."""
    started = time.perf_counter()
    done = _python("-m", "harness.run", "--out", str(results), *extra, cwd=clone,
                   env=environment)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{results.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    rows, level, metadata = _summary_rows(results)
    return {"seconds": seconds, "exit": done.returncode, "rows": rows,
            "calibration": level.get("calibration"), "threads": metadata.get("threads"),
            "cpu": machine_label(metadata)}


def _cpus(runs: list[dict]) -> str:
    """The CPUs a series' runs recorded (`machine_label`), joined; '' where none did."""
    return " and ".join(sorted({r["cpu"] for r in runs if r.get("cpu")}))


def machine_label(metadata: dict) -> str | None:
    """The CPU a run measured on and the vector ISA its ATen kernels ran ("Intel(R)
    Xeon(R) Processor, AVX512"); None for a run that recorded neither."""
    parts = [metadata.get("cpu_model"), metadata.get("aten_cpu_capability")]
    return ", ".join(p for p in parts if p) or None


def _run_setup(args, clone: Path, caches: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment (the condition's, the clone first on the path, compile caches in
    `caches`) and the harness.run options of `args`' condition."""
    condition = CONDITIONS[args.condition]
    environment = {**os.environ, **condition.environment, "PYTHONPATH": str(clone),
                   **compile_caches(caches)}
    return environment, condition.run_args + (("--quick",) if args.quick else ()) + tuple(
        args.run_args)


def series(args) -> None:
    """`args.runs` runs of HEAD under `args.condition`, the first from a fresh clone with
    empty compile caches; saved after each run."""
    condition = CONDITIONS[args.condition]
    name = _series_name(args.condition, args.quick)
    folder = args.out / name
    saved = _load(args.out, name) or {"condition": args.condition, "runs": []}
    clone = folder / "clone"
    if not saved["runs"] or not clone.is_dir():
        if saved["runs"]:
            raise SystemExit(f"{folder}: its clone is gone; remove {name}.json to start over")
        clone = _fresh_clone(folder)
        saved.update(commit=_head(clone), description=condition.description)
    environment, extra = _run_setup(args, clone, folder / "caches")
    with _co_runner(condition.co_runner):
        for index in range(len(saved["runs"]), args.runs):
            saved["runs"].append(_measured_run(clone, folder / f"run{index}", extra,
                                               environment))
            print(f"{name}: run {index + 1}/{args.runs} in "
                  f"{saved['runs'][-1]['seconds']:.0f} s", file=sys.stderr)
            _save(args.out, name, saved)


def _firsts_name(condition: str, quick: bool) -> str:
    return "firsts-" + _series_name(condition, quick).removeprefix("series-")


def firsts(args) -> None:
    """`args.pairs` more first pairs under `args.condition`: each a fresh clone of HEAD
    with empty compile caches, run twice (a machine's first run and its second); saved
    after each pair. A series has one first pair; these make the first-run figures rest
    on more than one."""
    condition = CONDITIONS[args.condition]
    name = _firsts_name(args.condition, args.quick)
    saved = _load(args.out, name) or {"condition": args.condition, "pairs": []}
    with _co_runner(condition.co_runner):
        for index in range(len(saved["pairs"]), args.pairs):
            folder = args.out / name / f"pair{index}"
            clone = _fresh_clone(folder)
            commit = _head(clone)
            if saved.setdefault("commit", commit) != commit:
                raise SystemExit(f"{name}.json holds pairs of {saved['commit'][:10]}, HEAD is "
                                 f"{commit[:10]}: remove it to start over")
            saved["description"] = condition.description
            environment, extra = _run_setup(args, clone, folder / "caches")
            pair = [_measured_run(clone, folder / f"run{run}", extra, environment)
                    for run in range(2)]
            saved["pairs"].append(pair)
            print(f"{name}: pair {index + 1}/{args.pairs} in "
                  f"{pair[0]['seconds']:.0f} s and {pair[1]['seconds']:.0f} s", file=sys.stderr)
            _save(args.out, name, saved)


# ------------------------------------------------------------------------- reductions

def _key(row: dict) -> tuple[str, str, str]:
    return row["finding"], row["case"], row["variant"]


def _worded(rows: list[dict]) -> dict[tuple, dict]:
    """The rows with an interval, placebos included (their true ratio is 1)."""
    return {_key(r): r for r in rows if r.get("ci_low") is not None
            and r.get("ratio") is not None and r.get("verdict") in (*DECISIVE, "inconclusive")}


def _normal_quantile(level: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + level / 2.0)


def _printed_se(row: dict) -> float:
    """The standard error a reader takes from the printed interval and its level."""
    half = math.log(row["ci_high"] / row["ci_low"]) / 2.0
    return half / _normal_quantile(row.get("ci_level") or 0.95)


def _se(row: dict) -> float:
    """The row's standard error of its log ratio as the run recorded it (`log_se`), else as
    read from its printed interval and level. The printed interval is the wider where
    sampling looked more than once (its level raised for the looks, its quantile a t's), so
    read back as a normal interval it would overstate the error and shrink every z."""
    recorded = row.get("log_se")
    return float(recorded) if recorded else _printed_se(row)


def _baselines(rows: list[dict]) -> dict[tuple[str, str], str]:
    """(finding, case) -> the variant a run compared that case's rows with: the finding's
    baseline, or the variant standing in for it where it was not timed (the loop at
    sizes where it would take minutes)."""
    return {(r["finding"], r["case"]): r["variant"] for r in rows
            if r.get("verdict") == "baseline"}


def pair_z(first: dict, second: dict) -> list[float]:
    """For each row worded in both runs against the same baseline (`_baselines`: a run
    that did not time the loop in a case compares with a variant standing in for it, a
    ratio of another thing): the difference of the two log ratios over their combined
    standard error (`_se`)."""
    a, b = _worded(first["rows"]), _worded(second["rows"])
    base_a, base_b = _baselines(first["rows"]), _baselines(second["rows"])
    out = []
    for key in sorted(a.keys() & b.keys()):
        if base_a.get(key[:2]) != base_b.get(key[:2]):
            continue
        se = math.hypot(_se(a[key]), _se(b[key]))
        if se > 0:
            out.append((math.log(a[key]["ratio"]) - math.log(b[key]["ratio"])) / se)
    return out


def z_summary(z: list[float], level: float = 0.95) -> dict:
    """How run-to-run z spreads: the share beyond the level's quantile (nominal 1 - level),
    a robust spread (IQR / 1.349, 1 when calibrated) and the share beyond 4."""
    if not z:
        return {"rows": 0}
    q = _normal_quantile(level)
    quartiles = statistics.quantiles(z, n=4) if len(z) > 1 else [z[0]] * 3
    return {"rows": len(z), "beyond_level": sum(abs(x) > q for x in z),
            "nominal": 1.0 - level, "robust_sd": (quartiles[2] - quartiles[0]) / 1.349,
            "beyond_4": sum(abs(x) > 4 for x in z)}


def stability(runs: list[dict], more_firsts: list[list[dict]] = ()) -> dict:
    """Consecutive pairs of runs: z of every row worded in both, the first pairs (a
    machine's first run against its second: the series' own and `more_firsts`) apart from
    the others."""
    pairs = list(zip(runs, runs[1:]))
    later = [x for first, second in pairs[1:] for x in pair_z(first, second)]
    firsts = pairs[:1] + [tuple(pair) for pair in more_firsts]
    return {"pairs": len(pairs), "first_pairs": len(firsts),
            "first": z_summary([x for first, second in firsts for x in pair_z(first, second)]),
            "later": z_summary(later)}


def words_held(runs: list[dict], reference: dict[tuple, float], margin: float = 0.05) -> dict:
    """Of the runs' intervals of the reference's rows (`reference_ratios`: keyed by
    finding, case, variant and the baseline the reference timed it against), how many
    hold its ratio; of their decisive words, how many it contradicts (faster over a
    reference at or above 1, slower at or below 1, same with the reference beyond the
    margin). A run's row compared with another baseline than the reference's is not
    comparable: counted apart (`other_baseline`), never as held or missed."""
    held = total = decisive = contradicted = other_baseline = 0
    drawn = {key[:3] for key in reference}
    for run in runs:
        baselines = _baselines(run["rows"])
        for key, row in _worded(run["rows"]).items():
            if key not in drawn:
                continue
            truth = reference.get((*key, baselines.get(key[:2])))
            if truth is None:
                other_baseline += 1
                continue
            total += 1
            held += row["ci_low"] <= truth <= row["ci_high"]
            word = row["verdict"]
            if word in DECISIVE:
                decisive += 1
                contradicted += ((word == "faster" and truth >= 1.0)
                                 or (word == "slower" and truth <= 1.0)
                                 or (word == "same" and not 1 / (1 + margin) <= truth <= 1 + margin))
    return {"intervals": total, "held": held, "decisive": decisive,
            "contradicted": contradicted, "other_baseline": other_baseline}


# -------------------------------------------------------------------------- reference

def _empty() -> None:
    """The call whose cost is the reference loop's own."""


def _median_s(fn, threads: int, min_run_time: float) -> float:
    """The median seconds per call of a `torch.utils.benchmark` `blocked_autorange` of `fn`
    (back-to-back calls, warm) at `threads` torch threads (its Timer runs at one thread
    unless told)."""
    timer = tb.Timer("fn()", globals={"fn": fn}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def reference_loop_s(threads: int, min_run_time: float = 0.05) -> float:
    """The reference loop's own seconds per call: the median over three timings of an
    empty call."""
    return statistics.median(_median_s(_empty, threads, min_run_time) for _ in range(3))


def reference_per_call(fn, threads: int, loop_s: float, min_run_time: float = 0.05) -> float:
    """Seconds per call of `fn` by `torch.utils.benchmark` at `threads` torch threads, less
    the loop's own `loop_s` (`reference_loop_s`): the measurand a run's samples estimate (a
    call's own steady cost), and where the loop's cost is most of a nanosecond call, not
    its ratio pulled towards 1. Never below 5% of the raw time."""
    raw = _median_s(fn, threads, min_run_time)
    return max(raw - loop_s, 0.05 * raw)


#: one reference process: argv[1] the rows as JSON [[finding, case, variant, baseline],
#: ...], argv[2] torch's threads; each row's baseline (the variant its series compared it
#: with) and variant built from seed 0 and timed by `reference_per_call`, interleaved five
#: times, the rows in a shuffled order; prints {"finding/case/variant": ratio of the
#: median times} as JSON
REFERENCE_WORKER = r"""
import json, random, sys
import torch
torch.set_num_threads(int(sys.argv[2]))
from benchmarks.verdict_stability import reference_loop_s, reference_per_call
from harness import findings as registry
from harness.project import load_findings
load_findings(None, required=False, with_project=True)
rows = json.loads(sys.argv[1])
quick = sys.argv[3] == "quick"  # the series' cases: a quick run's are its own
random.shuffle(rows)
loop_s = reference_loop_s(torch.get_num_threads())
ratios = {}
for finding_id, case_label, variant, baseline in rows:
    if variant == "placebo":  # the baseline against itself: its true ratio is 1
        ratios["/".join((finding_id, case_label, variant))] = 1.0
        continue
    finding = registry.planned(registry.select([finding_id])[0], quick)
    case = next(c for c in finding.cases(quick) if c.label == case_label)
    inputs = finding.build(case, torch.device("cpu"), 0)
    calls = {"baseline": finding.make_call(baseline, inputs),
             "variant": finding.make_call(variant, inputs)}
    seconds = {name: [] for name in calls}
    for _ in range(5):
        order = list(calls)
        random.shuffle(order)
        for name in order:
            seconds[name].append(reference_per_call(calls[name], torch.get_num_threads(), loop_s))
    ratios["/".join((finding_id, case_label, variant))] = (
        sorted(seconds["variant"])[2] / sorted(seconds["baseline"])[2])
print(json.dumps(ratios))
"""


#: call-length strata of the reference's draw, in seconds per call
STRATA = (20e-6, 2e-3)


def draw_rows(runs: list[dict], count: int, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """`count` rows of the first run drawn at random, as many from each call-length
    stratum as it allows, plus every row whose processes disagreed in any run: (finding,
    case, variant, the variant the first run compared it with)."""
    first = [r for r in _worded(runs[0]["rows"]).values() if r.get("median_s")]
    strata: list[list[dict]] = [[] for _ in range(len(STRATA) + 1)]
    for row in first:
        strata[sum(row["median_s"] > bound for bound in STRATA)].append(row)
    rng = random.Random(seed)
    for stratum in strata:
        rng.shuffle(stratum)
    drawn: list[tuple] = []
    while len(drawn) < count and any(strata):
        for stratum in strata:
            if stratum and len(drawn) < count:
                drawn.append(_key(stratum.pop()))
    two_mode = {_key(r) for run in runs for r in run["rows"]
                if r.get("process_p") is not None and r["process_p"] < 0.05}
    baselines = _baselines(runs[0]["rows"])
    return [(*key, baselines[key[:2]])
            for key in sorted(set(drawn) | (two_mode & {_key(r) for r in first}))]


def reference(args) -> None:
    """The reference of `args.condition`'s series: its drawn rows in `args.processes`
    fresh processes under the same condition; saved after each process."""
    condition = CONDITIONS[args.condition]
    name = _series_name(args.condition, args.quick)
    runs = (_load(args.out, name) or {}).get("runs")
    if not runs:
        raise SystemExit(f"reference: expected a measured series {name}.json in {args.out}; "
                         "run `series` first")
    saved = _load(args.out, f"reference-{name.removeprefix('series-')}") or {
        "rows": [list(r) for r in draw_rows(runs, args.rows)], "processes": []}
    threads = str(reference_threads(runs, condition))
    clone = args.out / name / "clone"
    # compile caches of the condition's own, as its series had: inductor's default cache,
    # shared with other kernel paths, gave C++ the other path's vector code to compile
    environment = {**os.environ, **condition.environment, "PYTHONPATH": str(clone),
                   **compile_caches(args.out / name / "reference-caches")}
    with _co_runner(condition.co_runner):
        for index in range(len(saved["processes"]), args.processes):
            done = _python("-c", REFERENCE_WORKER, json.dumps(saved["rows"]), threads,
                           "quick" if args.quick else "default", cwd=clone, env=environment,
                           timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"reference process {index} failed: {done.stderr[-2000:]}")
            saved["processes"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"reference {args.condition}: process {index + 1}/{args.processes}",
                  file=sys.stderr)
            _save(args.out, f"reference-{name.removeprefix('series-')}", saved)


def reference_ratios(document: dict) -> dict[tuple, float]:
    """Each row's reference, keyed by (finding, case, variant, the baseline it was timed
    against): the median over processes of the process's ratio."""
    out = {}
    for row in document["rows"]:
        if len(row) != 4:
            raise ValueError(f"reference row {row}: expected [finding, case, variant, "
                             "baseline]; a reference saved without the baseline it timed "
                             "against cannot be compared")
        name = "/".join(row[:3])
        ratios = [p[name] for p in document["processes"] if name in p]
        if ratios:
            out[tuple(row)] = statistics.median(ratios)
    return out


# ----------------------------------------------------------------------------- planted

def planted(args) -> None:
    run = _measured_run(REPO, args.out / "planted",
                        ("--findings-module", "benchmarks.planted_findings", "--no-report",
                         "--no-profile", *args.run_args), dict(os.environ))
    _save(args.out, "planted", run["rows"])


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


# -------------------------------------------------------------------------------- gate

def _merge_gate(saved: list[dict], chunk: list[dict]) -> list[dict]:
    """`saved` with `chunk`'s gate runs added to the scenario of the same condition."""
    per_run = ("exit_codes", "seconds", "ranks", "rows", "commits")  # one per gate run
    by_condition = {s["condition"]: s for s in saved}
    for scenario in chunk:
        mine = by_condition.setdefault(scenario["condition"], {
            **{k: v for k, v in scenario.items() if k not in per_run}, **{k: [] for k in per_run}})
        for key in per_run:
            mine.setdefault(key, [])
            mine[key] += scenario.get(key, [])
    return list(by_condition.values())


#: what a condition of gate runs beside a co-runner is called after its own name
CO_RUNNER_LABEL = " (co-runner)"


def _slowdown(condition: str) -> float:
    """1.0 for "unchanged" (or "unchanged (co-runner)"), 1.15 for "scan 1.15x slower"."""
    return 1.0 if condition.startswith("unchanged") else float(
        condition.rsplit(" ", 2)[-2][:-1])


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
    and a second call goes on to the counts asked for. With `--co-runner` the runs are
    their own conditions ("unchanged (co-runner)"), a busy process spinning beside them."""
    args.out.mkdir(parents=True, exist_ok=True)
    label = CO_RUNNER_LABEL if args.co_runner else ""
    for _ in range(max(args.runs, args.planted_runs)):
        saved = _load(args.out, "gate-runs") or []
        counts = {s["condition"].removesuffix(label): len(s["exit_codes"]) for s in saved
                  if s["condition"].endswith(CO_RUNNER_LABEL) == args.co_runner}
        unchanged, planted, lacking = _gate_plan(counts, args.runs, args.planted_runs,
                                                 args.slowdowns)
        if not unchanged and not planted:
            return
        chunk = args.out / "gate-chunk.json"
        done = subprocess.run(
            [sys.executable, "-m", "harness.gate.quality", "--counters-runs", "0",
             "--invariant-runs", "0", "--ab-runs", str(min(unchanged, args.chunk)),
             "--ab-planted-runs", str(min(planted, args.planted_chunk)),
             "--ab-slowdowns", ",".join(lacking) or args.slowdowns, "--json", str(chunk),
             "--busy", "1" if args.co_runner else "0"],
            cwd=REPO, text=True, stdout=subprocess.PIPE)
        if done.returncode != 0:
            raise SystemExit(f"harness.gate.quality failed ({done.returncode})")
        print(done.stdout)
        head = _head(REPO)
        scenarios = [{**s, "condition": s["condition"] + label,
                      "commits": [head] * len(s["exit_codes"])}
                     for s in json.loads(chunk.read_text())
                     if s["exit_codes"]]  # a chunk of planted runs only has no unchanged ones
        _save(args.out, "gate-runs", _merge_gate(saved, scenarios))
        chunk.unlink()


def gate_table(document: list[dict]) -> list[dict]:
    """Per condition, by planted slowdown (unchanged first): gate runs, how many failed the
    gate, with the 95% Wilson interval of that rate, and the median seconds per run."""
    from harness.measure.stats import wilson_interval

    out = []
    for scenario in sorted(document, key=lambda s: _slowdown(s["condition"])):
        runs = len(scenario["exit_codes"])
        flagged = sum(code == 1 for code in scenario["exit_codes"])
        planted = _slowdown(scenario["condition"]) > 1.0
        unchanged = [row["ci"] for rows in scenario["rows"] for row in rows
                     if not planted and row.get("ci")]
        # the plant slows the planted function, not the whole timed call: what the gate
        # measured for the planted variant's cells is the slowdown it had to find
        variant = scenario["condition"].split()[0]
        measured = [row["ci"]["ratio"] for rows in scenario["rows"] for row in rows
                    if planted and row.get("variant") == variant and row.get("ci")]
        out.append({"condition": scenario["condition"], "runs": runs, "flagged": flagged,
                    "rate_interval": wilson_interval(flagged, runs) if runs else None,
                    "seconds": statistics.median(scenario["seconds"]) if runs else None,
                    "cells": len(unchanged),
                    "excluding": sum(not ci["low"] <= 1.0 <= ci["high"] for ci in unchanged),
                    "measured": statistics.median(measured) if measured else None})
    return out


# ------------------------------------------------------------------------------- table

def _pct(part: int, whole: int, digits: int = 1) -> str:
    return f"{100 * part / max(whole, 1):.{digits}f}%"


def _z_rows(pairs: str, summary: dict) -> list[str]:
    """Three rows of a condition table: z beyond the level, its robust sd, z beyond 4."""
    rows = summary.get("rows", 0)
    if not rows:
        return [f"| run-to-run z, {pairs} | - | (no pair) |"]
    return [f"| run-to-run \\|z\\| beyond the 95% level, {pairs} | at most 10% | "
            f"{summary['beyond_level']} of {rows} ({_pct(summary['beyond_level'], rows)}) |",
            f"| robust sd of z (IQR / 1.349), {pairs} | 0.8-1.25 | "
            f"{summary['robust_sd']:.2f} |",
            f"| \\|z\\| > 4, {pairs} | at most 0.5% | {summary['beyond_4']} of {rows} "
            f"({_pct(summary['beyond_4'], rows, 2)}) |"]


def _measured_series(folder: Path, condition: str) -> list[tuple[str, dict, bool]]:
    """The series measured for `condition`, its default runs' first, then its `--quick`
    runs': (name, document, quick) of each kind that has runs."""
    found = []
    for quick in (False, True):
        name = _series_name(condition, quick)
        document = _load(folder, name)
        if document and document.get("runs"):
            found.append((name, document, quick))
    return found


def _more_firsts(folder: Path, condition: str, quick: bool) -> dict:
    """The `firsts` pairs measured for a condition's series of that kind (none: empty)."""
    document = _load(folder, _firsts_name(condition, quick)) or {}
    return {"pairs": document.get("pairs") or [], "commit": document.get("commit", "")}


def _reference(folder: Path, name: str) -> dict | None:
    """The reference measured for the series `name`, if any."""
    return _load(folder, "reference-" + name.removeprefix("series-"))


#: where the sets of another machine than the one the results folder's own sets were
#: measured on are kept: MACHINES/<name>/, the same files as the results folder's
MACHINES = "machines"


def _other_machines(folder: Path) -> list[Path]:
    """The folders of other machines' sets under `folder` (MACHINES/*), by name."""
    return sorted(p for p in (folder / MACHINES).glob("*") if p.is_dir())


def _condition_table(folder: Path, condition: str, machine: str | None = None) -> list[str]:
    """One simulated machine's tables, one per kind of series measured (default runs,
    `--quick` runs): run-to-run z (the first pair apart), the reference held, run times,
    and what the runs' own processes said. `machine`: the sets of MACHINES/`machine`."""
    if machine is not None:
        folder = folder / MACHINES / machine
    measured = _measured_series(folder, condition)
    if not measured:
        return [f"(not measured: run `series --condition {condition}`)"]
    lines: list[str] = []
    for name, document, quick in measured:
        lines += ([""] if lines else []) + _series_table(folder, condition, name, document, quick)
    return lines


def _series_table(folder: Path, condition: str, name: str, document: dict,
                  quick: bool) -> list[str]:
    """The table of one series (`name`) of `condition`."""
    runs = document["runs"]
    more = _more_firsts(folder, condition, quick)
    s = stability(runs, more["pairs"])
    kind, bar = ("`--quick` runs", "at most 40 s") if quick else ("default runs", "at most 150 s")
    also = (f" {len(more['pairs'])} more fresh clones of {more['commit'][:10]}, each run "
            "twice, add their first pairs." if more["pairs"] else "")
    cpus = _cpus(runs)
    lines = [f"{CONDITIONS[condition].description}: {len(runs)} {kind} of "
             f"{document['commit'][:10]}{' on ' + cpus if cpus else ''}, "
             "the first from a fresh clone with empty compile "
             f"caches.{also}", "",
             "| claim | bar | measured |", "|---|---|---|",
             *_z_rows(f"consecutive runs after the first ({max(s['pairs'] - 1, 0)} pairs)",
                      s["later"]),
             *_z_rows(f"a machine's first run against its second ({s['first_pairs']} "
                      f"pair{'s' * (s['first_pairs'] > 1)})", s["first"])]
    ref = _reference(folder, name)
    if ref and ref.get("processes"):
        held = words_held(runs, reference_ratios(ref))
        lines += [f"| intervals holding a {len(ref['processes'])}-process "
                  f"torch.utils.benchmark reference ({len(ref['rows'])} rows) | at least 93% "
                  f"| {held['held']} of {held['intervals']} "
                  f"({_pct(held['held'], held['intervals'])})"
                  + (f"; {held['other_baseline']} intervals of rows a run compared with "
                     "another baseline than the reference's left out"
                     if held["other_baseline"] else "") + " |",
                  f"| decisive words the reference contradicts | at most 2.5% | "
                  f"{held['contradicted']} of {held['decisive']} "
                  f"({_pct(held['contradicted'], held['decisive'])}) |"]
    else:
        lines.append(f"| intervals holding the reference | at least 93% | (not measured: run "
                     f"`reference --condition {condition}`) |")
    seconds = [r["seconds"] for r in runs]
    lines.append(f"| run time, report included | {bar} | first {seconds[0]:.0f} s, "
                 f"then median {statistics.median(seconds[1:] or seconds):.0f} s, most "
                 f"{max(seconds):.0f} s |")
    if more["pairs"]:
        cold = [pair[0]["seconds"] for pair in more["pairs"]]
        lines.append(f"| a machine's first run, empty compile caches ({len(cold)} fresh "
                     f"clones of {more['commit'][:10]}) | {bar} | median "
                     f"{statistics.median(cold):.0f} s, most {max(cold):.0f} s |")
    calibrations = [r["calibration"] for r in runs if r.get("calibration")]
    if calibrations:
        disagreeing = sum(c["disagreeing"] for c in calibrations)
        rows = sum(c["rows"] for c in calibrations)
        widened = sum(c["inflation"] > 1.0 for c in calibrations)
        lines.append(f"| rows whose processes disagreed (the runs' own A/A test, 5% level) | "
                     f"about 5% | {disagreeing} of {rows} ({_pct(disagreeing, rows)}); "
                     f"{widened} of {len(calibrations)} runs widened their intervals |")
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


def _conditions_table(folder: Path) -> list[str]:
    """One row per simulated machine: the condition tables in brief (the front page's)."""
    lines = ["| condition | runs | \\|z\\| beyond 95% (bar 10%) | robust sd of z (0.8-1.25) | "
             "\\|z\\| > 4 (0.5%) | first pairs beyond 95% | reference held (93%) | "
             "contradicted (2.5%) | run time (150 s; `--quick` 40 s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for condition in CONDITIONS:
        measured = _measured_series(folder, condition)
        if not measured:
            lines.append(f"| {condition} | 0 | (not measured: run `series --condition "
                         f"{condition}`) | | | | | | |")
        lines += [_conditions_row(folder, condition, *series) for series in measured]
    for machine in _other_machines(folder):  # only what was measured there
        lines += [_conditions_row(machine, condition, *series, machine=machine.name)
                  for condition in CONDITIONS
                  for series in _measured_series(machine, condition)]
    return lines


def _conditions_row(folder: Path, condition: str, name: str, document: dict,
                    quick: bool, machine: str | None = None) -> str:
    """One series' row of the conditions table (`machine`: the name of the other
    machine's folder it comes from, with its CPU as its runs recorded it)."""
    runs = document["runs"]
    more = _more_firsts(folder, condition, quick)["pairs"]
    s = stability(runs, more)
    later, first = s["later"], s["first"]
    ref = _reference(folder, name)
    held = words_held(runs, reference_ratios(ref)) if ref and ref.get("processes") else None
    seconds = [r["seconds"] for r in runs]
    cold = [seconds[0]] + [pair[0]["seconds"] for pair in more]
    cpus = _cpus(runs)
    label = condition if machine is None else (
        f"{condition}, {machine}" + (f" ({cpus})" if cpus else ""))
    cells = [label, f"{len(runs)} {'`--quick`' if quick else 'default'}",
             _pct(later["beyond_level"], later["rows"]) if later.get("rows") else "-",
             f"{later['robust_sd']:.2f}" if later.get("rows") else "-",
             _pct(later["beyond_4"], later["rows"], 2) if later.get("rows") else "-",
             _pct(first["beyond_level"], first["rows"]) if first.get("rows") else "-",
             _pct(held["held"], held["intervals"]) if held else "-",
             _pct(held["contradicted"], held["decisive"]) if held else "-",
             f"{statistics.median(cold):.0f} s first" + (f" (median of {len(cold)})" if
                                                          len(cold) > 1 else "")
             + f", {statistics.median(seconds[1:] or seconds):.0f} s"]
    return "| " + " | ".join(cells) + " |"


#: the gate's bars (issue: a gate that holds on any machine): false alarms on unchanged code,
#: power at each planted slowdown
GATE_BARS = {1.0: "at most 5%", 1.075: "at least 80%", 1.10: "at least 95%"}


def _bar_slowdown(row: dict) -> float | None:
    """The bar a scenario is held to: unchanged code's, else the planted slowdown's nearest
    to what the planted cells measured (the plant wraps one function of the timed call,
    and its own few instructions add to it: 1.06x planted measured about 1.075x here)."""
    if _slowdown(row["condition"]) == 1.0:
        return 1.0
    if row["measured"] is None:
        return None
    return min((s for s in GATE_BARS if s > 1.0), key=lambda s: abs(s - row["measured"]))


def _gate_table(folder: Path, machine: str | None = None) -> list[str]:
    """The gate runs' table (`gate_table`); `machine`: the runs of MACHINES/`machine`."""
    if machine is not None:
        folder = folder / MACHINES / machine
    document = _load(folder, "gate-runs")
    if not document:
        return ["(not measured: run `gate`)"]
    commits = sorted({c[:10] for s in document for c in s.get("commits", [])})
    unnamed = sum(len(s["exit_codes"]) - len(s.get("commits", [])) for s in document)
    named = ", ".join(commits)
    lines = [f"Gate runs of {named or 'an earlier commit'}"
             + (f" ({unnamed} of them of an earlier commit)" if named and unnamed else "") + ".",
             "", "| gate check c on | bar | gate runs | failed the gate | 95% interval of the rate "
             "| the planted cells' measured ratio (median) "
             "| unchanged cells whose interval excludes 1 (nominal 5%) | seconds per run |",
             "|---|---|---|---|---|---|---|---|"]
    for r in gate_table(document):
        bar = GATE_BARS.get(_bar_slowdown(r), "-")
        seconds = f"{r['seconds']:.0f}" if r["seconds"] is not None else "-"
        low, high = r["rate_interval"] or (math.nan, math.nan)
        excluding = (f"{r['excluding']} of {r['cells']} ({_pct(r['excluding'], r['cells'])})"
                     if r["cells"] else "-")
        measured = f"{r['measured']:.3f}" if r["measured"] is not None else "-"
        lines.append(f"| {r['condition']} | {bar} | {r['runs']} | {r['flagged']} "
                     f"({_pct(r['flagged'], r['runs'], 0)}) | {100 * low:.0f}-{100 * high:.0f}% "
                     f"| {measured} | {excluding} | {seconds} |")
    return lines


# -------------------------------------------------------------------------------- duet

#: the start of every duet and interleaved worker: argv[1] the row (finding, case, variant)
#: as JSON, argv[2] the torch threads; its baseline's and variant's calls built from seed 0,
#: first calls not made
ROW_CALLS = r"""
import gc, json, math, os, random, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from harness import findings as registry
from harness.project import load_findings
load_findings(None, required=False, with_project=True)
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
from harness.measure.timing import CpuClock, Sampling, measure_interleaved
ours = measure_interleaved(calls, CpuClock(), finding=finding_id, case=case_label,
                           reference="baseline",
                           sampling=Sampling(time_budget_s=float(sys.argv[3]), min_rounds=8,
                                             max_rounds=int(sys.argv[4]), sequential=False,
                                             seed=random.randrange(1 << 30)))
"""

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


TABLES = {"condition": _condition_table, "conditions": _conditions_table,
          "planted": _planted_table,
          "gate-power": _gate_table, "duet": _duet_table}


def markdown(kind: str, folder: Path, *argument: str) -> str:
    """The markdown table `kind` (a key of TABLES; `condition` takes a CONDITIONS name,
    and, as `gate-power` does, the name of another machine's folder where its sets are
    meant) from the results saved in `folder`."""
    return "\n".join(TABLES[kind](folder, *argument))


def table(args) -> None:
    print("\n\n".join([*(markdown("condition", args.out, c) for c in CONDITIONS),
                        *(markdown("condition", args.out, c, m.name)
                          for m in _other_machines(args.out) for c in CONDITIONS
                          if _measured_series(m, c)),
                        *(markdown(kind, args.out) for kind in TABLES
                          if kind != "condition"),
                        *(markdown("gate-power", args.out, m.name)
                          for m in _other_machines(args.out) if _load(m, "gate-runs"))]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    sub = p.add_subparsers(dest="part", required=True)
    for name in ("series", "firsts", "reference", "planted", "gate", "duet", "table"):
        part = sub.add_parser(name)
        part.add_argument("out", type=Path)
        if name in ("series", "firsts", "planted"):
            part.add_argument("--run-args", nargs=argparse.REMAINDER, default=[],
                              help="more options for harness.run")
        if name in ("series", "firsts", "reference"):
            part.add_argument("--condition", choices=CONDITIONS, default="here")
    sub.choices["series"].add_argument("--runs", type=int, default=10)
    sub.choices["firsts"].add_argument("--pairs", type=int, default=5)
    for part in ("series", "firsts", "reference"):
        sub.choices[part].add_argument("--quick", action="store_true",
                                       help="the --quick runs' series")
    sub.choices["reference"].add_argument("--rows", type=int, default=40)
    sub.choices["reference"].add_argument("--processes", type=int, default=20)
    sub.choices["duet"].add_argument("--processes", type=int, default=5)
    sub.choices["duet"].add_argument("--seconds", type=float, default=3.0)
    sub.choices["gate"].add_argument("--runs", type=int, default=30)
    sub.choices["gate"].add_argument("--planted-runs", type=int, default=20)
    sub.choices["gate"].add_argument("--slowdowns", default="1.075,1.10")
    sub.choices["gate"].add_argument("--co-runner", action="store_true",
                                     help="unchanged runs beside a busy process")
    sub.choices["gate"].add_argument("--chunk", type=int, default=4,
                                     help="unchanged gate runs per saved chunk")
    sub.choices["gate"].add_argument("--planted-chunk", type=int, default=1,
                                     help="gate runs per slowdown per saved chunk")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(REPO))
    {"series": series, "firsts": firsts, "reference": reference, "planted": planted, "gate": gate,
     "duet": duet, "table": table}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
