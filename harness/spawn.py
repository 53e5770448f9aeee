"""Starting the run's worker processes (`harness.replica`), and a spare started at once.

`python -m harness.run` spends its first seconds importing torch and pandas, one core
busy, the other idle on a machine of two; its first worker then spent as long again
importing the same before it could take anything (on a cold run, beside the compile
warm-up, on the cores that warm-up needs). `start_spare`, called before the run's own
imports, launches that process at once: it imports beside the run, then waits for the
first line of its stdin, which the first `replica.Worker` the run creates writes
(`take_spare`): its `WorkerSpec` and the run's environment as it is then (the run sets
variables after its start: `isolate_compile_cache`; the spare's imports leave inductor,
which reads them when imported, unloaded). A spare the run never takes (nothing to
measure, a usage error) is killed when the run ends (`discard_spare`), and the kernel
kills it with the run (PR_SET_PDEATHSIG, set before its imports).

Light on purpose: imported before torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

from harness.exits import kill_group

#: what torchrun sets in each rank's environment (a child that inherits them would try to
#: join the launch's process group and wait for ever)
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")

#: the argument of a spare: `python -m harness.replica --spare PARENT_PID` reads its spec
#: from the first line of stdin
SPARE = "--spare"

#: arguments with which `harness.run` measures nothing: no spare is started
MEASURES_NOTHING = ("--list", "-h", "--help", "--version")


def solo_environment(environ: dict | None = None) -> dict:
    """A copy of the environment without torchrun's variables: for a child process that
    must be a world of its own (a gate run started by the quality runner on a rank)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k not in TORCHRUN_VARIABLES}


@dataclass
class Launched:
    """A `harness.replica` process: its pipes, where its stderr goes, when it started."""

    process: subprocess.Popen
    errors: IO[str]
    """Its stderr: a temporary file, read back for the reason it stopped."""
    at: float
    """Its launch, epoch seconds."""


def launch(*arguments: str) -> Launched:
    """Start `python -m harness.replica ARGUMENTS` (a spec as JSON, or `SPARE` and the
    run's pid): in a session of its own (a Ctrl-C at the terminal is the run's to
    handle, and the worker's group is killed with whatever it started), torchrun's
    variables left out, stdin and stdout pipes (its commands and answers)."""
    errors = tempfile.TemporaryFile(mode="w+")
    at = time.time()
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.replica", *arguments],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
        env=solo_environment(), start_new_session=True)
    return Launched(process, errors, at)


_spare: Launched | None = None


def start_spare(argv: list[str]) -> None:
    """Launch the spare, unless `argv` (the run's arguments) asks for nothing measured."""
    global _spare
    if _spare is None and not any(arg in MEASURES_NOTHING for arg in argv):
        _spare = launch(SPARE, str(os.getpid()))


def take_spare() -> Launched | None:
    """The spare, once (None where none was started or it was taken): its caller writes
    its spec line and owns it from then on."""
    global _spare
    taken, _spare = _spare, None
    return taken


def spare_pids() -> tuple[int, ...]:
    """The pid of the spare while nothing has taken it (the run's own process, busy with
    its imports when the run looks at how busy the machine is), else ()."""
    return () if _spare is None else (_spare.process.pid,)


def discard_spare() -> None:
    """Kill the spare if nothing took it."""
    taken = take_spare()
    if taken is not None:
        kill_group(taken.process)
        taken.errors.close()
