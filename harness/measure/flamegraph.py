"""A py-spy flamegraph of a short program, recorded into a run's folder.

The program is the findings modules' `harness.Defaults.flamegraph` (a few iterations of
the code under test, say). py-spy launches it itself
(`py-spy record -- python ARGS`), which works where attaching to a running process is
forbidden (ptrace restrictions).
When py-spy is missing, cannot sample, or runs out of time, the outcome says why and the
run goes on: a flamegraph is a picture for the report, never a measurement.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

FLAME_FILE = "flame.svg"
_TITLE = re.compile(r'(<text id="title"[^>]*>)[^<]*(</text>)')


def find_pyspy() -> str | None:
    """py-spy next to this Python (a virtual env's bin/), else on PATH; None if neither."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


def record_flamegraph(folder: Path, program: tuple[str, ...], *,
                      executable: str | None = None, timeout_s: float = 300.0) -> dict:
    """Record `folder/flame.svg` of `python *program`; returns {"status", "file", "detail"}
    for the run's metadata.

    status: "recorded" (file holds the SVG), "missing" (no py-spy executable, or no
    program to record) or "failed" (py-spy exited non-zero, timed out, or wrote nothing;
    detail holds its last words).
    """
    if not program:
        return {"status": "missing", "file": None,
                "detail": "no program to record: no findings module names one "
                          "(harness.Defaults.flamegraph)"}
    executable = executable or find_pyspy()
    if executable is None or shutil.which(executable) is None:
        return {"status": "missing", "file": None,
                "detail": "py-spy is not installed (it is in the dev extra: pip install "
                          "-e '.[dev]')"}
    target = Path(folder) / FLAME_FILE
    # --nonblocking: sample without pausing the process, so the program runs at full speed
    command = [executable, "record", "--nonblocking", "--output", str(target), "--",
               sys.executable, *program]
    # own session: on a timeout the whole group goes, the training child included
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"status": "failed", "file": None,
                    "detail": f"py-spy did not finish within {timeout_s:.0f} s"}
    if process.returncode != 0 or not target.is_file() or target.stat().st_size == 0:
        last = (stderr or stdout).strip().splitlines()[-3:]
        return {"status": "failed", "file": None,
                "detail": f"py-spy exited with status {process.returncode}: " + " / ".join(last)}
    title = "py-spy record -- python " + " ".join(program)
    _retitle(target, title)
    return {"status": "recorded", "file": FLAME_FILE, "detail": title}


def _retitle(svg: Path, title: str) -> None:
    """Replace the SVG's title, which py-spy fills with its full command line: absolute
    paths of this machine that should not travel with the report."""
    text = svg.read_text()
    text, count = _TITLE.subn(lambda m: m.group(1) + html.escape(title) + m.group(2), text,
                              count=1)
    if count == 1:
        svg.write_text(text)
