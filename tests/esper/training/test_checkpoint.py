"""Checkpoints: every way a file can fail to be one is a `CheckpointError` naming the file
and the field (never a KeyError or a traceback from deep inside torch), a refused file
leaves the trainer as it was, and writing is atomic, its leftovers removed on the next
start once their writer is dead (a real SIGKILL mid-write, in the integration test)."""

from __future__ import annotations

import copy
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from esper.env.config import EnvConfig
from esper.training.checkpoint import (
    FIELDS,
    FORMAT_VERSION,
    CheckpointError,
    is_checkpoint,
    load_checkpoint,
    read_checkpoint,
    remove_orphans,
    restore_checkpoint,
    save_checkpoint,
    temporary_path,
)
from esper.training.trainer import TrainConfig, VectorizedTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

REPO_ROOT = Path(__file__).resolve().parents[3]
#: a host small enough that a trainer builds and iterates in milliseconds
TINY = TrainConfig(num_envs=2, max_steps=2, seed=1, hidden_dim=8,
                   env=EnvConfig(input_dim=4, num_classes=2, host_hidden=8, train_batches=1,
                                 batch_size=8, val_size=16))


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except OSError:
        return 4194304  # Linux's largest


#: a pid no process can have: above the kernel's largest
DEAD_PID = pid_max() + 1


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A checkpoint after one iteration: every field filled in, Adam's moments included."""
    trainer = VectorizedTrainer(TINY)
    trainer.iteration()
    path = tmp_path_factory.mktemp("saved") / "run.pt"
    save_checkpoint(trainer, path)
    return path


def params(trainer: VectorizedTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.policy.parameters()]


def write_changed(saved: Path, tmp_path: Path, change) -> Path:
    """A copy of the saved checkpoint with `change(state)` applied."""
    state = copy.deepcopy(torch.load(saved, weights_only=True))
    change(state)
    path = tmp_path / "changed.pt"
    torch.save(state, path)
    return path


# ----- what a good checkpoint gives ------------------------------------------------------

def test_a_checkpoint_holds_every_field_and_resumes_to_the_same_state(saved):
    state = torch.load(saved, weights_only=True)
    assert tuple(state) == FIELDS and state["format_version"] == FORMAT_VERSION
    assert state["sampler_device"] == "cpu" and state["iteration"] == 1
    trainer = VectorizedTrainer(TINY)
    assert load_checkpoint(trainer, saved) == []
    for name, p in trainer.policy.named_parameters():
        assert torch.equal(p, state["policy"][name]), name
    assert trainer.iteration_count == 1


# ----- item by item: a field missing, of the wrong kind, or out of range ----------------

@pytest.mark.parametrize("field", [f for f in FIELDS if f != "format_version"])
def test_a_checkpoint_without_a_field_is_refused_naming_it(saved, tmp_path, field):
    """A checkpoint without `policy` used to end in a KeyError traceback."""
    path = write_changed(saved, tmp_path, lambda state: state.pop(field))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(VectorizedTrainer(TINY), path)
    assert str(info.value) == (f"checkpoint {path}: {field}: expected to be present; "
                               "got nothing: the key is missing")
    assert info.value.field == field and info.value.path == path


def _set(path: str, value):
    """A change that sets `state[a][b]...` (keys split on '/') to `value`."""
    *parents, last = path.split("/")

    def key(name: str):
        return int(name) if name.isdigit() else name  # list indices, optimizer state ids

    def change(state):
        for name in parents:
            state = state[key(name)]
        state[key(last)] = value(state[key(last)]) if callable(value) else value
    return change


WRONG = [
    ("policy", None, "policy: expected a dict; got NoneType None"),
    ("policy", [1, 2], "policy: expected a dict; got a list of 2 items"),
    ("policy/value_head.2.weight", lambda w: w[:, :3],
     "policy.value_head.2.weight: expected a float32 tensor of shape [1, 64]; got a float32 "
     "tensor of shape [1, 3]"),
    ("policy/value_head.2.weight", lambda w: w.double(),
     "policy.value_head.2.weight: expected a float32 tensor of shape [1, 64]; got a float64"),
    ("policy/value_head.2.weight", lambda w: torch.full_like(w, float("nan")),
     "policy.value_head.2.weight: expected finite values; got 64 of 64 values NaN or infinite"),
    ("policy/value_head.2.weight", "w", "policy.value_head.2.weight: expected a float32 tensor"),
    ("policy/extra.weight", torch.ones(1), "policy: expected only this trainer's 46 keys; got also 'extra.weight'"),
    ("optimizer", {"state": {}}, "optimizer: expected an optimizer state dict"),
    ("optimizer/param_groups/0/params", [0, 1],
     "optimizer.param_groups[0].params: expected the 46 parameter indices [0, ..., 45]; got a "
     "list of 2 items"),
    ("optimizer/param_groups/0/lr", "fast",
     "optimizer.param_groups[0].lr: expected a finite number; got str 'fast'"),
    ("optimizer/state/0/exp_avg", lambda t: t.flatten()[:5],
     "optimizer.state[0].exp_avg: expected a float32 tensor of shape"),
    ("optimizer/state/0/exp_avg_sq", lambda t: -1 - t,
     "optimizer.state[0]: expected a step and exp_avg_sq >= 0; got negative values"),
    ("optimizer/state/0", {"step": torch.tensor(1.0)}, "optimizer.state[0].exp_avg: expected "
                                                        "to be present"),
    ("normalizer/var", lambda v: v - 10, "normalizer.var: expected values >= 0; got a minimum"),
    ("normalizer/count", "3", "normalizer.count: expected an int >= 0; got str '3'"),
    ("normalizer/count", -1, "normalizer.count: expected an int >= 0; got int -1"),
    ("reward_normalizer", None, "reward_normalizer: expected a dict; got NoneType None"),
    ("reward_normalizer/mean", float("inf"),
     "reward_normalizer.mean: expected a finite number; got float inf"),
    ("reward_normalizer/m2", -1.0, "reward_normalizer.m2: expected values >= 0; got a minimum "
                                   "of -1.0"),
    ("iteration", -1, "iteration: expected an int >= 0; got int -1"),
    ("iteration", 1.5, "iteration: expected an int >= 0; got float 1.5"),
    ("iteration", True, "iteration: expected an int >= 0; got bool True"),
    ("variants", 7, "variants: expected a str; got int 7"),
    ("hidden", lambda h: h[:1], "hidden: expected 2 items; got a tuple of 1 items"),
    ("hidden", lambda h: (h[0], h[1][:, :1]),
     "hidden[1]: expected a float32 tensor of shape [1, 2, 8]; got a float32 tensor of shape "
     "[1, 1, 8]"),
    ("sampler", lambda s: s[:16], "sampler: expected a uint8 tensor of shape [5056]"),
    ("sampler_device", 0, "sampler_device: expected a str; got int 0"),
    ("sampler_device", "abacus", "sampler_device: expected a torch device type such as cpu or "
                                 "cuda; got 'abacus'"),
    ("torch_rng", [1, 2], "torch_rng: expected a uint8 tensor of shape [5056]; got a list"),
    ("identity", "tiny", "identity: expected a dict; got str 'tiny'"),
    ("identity/num_envs", 3, "config mismatch: num_envs: checkpoint has 3, this run has 2"),
    ("identity/seed", torch.tensor([1, 2]),
     "config mismatch: seed: checkpoint has a int64 tensor of shape [2], this run has 1"),
]


@pytest.mark.parametrize("where, value, message", WRONG, ids=[w[0] + "-" + w[2][:30] for w in WRONG])
def test_a_field_of_the_wrong_kind_is_refused_naming_it(saved, tmp_path, where, value, message):
    path = write_changed(saved, tmp_path, _set(where, value))
    trainer = VectorizedTrainer(TINY)
    before = params(trainer)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(trainer, path)
    assert str(info.value).startswith(f"checkpoint {path}: {message}"), str(info.value)
    assert "\n" not in str(info.value)
    # refused before anything was restored: the trainer is as it was built
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer)))
    assert trainer.iteration_count == 0


def test_an_extra_field_is_refused(saved, tmp_path):
    path = write_changed(saved, tmp_path, _set("notes", "hello"))
    with pytest.raises(CheckpointError, match="expected the fields format_version, .*; got "
                                              "also 'notes'"):
        load_checkpoint(VectorizedTrainer(TINY), path)


# ----- files that are not checkpoints at all ---------------------------------------------

def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    return path


@pytest.mark.parametrize("name, content, message", [
    ("empty.pt", b"", "expected a checkpoint written by save_checkpoint; got a file torch.load "
                      "cannot read (EOFError"),
    ("notes.txt", b"not a checkpoint", "expected a checkpoint written by save_checkpoint; got a "
                                       "file torch.load cannot read (UnpicklingError"),
    ("tensor.pt", torch.zeros(3), "expected a checkpoint written by save_checkpoint (a dict); "
                                  "got a torch file holding a float32 tensor of shape [3]"),
    ("list.pt", [1, 2], "got a torch file holding a list of 2 items"),
    ("other.pt", {"weights": torch.ones(2)}, "format_version: expected 3 (a checkpoint of this "
                                             "esper; older ones cannot be resumed); got no "
                                             "format_version"),
    ("old.pt", {"format_version": 2}, "format_version: expected 3"),
    ("odd.pt", {"format_version": torch.tensor([3, 3])}, "format_version: expected 3"),
])
def test_a_file_that_is_not_a_checkpoint_is_refused_in_one_line(tmp_path, name, content, message):
    path = _write(tmp_path, name, content)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    text = str(info.value)
    assert text.startswith(f"checkpoint {path}: ") and message in text, text
    assert "\n" not in text and "weights_only" not in text


def test_a_missing_path_a_folder_and_a_pipe_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # reading it would block forever
    for path, got in ((tmp_path / "absent.pt", "no such file"), (tmp_path, "a folder"),
                      (fifo, "a named pipe"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(CheckpointError, match=f"expected a checkpoint file; got {got}$"):
            read_checkpoint(path)
    with pytest.raises(CheckpointError, match="a path that cannot be read"):
        read_checkpoint(str(tmp_path / "nul\0.pt"))


def test_every_truncation_of_a_checkpoint_is_refused(saved, tmp_path):
    """What a writer killed without the atomic rename left (the old, direct write): each
    prefix of a whole checkpoint, at 64 lengths, is refused by reading or by the checks."""
    data = saved.read_bytes()
    cut = tmp_path / "cut.pt"
    for length in sorted({len(data) * i // 64 for i in range(64)}):
        cut.write_bytes(data[:length])
        with pytest.raises(CheckpointError):
            read_checkpoint(cut)


def test_a_checkpoint_of_a_sampler_on_another_device_type_is_reseeded_with_a_note(saved, tmp_path):
    """A CUDA generator's state (16 bytes: seed and offset) cannot seed a CPU generator;
    the rest is restored, mapped to the CPU, and the note says what differs."""
    def from_cuda(state):
        state["sampler_device"] = "cuda"
        state["sampler"] = torch.zeros(16, dtype=torch.uint8)
    path = write_changed(saved, tmp_path, from_cuda)
    trainer = VectorizedTrainer(TINY)
    (note,) = load_checkpoint(trainer, path)
    assert "the action sampler was saved on cuda and cannot be restored on cpu" in note
    expected = torch.Generator().manual_seed(hash((TINY.seed, 1)) % 2**63)
    assert torch.equal(trainer.sampler.get_state(), expected.get_state())
    trainer.iteration()  # and it trains on


# ----- writing: atomic, and leftovers of dead writers removed ------------------------------

def test_save_writes_through_a_temporary_file_named_by_the_pid_and_leaves_none(tmp_path):
    path = tmp_path / "sub" / "run.pt"
    save_checkpoint(VectorizedTrainer(TINY), path)
    assert temporary_path(path) == path.with_name(f"run.pt.{os.getpid()}.tmp")
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.pt"]
    assert is_checkpoint(path)


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_and_no_temporary_file(
        saved, tmp_path):
    """A real failure mid-write: the file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored,
    so that the write fails with EFBIG instead of killing the process) is set below a
    checkpoint's size, as a full disk would stop it."""
    path = tmp_path / "run.pt"
    path.write_bytes(saved.read_bytes())
    trainer = VectorizedTrainer(TINY)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            save_checkpoint(trainer, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == saved.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]


def test_remove_orphans_deletes_temporary_files_of_dead_writers_only(tmp_path):
    path = tmp_path / "run[1].pt"  # glob characters in the name are taken literally
    dead = temporary_path(path, DEAD_PID)
    alive = temporary_path(path, os.getpid())  # a live pid: a writer at work
    others = [tmp_path / f"run[1].pt.{DEAD_PID}.tmp.keep", tmp_path / "run[1].pt.abc.tmp",
              tmp_path / f"other.pt.{DEAD_PID}.tmp", tmp_path / f"run1.pt.{DEAD_PID}.tmp",
              tmp_path / "run[1].pt"]
    for p in (dead, alive, *others):
        p.write_bytes(b"partial")
    assert remove_orphans(path) == [dead]
    assert not dead.exists() and alive.exists() and all(p.exists() for p in others)
    assert remove_orphans(path) == []
    assert remove_orphans(tmp_path / "absent" / "run.pt") == []


def test_is_checkpoint_tells_a_checkpoint_from_other_files(saved, tmp_path):
    assert is_checkpoint(saved)
    assert not is_checkpoint(_write(tmp_path, "tensor.pt", torch.ones(2)))
    assert not is_checkpoint(_write(tmp_path, "text.txt", b"hello"))
    assert not is_checkpoint(tmp_path / "absent.pt")
    assert not is_checkpoint(tmp_path)


WRITER = """
import sys
import torch
from esper.env.config import EnvConfig
from esper.training.checkpoint import save_checkpoint
from esper.training.trainer import TrainConfig, VectorizedTrainer
torch.set_num_threads(1)
# a 1024-wide LSTM: tens of MB per checkpoint, so that a write takes a while
config = TrainConfig(num_envs=1, max_steps=1, hidden_dim=1024,
                     env=EnvConfig(input_dim=4, num_classes=2, host_hidden=8, train_batches=1,
                                   batch_size=8, val_size=16))
trainer = VectorizedTrainer(config)
while True:
    save_checkpoint(trainer, sys.argv[1])
"""


def kill_mid_write(path: Path) -> tuple[int, bool]:
    """Start a writer saving `path` in a loop; SIGKILL it as soon as its temporary file
    appears. Returns its pid and whether the temporary file outlived it."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=REPO_ROOT,
                              stderr=subprocess.PIPE)
    try:
        tmp = temporary_path(path, writer.pid)
        deadline = time.monotonic() + 120
        while not tmp.exists():
            assert writer.poll() is None, writer.stderr.read().decode()
            assert time.monotonic() < deadline, "the writer never began a checkpoint"
            time.sleep(0.001)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()  # reaped: its pid no longer exists
    return writer.pid, tmp.exists()


@pytest.mark.slow
@pytest.mark.integration  # launches Python processes and kills them
def test_a_writer_killed_mid_write_leaves_a_whole_or_no_checkpoint_and_the_next_run_cleans_up(
        tmp_path, capsys):
    from esper.train import main

    path = tmp_path / "run.pt"
    for _ in range(5):  # the kill can land just after a rename: then try again
        pid, orphaned = kill_mid_write(path)
        if orphaned:
            break
    assert orphaned, "5 writers were each killed after their rename, never during a write"
    # the checkpoint is whole (an earlier save) or absent (killed during the first)
    assert not path.exists() or set(read_checkpoint(path)) == set(FIELDS)
    orphan = temporary_path(path, pid)
    assert orphan.exists()

    # the next start removes it, in one line, and trains
    assert main(["--envs", "1", "--steps", "1", "--iterations", "1", "--device", "cpu",
                 "--threads", "1", "--checkpoint", str(path)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "removed" in line]
    assert lines == [f"removed {orphan}: a temporary checkpoint file of writer {pid}, which "
                     "is no longer running"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]
    assert is_checkpoint(path)
