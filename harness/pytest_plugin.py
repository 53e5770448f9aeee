"""The pytest plugin: state a performance claim in a test, and let the test fail when the
measurement does not bear it out.

    def test_sum_dim_is_faster(claim):
        claim("MY-rowsums", variant="sum_dim", word="faster", counters={"host_syncs": 0})

`claim` measures the finding with `python -m harness.run` itself (`--findings ID --quick
--no-report --out DIR`: the same checks, paired rounds, fresh processes, statistics,
counters and results folder as on the command line), reads the run back
(`harness.results.load_run`) and asserts the variant's word against its baseline at every
case (or those named) and, where asked, its counters exactly. It prints one line (finding,
variant, case, ratio with its interval and level, the word and the one expected, the
counters, the run folder), which pytest's summary repeats under "esper-bench claims"; a
failed claim's message is that line and what failed.

The run is a process of its own, not a call inside pytest's: the run's budget counts from
the start of its process, its own process is one of the fresh processes that time every
cell (one that has run a test session is not fresh), and it owns the signal handlers and
torch's threads for its whole life.

Registered through the `pytest11` entry point `esper-bench`: installing esper-bench is
enough (`-p no:esper-bench` turns it off). Loading it imports pytest and the standard
library only: a session that states no claim pays nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import site
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from harness.measure.numbers import is_real, is_whole

#: the words a claim may expect of a variant against its baseline
WORDS = ("faster", "slower", "same")
#: harness.run's options that a claim sets from its own arguments
OWNED_OPTIONS = ("--findings", "--findings-module", "--out", "--quick", "--budget",
                 "--every-cell", "--device", "--processes", "--no-report", "--reports", "--resume", "--list",
                 "--all", "--help", "--version")
#: where runs go: the command-line option and the ini key (default: each test's tmp_path)
RESULTS_OPTION = "--esper-bench-results"
RESULTS_INI = "esper_bench_results"
#: the marker put on every test that uses the fixture (`-m esper_bench`, `-m "not ..."`)
MARKER = "esper_bench"
#: the report property that carries a claim's line to the summary (xdist passes it on)
PROPERTY = "esper-bench claim"
#: seconds a run has to stop by itself, keeping what it measured, once pytest is interrupted
INTERRUPT_GRACE_S = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("esper-bench", "esper-bench claims (the claim fixture)")
    group.addoption(RESULTS_OPTION, metavar="DIR", default=None,
                    help="keep each claim's run in DIR/<test id>/<run id> (default: the "
                         f"test's tmp_path); overrides the ini key {RESULTS_INI}")
    parser.addini(RESULTS_INI, default="",
                  help="the folder of the claims' runs, relative to the ini file (default: "
                       "each test's tmp_path)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: the test states a performance claim (the claim fixture), "
                   "which times code: keep it apart from a busy parallel run")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "claim" in getattr(item, "fixturenames", ()):
            item.add_marker(MARKER)


def pytest_terminal_summary(terminalreporter) -> None:
    lines = [f"{report.outcome.upper()} {value}"
             for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for name, value in getattr(report, "user_properties", ()) if name == PROPERTY]
    if lines:
        terminalreporter.write_sep("=", "esper-bench claims")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def claim(request: pytest.FixtureRequest, tmp_path: Path) -> "Claim":
    """State a performance claim and assert it: `claim(FINDING, word="faster",
    variant=None, case=None, counters=None, quick=True, budget=None, device=None,
    processes=None, module=None, options=())`.

    Runs `python -m harness.run --findings FINDING` in a process of its own (harness.run's
    checks, paired rounds, fresh processes, statistics, counters and results folder) and
    fails the test unless, at every case of the run (or each `case` names), no variant
    disagrees with its reference or raises, `variant` reads `word` ("faster", "slower" or
    "same") against the baseline, and each counter in `counters` (e.g. {"host_syncs": 0,
    "allocations": 1}) is exactly as given. Returns a `Claimed` (its line, run folder and
    rows); the line is printed and repeated in pytest's summary.

    FINDING is registered by a module this process imported (the test module, or a
    findings module it imports), by the findings modules of the project's pyproject.toml,
    or by `module`. `variant` defaults to the finding's proposed variant, or its only one
    besides the baseline. `word=None` asserts correctness and counters alone. An
    inconclusive word never satisfies a claim; a variant that needs CUDA at every case,
    on a machine without it, skips the test. `budget`, `device` and `processes` are
    harness.run's options, `options` any other of them (["--margin", "0.1"]). Runs go under
    the test's tmp_path, or DIR/<test id> with `--esper-bench-results DIR` or the ini key
    `esper_bench_results`.
    """
    return Claim(request, tmp_path)


def _bad(field: str, expected: str, received: object, why: str = "") -> None:
    __tracebackhide__ = True
    raise pytest.UsageError(f"claim: {field}: expected {expected}; got {received!r}{why}")


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What one `claim(...)` call states, its arguments checked (`of`)."""

    finding: str
    word: str | None
    variant: str | None
    cases: tuple[str, ...] | None
    """Case labels to judge (`rows=16`); None: every case the run measured."""
    counters: dict[str, int]
    quick: bool = True
    budget: float | None = None
    device: str | None = None
    processes: int | None = None
    modules: tuple[str, ...] = ()
    """The findings modules the run loads besides the project's (`--findings-module`)."""
    options: tuple[str, ...] = ()

    @classmethod
    def of(cls, finding, *, word, variant=None, case=None, counters=None, quick=True,
           budget=None, device=None, processes=None, module=None,
           options=()) -> "Expectation":
        """The arguments of `claim(...)`, checked: pytest.UsageError naming the first that
        is wrong, what it expects and what it got."""
        __tracebackhide__ = True
        if not isinstance(finding, str) or not finding:
            _bad("finding", "a finding id (a non-empty str)", finding)
        if word is not None and word not in WORDS:
            why = (" (an inconclusive word decides nothing: state the word you expect)"
                   if word == "inconclusive" else "")
            _bad("word", f"one of {', '.join(WORDS)}, or None for counters alone", word, why)
        if variant is not None and (not isinstance(variant, str) or not variant):
            _bad("variant", "a variant name (a non-empty str) or None", variant)
        cases = None
        if case is not None:
            cases = ((case,) if isinstance(case, str)
                     else tuple(case) if isinstance(case, Sequence) else ())
            if not cases or not all(isinstance(c, str) and c for c in cases):
                _bad("case", "a case label such as 'rows=16', a list of them, or None", case)
        counted = {}
        if counters is not None:
            if not isinstance(counters, Mapping):
                _bad("counters", "a dict of counter name -> exact count", counters)
            known = counter_names()
            for name, count in counters.items():
                if name not in known:
                    _bad("counters", f"counter names among {', '.join(known)}", name)
                if not is_whole(count) or count < 0:
                    _bad(f"counters[{name!r}]", "an exact count (an int >= 0)", count)
                counted[name] = count
        if word is None and not counted:
            _bad("word", "a word to assert (faster, slower, same), or counters to assert",
                 word, " (with neither, the claim would assert nothing)")
        if not isinstance(quick, bool):
            _bad("quick", "True or False", quick)
        if budget is not None and not (is_real(budget) and budget > 0):
            _bad("budget", "the run's wall seconds (a finite number > 0) or None", budget)
        if device is not None and not isinstance(device, str):
            _bad("device", "auto, cpu, cuda or cuda:N, or None", device)
        if processes is not None and not is_whole(processes):
            _bad("processes", "an int (harness.run's --processes) or None", processes)
        if module is not None and (not isinstance(module, str) or not module):
            _bad("module", "a findings module's name (pkg.module) or None", module)
        if isinstance(options, str) or not all(isinstance(o, str) for o in options):
            _bad("options", "a list of harness.run options, e.g. ['--margin', '0.1']", options)
        for option in options:
            if option.split("=", 1)[0] in OWNED_OPTIONS:
                _bad("options", "harness.run options the claim does not set itself (not "
                     f"{', '.join(OWNED_OPTIONS)}: those come from its arguments)", option)
        return cls(finding=finding, word=word, variant=variant, cases=cases,
                   counters=counted, quick=quick, budget=budget, device=device,
                   processes=processes, modules=(module,) if module else (),
                   options=tuple(options))

    def arguments(self, out: Path) -> list[str]:
        """harness.run's command line for this claim, its run going into `out`."""
        # every case the claim judges is measured: its budget shares out sampling only
        argv = ["--findings", self.finding, "--out", str(out), "--no-report", "--every-cell"]
        argv += ["--quick"] if self.quick else []
        argv += ["--budget", repr(float(self.budget))] if self.budget is not None else []
        argv += ["--device", self.device] if self.device is not None else []
        argv += ["--processes", str(self.processes)] if self.processes is not None else []
        for module in self.modules:
            argv += ["--findings-module", module]
        return [*argv, *self.options]


def counter_names() -> tuple[str, ...]:
    """The counters a results row holds (`harness.measure.counters.Counters.as_row`)."""
    from harness.measure.counters import Counters

    return tuple(Counters(op_calls=0, host_syncs=0, allocations=0, allocated_bytes=0,
                          kernel_launches=0).as_row())


def with_registered(expected: Expectation) -> Expectation:
    """`expected` with what this process's findings registry knows, where some module
    here registered findings (the registry is read only if it is already imported): the
    finding's variant and cases checked (pytest.UsageError naming them), and the module
    that registered it given to the run; for an id not registered here, every module that
    registered findings here, so that the run's unknown-id error names the nearest."""
    __tracebackhide__ = True
    registry = sys.modules.get("harness.findings")
    if registry is None:
        return expected
    loaded = [m for m in dict.fromkeys(registry.ORIGINS.values())
              if m in sys.modules and m != "__main__"]
    finding = registry.FINDINGS.get(expected.finding)
    if finding is not None:
        check_registered(expected, finding)
    if expected.modules:  # named by the test: the run loads it (and the project's)
        return expected
    if finding is None:
        return dataclasses.replace(expected, modules=tuple(loaded))
    origin = registry.ORIGINS.get(expected.finding)
    return dataclasses.replace(expected, modules=(origin,) if origin in loaded else ())


def check_registered(expected: Expectation, finding) -> None:
    """pytest.UsageError unless `finding` (the registered `Finding` of `expected`) has the
    variant (not its baseline) and the cases `expected` names."""
    __tracebackhide__ = True
    if expected.variant is not None:
        if expected.variant == finding.baseline:
            _bad("variant", f"a variant of {finding.id} other than its baseline "
                 f"{finding.baseline} (the ratio is variant / baseline)", expected.variant)
        if expected.variant not in finding.variants:
            _bad("variant", f"one of {finding.id}'s variants other than its baseline: "
                 f"{', '.join(v for v in finding.variants if v != finding.baseline)}",
                 expected.variant)
    if expected.cases is not None:
        try:
            labels = [c.label for c in finding.cases(expected.quick)]
        except Exception:  # user code: the run records it as the finding's failed row
            return
        for label in expected.cases:
            if label not in labels:
                _bad("case", f"one of {finding.id}'s cases with quick={expected.quick}: "
                     f"{', '.join(labels)}", label)


def resolve_variant(expected: Expectation, info: dict) -> str:
    """The variant the claim is about: the one named, else the finding's proposed one,
    else its only variant besides the baseline and peers (`info`: the run's
    `finding_info` of the finding). pytest.UsageError for an unknown one, or none."""
    __tracebackhide__ = True
    baseline = info.get("baseline")
    others = [v for v in info.get("variants") or () if v != baseline]
    if expected.variant is not None:
        if expected.variant not in others:
            _bad("variant", f"one of {expected.finding}'s variants other than its baseline "
                 f"{baseline}: {', '.join(others)}", expected.variant)
        return expected.variant
    if info.get("proposed"):
        return info["proposed"]
    own = [v for v in others if v not in (info.get("peers") or ())]
    if len(own) != 1:
        _bad("variant", f"one of {expected.finding}'s variants {', '.join(others)} (it has "
             "several besides its baseline and proposes none)", None)
    return own[0]


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A claim held against a run's rows (`judge`)."""

    line: str
    """The one line: finding, variant against baseline, each case's ratio with its
    interval and level, word and counters against those expected, whether it holds, the
    run folder."""
    problems: tuple[str, ...]
    """Why it does not hold, one entry each; empty when it holds."""
    skip: str | None = None
    """Why nothing of it could be measured here (a variant that needs CUDA), or None."""

    @property
    def holds(self) -> bool:
        return not self.problems and self.skip is None

    def message(self) -> str:
        return "\n".join([self.line, *(f"  - {p}" for p in self.problems)])


def judge(expected: Expectation, rows: Sequence[dict], info: dict, folder: Path) -> Judgement:
    """Hold `expected` against `rows`, the summary rows of its finding (placebo rows left
    out) in the run `folder`, whose `finding_info` for the finding is `info`.

    It holds when, at every case judged (those named, else every case of the run), no
    variant disagreed with its reference or raised, the variant reads the expected word
    and each expected counter is exactly as stated. An inconclusive word never holds: the
    problem says which way it leans and about how many rounds would decide it."""
    __tracebackhide__ = True
    from harness.report.summary import format_ratio, verdict_word

    variant = resolve_variant(expected, info)
    measured = list(dict.fromkeys(r["case"] for r in rows))
    labels = list(expected.cases) if expected.cases is not None else measured
    unknown = [c for c in labels if c not in measured]
    if unknown:
        _bad("case", f"one of the cases of {expected.finding} the run measured: "
             f"{', '.join(measured) or 'none'}", unknown[0])
    segments, problems, needs_cuda = [], [], []
    for label in labels:
        at = [r for r in rows if r["case"] == label]
        for row in at:  # correctness first: any variant that disagreed or raised here
            if row.get("status") == "mismatch":
                problems.append(f"FAIL: {row['variant']} disagreed with its reference at "
                                f"{label} ({text(row, 'reason', 'mismatch')})")
            elif row.get("status") == "failed":
                problems.append(f"ERROR: {row['variant']} raised at {label}: "
                                f"{text(row, 'error', 'no error recorded')}")
        row = next((r for r in at if r["variant"] == variant), None)
        if row is None:
            segments.append(f"at {label}: no row")
            problems.append(f"{variant} has no row at {label}")
            continue
        if row.get("status") == "needs_cuda":
            needs_cuda.append(label)
            segments.append(f"at {label}: needs CUDA, not measured here")
            continue
        if row.get("status") == "not_timed":
            problems.append(f"{variant} was not timed at {label}: "
                            f"{text(row, 'reason', 'no reason recorded')}")
        said = verdict_word(row)
        ratio = ""
        if is_real(row.get("ratio")):
            level = f" ({row['ci_level']:.1%} interval)" if is_real(row.get("ci_level")) else ""
            ratio = f"ratio {format_ratio(row)}{level} "
        word = f", expected {expected.word}" if expected.word is not None else ""
        counts = []
        for name, count in expected.counters.items():
            value = row.get(name)
            if not is_real(value):
                counts.append(f"{name} not counted (expected {count})")
                note = text(row, "profile_note", "the run counted nothing for this row")
                problems.append(f"{name}: expected {count}, not counted at {label} ({note})")
                continue
            counts.append(f"{name} {int(value)} (expected {count})")
            if int(value) != count:
                problems.append(f"{name}: expected {count}, measured {int(value)} at {label}")
        segments.append(f"at {label}: {ratio}{said}{word}"
                        + (f"; {', '.join(counts)}" if counts else ""))
        if expected.word is not None and row.get("status") == "ok" \
                and row.get("verdict") != expected.word:
            if row.get("verdict") == "inconclusive":
                problems.append(f"{label}: inconclusive, not {expected.word}: "
                                + how_to_decide(row))
            else:
                problems.append(f"{label}: {said}, not {expected.word}")
    skip = None
    if needs_cuda and len(needs_cuda) == len(labels) and not problems:
        skip = (f"{expected.finding} {variant} needs CUDA at every case, none measured on "
                f"this machine; run {folder}")
    verdict = "holds" if not problems else "does not hold"
    line = (f"{expected.finding} {variant} vs {info.get('baseline')} {'; '.join(segments)}; "
            f"{verdict}; run {folder}")
    return Judgement(line=line, problems=tuple(problems), skip=skip)


def text(row: dict, field: str, absent: str) -> str:
    """A row's text field, or `absent` where the row has none (a missing field reads back
    from the results files as NaN)."""
    value = row.get(field)
    return value if isinstance(value, str) and value else absent


def how_to_decide(row: dict) -> str:
    """For an inconclusive row: which way it leans, and what would decide it."""
    lean = f"it leans {row['lean']}; " if text(row, "lean", "") else ""
    rounds = row.get("rounds_to_decide")
    taken = f" (this run took {int(row['n'])})" if is_real(row.get("n")) else ""
    if is_real(rounds):
        return (f"{lean}about {int(rounds)} rounds would decide it{taken}: give the claim "
                "a larger budget=, more processes=, or a quieter machine")
    margin = row.get("margin") if is_real(row.get("margin")) else None
    edge = f" (±{margin:.0%})" if margin is not None else ""
    return (f"{lean}its ratio sits on the margin's edge{edge}: no number of rounds would "
            "decide it; state the word it is closer to, or another margin "
            "(options=['--margin', ...])")


@dataclasses.dataclass(frozen=True)
class Claimed:
    """What a claim that held found: its line, the run's folder and the rows judged."""

    line: str
    folder: Path
    rows: list[dict]
    """The summary rows of the finding at the cases judged (placebo rows left out), as
    `harness.results.load_run` reads them."""


class Claim:
    """The `claim` fixture's value: call it to state and assert a claim."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.request, self.tmp_path = request, tmp_path

    def __call__(self, finding: str, *, word: str | None, variant: str | None = None,
                 case: str | Sequence[str] | None = None,
                 counters: Mapping[str, int] | None = None, quick: bool = True,
                 budget: float | None = None, device: str | None = None,
                 processes: int | None = None, module: str | None = None,
                 options: Sequence[str] = ()) -> Claimed:
        __tracebackhide__ = True
        expected = with_registered(Expectation.of(
            finding, word=word, variant=variant, case=case, counters=counters, quick=quick,
            budget=budget, device=device, processes=processes, module=module,
            options=options))
        folder = self._run(expected)
        from harness.results import load_run

        run = load_run(folder)
        rows = [r for r in run.summary.to_dict("records")
                if r.get("finding") == expected.finding and not r.get("placebo")]
        info = (run.metadata.get("finding_info") or {}).get(expected.finding) or {}
        judgement = judge(expected, rows, info, folder)
        print(judgement.line)
        self.request.node.user_properties.append((PROPERTY, judgement.line))
        if judgement.skip is not None:
            pytest.skip(judgement.skip)
        if not judgement.holds:
            raise AssertionError(judgement.message())
        judged = set(expected.cases or (r["case"] for r in rows))
        return Claimed(line=judgement.line, folder=folder,
                       rows=[r for r in rows if r["case"] in judged])

    def results_dir(self) -> Path:
        """Where this test's runs go: DIR/<test id> where a folder is configured (the
        command-line option, relative to where pytest was started, else the ini key,
        relative to the ini file), else the test's tmp_path."""
        config = self.request.config
        given = config.getoption(RESULTS_OPTION)
        ini = config.getini(RESULTS_INI)
        if given:
            base = config.invocation_params.dir / given
        elif ini:
            base = (config.inipath.parent if config.inipath else config.rootpath) / ini
        else:
            return self.tmp_path
        return base / folder_for_test(self.request.node.nodeid)

    def _run(self, expected: Expectation) -> Path:
        """harness.run for `expected`, in a process of its own; the new run's folder. Its
        output goes into the test's report (pytest shows it when the test fails)."""
        __tracebackhide__ = True
        from harness.exits import run_group

        out = self.results_dir()
        before = runs_in(out)
        command = [sys.executable, "-m", "harness.run", *expected.arguments(out)]
        done = run_group(command, grace_s=INTERRUPT_GRACE_S, cwd=os.getcwd(),
                         env=child_environment(expected.modules))
        self.request.node.add_report_section(
            "call", "esper-bench run", f"$ {shlex.join(command)}\n{done.stdout}{done.stderr}")
        if done.returncode == 2:  # an input error: harness.run's one line, naming the option
            said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
            last = (said or done.stderr.strip().splitlines() or ["no message"])[-1]
            raise pytest.UsageError(f"claim({expected.finding!r}): harness.run refused it: "
                                    f"{last.removeprefix('error: ')}")
        if done.returncode not in (0, 1):
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            pytest.fail(f"claim({expected.finding!r}): harness.run ended with exit "
                        f"{done.returncode}, not a result ($ {shlex.join(command)}):\n{tail}",
                        pytrace=False)
        new = sorted(runs_in(out) - before)
        if len(new) != 1:
            pytest.fail(f"claim({expected.finding!r}): expected one new run in {out}; found "
                        f"{len(new)} ({', '.join(new) or 'none'})", pytrace=False)
        return out / new[0]


def runs_in(folder: Path) -> set[str]:
    """The names of the runs in a results folder (the folders holding a run.json)."""
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if (p / "run.json").is_file()}


def folder_for_test(nodeid: str) -> str:
    """A folder name for a test id: its characters that are safe in a file name, with a
    digest of the whole where it had to be shortened."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", nodeid).strip("-.") or "test"
    if len(name) > 120:
        name = f"{name[:100]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:12]}"
    return name


def child_environment(modules: Sequence[str]) -> dict[str, str]:
    """The run's environment: this process's, with PYTHONPATH led by the folders from
    which `modules` (the findings modules named to the run, the test module among them
    maybe) and this harness are imported here by name (pytest finds a test module
    through a sys.path entry of its own, which a new process would not have)."""
    site_folders = {str(Path(p).resolve())
                    for p in (*site.getsitepackages(), site.getusersitepackages())}
    roots = [import_root(m) for m in (*modules, "harness")]
    lead = [str(r) for r in roots if r is not None and str(r) not in site_folders]
    environ = dict(os.environ)
    path = [*lead, *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return environ


def import_root(module: str) -> Path | None:
    """The folder from which the imported module `module` is found by its name (the
    sys.path entry that holds it), or None when it is not imported from a file."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    # a package's __init__.py lies one folder deeper than a module of the same name
    levels = module.count(".") + (path.name == "__init__.py")
    return path.parents[levels]
