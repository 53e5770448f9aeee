"""`python -m esper.train` fuzzed: generated option values end in exit 0 or 2.

For every option, values that are empty, negative, zero, huge, inf, nan, unicode (other
scripts' digits, an undecodable byte as Python passes it in argv), paths that are files,
folders, read-only folders, /proc and /dev paths, paths with spaces, and free text; the
other options are a run of 1 env x 1 step, 1 iteration. What must hold for each:

- the exit status is 0 or 2; with 2, stderr is one line naming the option;
- no traceback;
- nothing changes in the sandbox (a folder with a file, a read-only folder, a folder with
  a space, a checkpoint) but the run's own checkpoint (`--checkpoint`, and the folders
  made for it), and no temporary file is left; nothing appears beside the sandbox.

A value that is valid and large (`--iterations 10**20`, `--envs 4096`) would train for
hours: such values are only parsed (`parse_options` must return them), not run.

In-process (`main(argv)`), with hypothesis' examples limited to stay within seconds; the
integration test runs a few values as a real process receives them (bytes that are not
UTF-8 in argv).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from esper.train import UsageError, main, one_line, parse_options
from esper.training.checkpoint import is_checkpoint
from esper.variants import AXES

#: the run every example starts from; the option under test replaces its value
BASE = {"--envs": "1", "--steps": "1", "--iterations": "1", "--device": "cpu",
        "--threads": "1", "--seed": "0", "--variants": "original",
        "--checkpoint": "out/run.pt"}
#: above these, a valid value is only parsed (training would take too long)
CHEAP = {"--envs": 2, "--steps": 2, "--iterations": 2}

NUMBERS = st.one_of(
    st.integers(-3, 3).map(str),
    st.integers(2**31 - 2, 2**70).map(str),
    st.sampled_from(["", " ", "-", "--", "inf", "-inf", "nan", "NaN", "1e3", "1.5", "-0",
                     "0x10", "1_0", "\u0661", "\uff12", "+1", " 2 ", "1 2", "\x00", "\udcff",
                     str(2**64 - 1), str(2**64), "9" * 5000, "4096", "4097"]),
    st.text(max_size=6),
)

PATHS = st.one_of(
    st.sampled_from([
        "", " ", "file.txt", "file.txt/run.pt", "ro", "ro/run.pt", "ro/inside.txt",
        "with space/run.pt", "with space", "good.pt", "missing.pt", "out/new/deeper/run.pt",
        "out", "/proc/self/status", "/proc/self/run.pt", "/proc", "/dev/null", "/dev/zero",
        "a\x00b.pt", "\udcff.pt", "\u00fc/\u00f1.pt", "x" * 300, "out/" + "x" * 300 + ".pt",
    ]),
    # free text inside the sandbox: never absolute, never out of it
    st.text(max_size=10).filter(lambda t: ".." not in t).map(lambda t: "./" + t),
)

VARIANTS = st.one_of(
    st.sampled_from(["original", "reviews", "ours", "", ",", "=", "gae=", "gae=scan,gae=loop",
                     "original,ours", "speed=max", "gae=\u0455can", "gae = scan",
                     "ours,gae=loop"]),
    st.builds(lambda axis, value: f"{axis}={value}", st.sampled_from(list(AXES)),
              st.sampled_from([v for values in AXES.values() for v in values] + ["x"])),
    st.text(max_size=12),
)

DEVICES = st.sampled_from(["auto", "cpu", "cuda", "cuda:0", "cuda:x", "cuda:-1", "CPU", "",
                           "gpu", "meta", "cpu:0", "cuda:99"]) | st.text(max_size=6)

VALUES = {"--envs": NUMBERS, "--steps": NUMBERS, "--iterations": NUMBERS, "--seed": NUMBERS,
          "--threads": NUMBERS, "--variants": VARIANTS, "--device": DEVICES,
          "--checkpoint": PATHS, "--resume": PATHS}


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory) -> bytes:
    """A checkpoint of BASE's run after its one iteration (what `good.pt` holds)."""
    path = tmp_path_factory.mktemp("good") / "good.pt"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main([*_argv(BASE), "--checkpoint", str(path)]) == 0
    return path.read_bytes()


def _argv(options: dict[str, str]) -> list[str]:
    return [item for option, value in options.items() for item in (option, value)]


def _sandbox(root: Path, checkpoint: bytes) -> Path:
    sandbox = root / "sandbox"
    sandbox.mkdir()
    (sandbox / "file.txt").write_text("keep me")
    (sandbox / "with space").mkdir()
    (sandbox / "good.pt").write_bytes(checkpoint)
    (sandbox / "out").mkdir()
    read_only = sandbox / "ro"
    read_only.mkdir()
    (read_only / "inside.txt").write_text("keep me too")
    read_only.chmod(0o555)
    return sandbox


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`: kind, permission bits and, for a file, a content hash."""
    out = {}
    for path in folder.rglob("*"):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                                              digest)
    return out


def _allowed(checkpoint: str | None, sandbox: Path) -> set[str]:
    """The sandbox entries a run may create or change: its checkpoint and its folders."""
    if not checkpoint or "\0" in checkpoint:
        return set()
    try:
        path = (sandbox / checkpoint).resolve().relative_to(sandbox.resolve())
    except (ValueError, OSError):  # outside the sandbox (/proc, /dev)
        return set()
    return {str(path), *(str(p) for p in path.parents if str(p) != ".")}


def _is_cheap(option: str, value: str) -> bool:
    """Whether a run with this value trains in milliseconds (or is refused)."""
    if option not in CHEAP:
        return True
    text = value.strip()
    digits = text.lstrip("+")
    return not (text.isascii() and digits.isdigit() and len(digits) <= 64
                and int(digits) > CHEAP[option])


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_option_value_ends_in_exit_0_or_2_naming_the_option(data, checkpoint_bytes,
                                                               tmp_path_factory, monkeypatch):
    option = data.draw(st.sampled_from(list(VALUES)), label="option")
    value = data.draw(VALUES[option], label="value")
    attached = data.draw(st.booleans(), label="--option=value")
    options = dict(BASE)
    if option == "--resume":  # resume good.pt (at iteration 1) to iteration 2
        options.update({"--iterations": "2", "--checkpoint": "out/resumed.pt"})
    options.pop(option, None)
    argv = [*_argv(options), *([f"{option}={value}"] if attached else [option, value])]

    root = tmp_path_factory.mktemp("fuzz")
    sandbox = _sandbox(root, checkpoint_bytes)
    monkeypatch.chdir(sandbox)
    before, beside = _snapshot(sandbox), sorted(os.listdir(root))
    threads = torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            if _is_cheap(option, value):
                status = main(argv)
            else:  # valid and large: parsed only
                assert getattr(parse_options(argv), option[2:]) == int(value)
                status = 0
    except UsageError as error:  # from parse_options: as main would have said it
        status, err = 2, io.StringIO(f"python -m esper.train: error: {one_line(str(error))}\n")
    finally:
        torch.set_num_threads(threads)
        (sandbox / "ro").chmod(0o755)  # so that the sandbox can be read and removed
    out, err = out.getvalue(), err.getvalue()
    shown = (option, value, err[-1500:])

    assert status in (0, 2), shown
    assert "Traceback" not in err, shown
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m esper.train: error: "), shown
        assert option in lines[0], shown

    after = _snapshot(sandbox)
    after["ro"] = before["ro"]  # its mode was restored above for the snapshot
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    checkpoint = options.get("--checkpoint") if option != "--checkpoint" else value
    assert changed <= _allowed(checkpoint, sandbox), (shown, changed)
    assert not [k for k in after if k.endswith(".tmp")], (shown, after)
    for name in changed:
        if (sandbox / name).is_file():
            assert is_checkpoint(sandbox / name), (shown, name)
    assert sorted(os.listdir(root)) == beside, shown
    shutil.rmtree(root)


REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.integration  # launches Python processes
@pytest.mark.parametrize("argv, option", [
    ([b"--resume", b"\xff\xfe.pt"], "--resume"),  # not UTF-8: Python sees surrogates
    ([b"--checkpoint", b"ro\nx/\xff.pt"], None),  # written: a new folder, a new file
    ([b"--envs=--"], "--envs"),
    ([b"--seed", "\u0661".encode()], "--seed"),
])
def test_a_process_given_odd_bytes_ends_in_exit_0_or_2(argv, option, tmp_path):
    (tmp_path / "ro").mkdir()
    base = _argv({k: v for k, v in BASE.items() if k != "--checkpoint"})
    result = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"esper.train", *map(os.fsencode, base), *argv],
        cwd=tmp_path, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    err = result.stderr.decode(errors="backslashreplace")
    assert b"Traceback" not in result.stderr, err
    if option is None:
        assert result.returncode == 0, err
        assert is_checkpoint(tmp_path / os.fsdecode(b"ro\nx/\xff.pt"))
    else:
        assert result.returncode == 2, err
        (line,) = err.splitlines()
        assert line.startswith("python -m esper.train: error: " + option), line
