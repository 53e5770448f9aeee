"""A worker: a fresh process that times the run's cells beside the run's own process.

A fresh process can run one variant faster or slower against another than the next
process does (where its code and data land, how its allocator starts), an offset that no
number of rounds inside one process sees. So the run times every cell in two or more
processes and words each row from all of them (`harness.combine`): its own, and workers
started with `python -m harness.replica SPEC_JSON` (`WorkerSpec`: the findings modules,
the device, the threads and the sampling options of the run).

A worker loads the findings modules once, then reads one JSON command per line on stdin,
`{"finding", "case", "headline", "sampling_s", "timed"}`, and times that cell as the run's
own process does (`harness.runner.CaseRun` with `check=False`: the run's process checked
the variants `timed` lists; no profiling), writing one JSON line per command on its
protocol pipe: `{"finding", "case", "samples": [sample rows, each with its "process"],
"failed": {variant: why}, "seconds", "stages": {stage: seconds}}`, or `{"finding",
"case", "error"}`. Its first line
says it is ready (`{"ready": seconds to load the findings modules, "at": its wall clock
then, epoch seconds}`) or why it is not (`{"error"}`). A command
without `"timed"` comes before the run knows which variants agreed: the worker prepares
the cell (inputs, the first call of every variant or of those its `"variants"` lists, at
the command's `"threads"`: the cores shared with the run's process) while the run's
process prepares its own,
answers `{"prepared": seconds}`, and takes `{"sampling_s", "timed", "min_rounds"}` from
the next line. `{"inductor_checks": true}` (no answer) has it load torch.compile's
machinery and run inductor's vector-ISA checks (`harness.isa_checks`) while it waits: a
cold run sends it once a warm-up process has ended and left a core idle, so that the
worker's first compiled call does not pay them (2-3 s) while the run's process waits.
The run interleaves the timing: for each cell, one process after the other, the order
alternating, none timing while another still prepares.

`python -m harness.replica --spare PARENT_PID` (`harness.spawn`, started before the run's
own imports) loads torch and the harness, then reads its first line of stdin, `{"spec":
SPEC_JSON, "environ": the run's environment then}`, and goes on as a worker started with
them; at the end of its input before that line it ends, having done nothing.

Nothing the findings print reaches the protocol (the worker's stdout goes to its stderr).
A worker ends at the end of its input, and with the run that started it, even one killed
outright (PR_SET_PDEATHSIG, set before its imports).
"""

from __future__ import annotations

if __name__ == "__main__":  # the kernel ends this process with the run, from its imports on
    import sys

    from harness.exits import die_with_parent
    from harness.spawn import SPARE

    die_with_parent(int(sys.argv[2]) if sys.argv[1:2] == [SPARE] and sys.argv[2:3]
                    and sys.argv[2].isdigit() else None, "the run")

import dataclasses
import json
import multiprocessing.connection
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

import torch

from harness import findings as registry
from harness.exits import UsageError, command, die_with_parent, kill_group
from harness.isa_checks import IsaChecks, check_isas_lazily
from harness.measure.decision import DEFAULT_MARGIN
from harness.measure.timing import pinned_threads
from harness.runner import CaseRun, RunOptions
from harness.spawn import SPARE, launch, solo_environment, take_spare

#: the `RunOptions` fields a worker takes from the run as they are; of the others it takes
#: the device by name and leaves profiling, sources and the bandwidth floor off (its
#: samples are all the run reads)
CARRIED_OPTIONS = ("quick", "seed", "min_samples", "max_samples", "margin", "precision",
                   "placebo")


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker measures (the run's own options); the cells come on its stdin."""

    findings_modules: tuple[str, ...] = ()
    device: str = "cpu"
    quick: bool = False
    seed: int = 0
    min_samples: int = 8
    max_samples: int = 200
    margin: float = DEFAULT_MARGIN
    precision: float = 0.03
    placebo: str = "headline"
    threads: int = 1
    process: int = 2
    """Which of the run's processes it is, in its sample rows; 0: a warm-up process,
    which fills compile caches and times nothing (`harness.run`'s warm step)."""
    parent: int | None = None
    """The run's pid: the worker stops when that process is gone."""

    @classmethod
    def of(cls, options: RunOptions, threads: int, findings_modules: Sequence[str] | None,
           process: int) -> "WorkerSpec":
        """The spec of worker `process` of a run under `options`."""
        return cls(findings_modules=tuple(findings_modules or ()), device=str(options.device),
                   threads=threads, process=process, parent=os.getpid(),
                   **{name: getattr(options, name) for name in CARRIED_OPTIONS})

    def options(self) -> RunOptions:
        return RunOptions(device=torch.device(self.device), profile=False,
                          **{name: getattr(self, name) for name in CARRIED_OPTIONS})


def measure_cell(spec: WorkerSpec, command: dict, commands: Iterator[str] | None = None,
                 protocol: TextIO | None = None) -> dict:
    """In the worker: one cell timed as the command says (module docstring). A command
    without `timed` prepares the cell (inputs, every variant's first call), says so on
    `protocol` (`{"prepared": seconds}`) and takes the rest, `{"sampling_s", "timed",
    "min_rounds"}`, from the next line of `commands`: the run prepares the cell meanwhile."""
    entry = {"finding": command["finding"], "case": command["case"]}
    started = time.perf_counter()
    waited = 0.0
    try:
        finding = registry.planned(registry.select([command["finding"]])[0], spec.quick)
        case = next((c for c in finding.cases(spec.quick) if c.label == command["case"]), None)
        if case is None:
            raise ValueError(f"{command['finding']} has no case {command['case']!r} here")
        cell = CaseRun(finding, case, spec.options(), headline=command["headline"],
                       process=spec.process, timed=command.get("timed", command.get("variants")),
                       check=False)
        with pinned_threads(command.get("threads") or spec.threads, compile_for=spec.threads):
            cell.prepare()
        if spec.process:  # a warm-up process times nothing: the trace would be for no one
            cell.trace_at_timed_threads()
        if "timed" not in command:
            _say(protocol, {"prepared": time.perf_counter() - started})
            asked = time.perf_counter()
            command = {**command, **json.loads(next(commands))}
            waited = time.perf_counter() - asked
            cell.leave_out_all_but(command["timed"])
        cell.sampling_s = command["sampling_s"]
        if command.get("min_rounds") is not None:  # the run's process chose fewer
            cell.min_rounds = int(command["min_rounds"])
        cell.time().finish(extra_metrics=False)  # the run's process records those
    except Exception as err:  # one cell that cannot run is that cell's, said
        return {**entry, "error": f"{type(err).__name__}: {err}"}
    failed = {v: row.get("error") or row.get("reason") or row["status"]
              for v, row in cell.cells.items()
              if v in command["timed"] and v not in cell.measurements and row.get("status")}
    return {**entry, "samples": cell.samples, "failed": failed,
            "seconds": time.perf_counter() - started - waited, "stages": cell.seconds}


def _say(protocol: TextIO, answer: dict) -> None:
    protocol.write(json.dumps(answer) + "\n")
    protocol.flush()


def serve(spec: WorkerSpec, commands: Iterator[str], protocol: TextIO) -> None:
    """Load the findings modules, say so, then answer each command line of `commands` on
    `protocol` until the input ends."""
    started = time.perf_counter()
    try:
        for module in spec.findings_modules:
            registry.load_findings_module(module)
    except registry.FindingsModuleError as err:
        _say(protocol, {"error": str(err)})
        return
    _say(protocol, {"ready": time.perf_counter() - started, "at": time.time()})
    with pinned_threads(spec.threads):
        commands = iter(commands)
        for line in commands:
            if not line.strip():
                continue
            command = json.loads(line)
            if command.get("inductor_checks"):
                # a failure is the compiling call's to meet: it runs the checks itself
                IsaChecks().wait()
                continue
            _say(protocol, measure_cell(spec, command, commands, protocol))


def answering_order(workers: Sequence["Worker"]) -> Iterator[int]:
    """The indices of `workers`, each yielded once that worker's next answer (or its end)
    can be read, the first to answer first: for workers each asked one thing at once,
    whose answers come in no known order. (An answer the worker's pipe had read ahead
    would not be seen: each has been read up to its last answer, as `ready` and every
    question leave it.)"""
    pending = list(range(len(workers)))
    while pending:
        readable = multiprocessing.connection.wait(
            [workers[index].process.stdout for index in pending])
        for index in [i for i in pending if workers[i].process.stdout in readable]:
            pending.remove(index)
            yield index


class WorkerError(RuntimeError):
    """A worker that could not start, or stopped answering."""


class Worker:
    """The run's side of one worker process: started, then `ready` (it has loaded the
    findings modules), `measure` one cell at a time, `close` last."""

    def __init__(self, spec: WorkerSpec) -> None:
        """Start the worker; it loads the findings modules while the caller goes on (the
        run prepares its first cell meanwhile), and `ready` waits for it. The first worker
        of a `python -m harness.run` is the spare it started before its imports
        (`harness.spawn`), told its spec now."""
        self.spec = spec
        spec_json = json.dumps(dataclasses.asdict(spec))
        spare = take_spare()
        launched = spare or launch(spec_json)
        self.process, self.errors, self._launched = launched.process, launched.errors, launched.at
        if spare is not None:
            # with the environment as it is now: the run sets some after the spare started
            # (`isolate_compile_cache`: inductor's folder, which inductor reads when it is
            # imported, after this). A spare that died meanwhile says why at `ready`, as a
            # worker that could not start.
            self._send({"spec": spec_json, "environ": solo_environment()})
        self.startup_s: float | None = None
        """Wall seconds from the worker's launch until it was ready: the interpreter, torch
        and the findings modules (None until `ready`). What one more fresh process costs
        before its first cell (`harness.run`'s budget for more processes)."""
        self._preparing: dict | None = None
        """The cell `prepare` began and `measure_prepared` has not timed yet."""

    def ready(self) -> None:
        """Wait until the worker has loaded the findings modules; WorkerError (the worker
        closed) where it could not."""
        if self.startup_s is not None:
            return
        first = self._answer()
        if "error" in first:
            self.close()
            raise WorkerError(f"worker {self.spec.process} could not start: {first['error']}")
        # its own clock says when it was ready: the run may read the line much later
        self.startup_s = max(float(first.get("at", time.time())) - self._launched, 0.0)

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            self.errors.seek(0)
            tail = self.errors.read().strip().splitlines()[-1:] or ["no output"]
            raise WorkerError(f"worker {self.spec.process} exited with "
                              f"{self.process.returncode}: {tail[0]}")
        return json.loads(line)

    def _send(self, command: dict) -> dict | None:
        """Write `command`: None, or `{"error": why}` where the worker cannot take it."""
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except OSError as err:
            return {"error": f"the worker failed: {err}"}
        return None

    def _receive(self) -> dict:
        """The worker's next answer (`{"error": why}` where the worker failed)."""
        try:
            self.ready()
            return self._answer()
        except (OSError, WorkerError, ValueError) as err:
            return {"error": f"the worker failed: {err}"}

    def _ask(self, command: dict) -> dict:
        """Write `command`; its answer (`{"error": why}` where the worker failed)."""
        return self._send(command) or self._receive()

    def measure(self, finding: str, case: str, headline: bool, sampling_s: float,
                timed: Sequence[str], min_rounds: int | None = None) -> dict:
        """The worker's entry for one cell; `{"error": why}` where the worker failed.
        `min_rounds`: the rounds it takes at least (None: the spec's `min_samples`)."""
        return {"finding": finding, "case": case, **self._ask(
            {"finding": finding, "case": case, "headline": headline, "sampling_s": sampling_s,
             "timed": list(timed), "min_rounds": min_rounds})}

    def run_inductor_checks(self) -> None:
        """Have the worker run inductor's vector-ISA checks while it waits for its first
        cell (no answer; a worker that failed says so at its next command)."""
        self._send({"inductor_checks": True})

    def prepare(self, finding: str, case: str, headline: bool, threads: int,
                variants: Sequence[str] | None = None) -> None:
        """Have the worker prepare one cell (inputs, first calls: of `variants` only, where
        given) at `threads` torch threads while the caller goes on; `prepared` waits for
        it, `measure_prepared` times it."""
        self._preparing = {"finding": finding, "case": case}
        only = {} if variants is None else {"variants": list(variants)}
        # a worker that cannot take it cannot answer it either: `prepared` says why
        self._send({**self._preparing, "headline": headline, "threads": threads, **only})

    def prepared(self) -> dict:
        """Wait until the cell `prepare` began is prepared: `{"prepared": seconds}`, or
        `{"error": why}` (then `measure_prepared` has nothing to time)."""
        answer = self._receive()
        if "error" in answer:
            self._preparing = None
        return answer

    def measure_prepared(self, sampling_s: float, timed: Sequence[str],
                         min_rounds: int | None = None) -> dict:
        """Time the prepared cell (the variants `timed`, none to release it): the
        worker's entry for it, as `measure`'s."""
        if self._preparing is None:
            return {"error": "the worker has no prepared cell"}
        cell, self._preparing = self._preparing, None
        return {**cell, **self._ask({"sampling_s": sampling_s, "timed": list(timed),
                                     "min_rounds": min_rounds})}

    def close(self) -> None:
        """End the worker (its input first, then its group) and forget its errors."""
        try:
            if self.process.stdin and not self.process.stdin.closed:
                self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):  # it did not end by itself: killed below
            pass
        finally:
            kill_group(self.process)
            self.errors.close()


def _spec(argv: list[str]) -> WorkerSpec:
    """The one argument, a `WorkerSpec` as JSON; UsageError naming what is wrong."""
    if len(argv) != 1:
        raise UsageError(f"expected one argument, a worker spec as JSON (python -m "
                         f"harness.replica SPEC_JSON); got {len(argv)}")
    try:
        raw = json.loads(argv[0])
        return WorkerSpec(**{**raw, "findings_modules": tuple(raw.get("findings_modules", ()))})
    except (ValueError, TypeError) as err:
        raise UsageError(f"SPEC_JSON: expected the fields of harness.replica.WorkerSpec; "
                         f"got {argv[0][:200]!r} ({type(err).__name__}: {err})") from err


def _spare_start(line: str) -> tuple[list[str], dict[str, str]]:
    """A spare's first line, `{"spec": SPEC_JSON, "environ": {name: value}}`: the argument
    a worker is started with and the environment it would have inherited; UsageError
    naming what is wrong."""
    try:
        first = json.loads(line)
        spec, environ = first["spec"], first["environ"]
        if not isinstance(spec, str) or not isinstance(environ, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
            raise TypeError("spec must be a string, environ an object of strings")
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f'{SPARE}: expected a first line {{"spec": SPEC_JSON, "environ": '
                         f"{{NAME: VALUE}}}} on stdin; got {line[:200]!r} "
                         f"({type(err).__name__}: {err})") from err
    return [spec], environ


@command
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SPARE]:  # its spec comes first on stdin, with the run's environment
        line = sys.stdin.readline()
        if not line:  # the run ended without needing it
            return 0
        argv, environ = _spare_start(line)
        os.environ.clear()
        os.environ.update(environ)
    spec = _spec(argv)
    die_with_parent(spec.parent, "the run")
    check_isas_lazily()  # before its findings modules, which may import inductor
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the findings print goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    serve(spec, sys.stdin, protocol)
    protocol.close()
    return 0


if __name__ == "__main__":
    code = main()
    # all the worker owes is written by now (its answers flushed, compile caches written
    # as they compile): it skips the interpreter's teardown, which with torch loaded
    # keeps the run waiting about half a second per worker
    sys.stderr.flush()
    os._exit(code)
