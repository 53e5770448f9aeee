"""Save and resume a `VectorizedTrainer`: policy, optimiser, normalisers, RNG, LSTM state.

A checkpoint is one `torch.save` file of tensors and plain containers (`FORMAT_VERSION`).

Writing is atomic: the state goes to `<name>.<pid>.tmp` beside the checkpoint, is flushed
to disk (fsync), then renamed over it (`os.replace`), and the folder is synced. A writer
killed on the way (SIGKILL, a crash, power loss) leaves the previous checkpoint whole
and, at most, its temporary file, which `remove_orphans` deletes once no process has
that pid any more.

Reading is checked before anything of the trainer changes: `read_checkpoint` refuses a
file that is missing, not a regular file, unreadable or not a checkpoint of this format;
`restore_checkpoint` compares every field with what this trainer would save (the same
keys, tensor shapes and dtypes, finite values, counts >= 0) and the run's config with the
saved one. Each refusal is a `CheckpointError` naming the file and the field, what was
expected and what was found.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import re
import stat
import zipfile
from numbers import Real
from pathlib import Path

import torch

from esper.checks import is_int
from esper.training.trainer import VectorizedTrainer

#: 3: the device type of the action sampler whose state is saved (`sampler_device`)
FORMAT_VERSION = 3
#: the fields a checkpoint holds, in the order `restore_checkpoint` checks them
FIELDS = ("format_version", "identity", "variants", "iteration", "policy", "optimizer",
          "normalizer", "reward_normalizer", "sampler_device", "sampler", "torch_rng", "hidden")


class CheckpointError(ValueError):
    """A file that cannot be resumed from. One line, `checkpoint PATH: FIELD: expected ...;
    got ...` (no FIELD where the file as a whole is wrong), or `checkpoint PATH: config
    mismatch: ...` listing each field of the config that differs."""

    def __init__(self, path: str | Path, field: str | None, expected: str, got: str) -> None:
        self.path, self.field = Path(path), field
        where = f"checkpoint {path}: " + (f"{field}: " if field else "")
        super().__init__(f"{where}expected {expected}; got {got}")

    @classmethod
    def mismatch(cls, path: str | Path, problems: list[str]) -> "CheckpointError":
        """The run's config differs from the saved one: `problems`, one per field."""
        error = cls.__new__(cls)
        error.path, error.field = Path(path), "identity"
        ValueError.__init__(error, f"checkpoint {path}: config mismatch: " + "; ".join(problems))
        return error


# ------------------------------------------------------------------------------ writing

def _state(trainer: VectorizedTrainer) -> dict:
    """Everything a resumed run needs, in `FIELDS` order (tensors on their devices)."""
    return {
        "format_version": FORMAT_VERSION,
        "identity": trainer.config.identity(),
        "variants": trainer.config.variants.spec(),
        "iteration": trainer.iteration_count,
        "policy": trainer.policy.state_dict(),
        "optimizer": trainer.agent.optimizer.state_dict(),
        "normalizer": trainer.normalizer.state_dict(),
        "reward_normalizer": (trainer.reward_normalizer.state_dict()
                              if trainer.reward_normalizer is not None else None),
        "sampler_device": trainer.sampler.device.type,
        "sampler": trainer.sampler.get_state(),
        "torch_rng": torch.get_rng_state(),
        "hidden": tuple(h.cpu() for h in trainer.hidden),
    }


def temporary_path(path: str | Path, pid: int | None = None) -> Path:
    """Where `save_checkpoint` in process `pid` (default: this one) writes before the
    rename: `<name>.<pid>.tmp` in the checkpoint's folder (the same file system, so the
    rename is atomic)."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid() if pid is None else pid}.tmp")


def save_checkpoint(trainer: VectorizedTrainer, path: str | Path) -> None:
    """Write `trainer`'s state to `path` atomically: whole, or not at all.

    Creates missing folders. Raises `OSError` when the file cannot be written (a full
    disk, a read-only folder); the previous checkpoint at `path`, if any, is then
    unchanged and the temporary file removed.
    """
    path = Path(path)
    state = _state(trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        # "wb", not exclusive: a file of this name is a dead writer's (pids are unique
        # among live processes), and this process now owns the name
        with open(tmp, "wb") as file:
            try:
                torch.save(state, file)
            except RuntimeError as err:
                # torch's zip writer reports a failed write (a full disk, a size limit) as
                # a RuntimeError whose context is the OSError: raise that, as open() would
                if isinstance(err.__context__, OSError):
                    raise err.__context__ from err
                raise
            file.flush()
            os.fsync(file.fileno())  # the bytes on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:  # an error or a signal: no temporary file is left behind
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """fsync `folder`, so that the rename itself survives a power loss. Where folders
    cannot be opened or synced (Windows; some network file systems refuse with EINVAL)
    the rename is still atomic, only not yet durable: nothing to do about it here."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # see the docstring: durability is the file system's to give
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0 checks without sending anything)."""
    if pid <= 0:  # 0 and negatives name process groups, never a writer
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    except OverflowError:  # beyond any pid
        return False
    return True


def remove_orphans(path: str | Path) -> list[Path]:
    """Delete the temporary files of `path` (`temporary_path`) whose writer is no longer
    running, and return them: what a writer killed mid-write leaves. A file whose pid is
    alive (a writer at work, or the pid given to another process since) is kept.

    Only on POSIX systems, where signal 0 asks whether a pid exists; elsewhere `os.kill`
    would end the process, so nothing is removed.
    """
    path = Path(path)
    if os.name != "posix" or not path.parent.is_dir():
        return []
    pattern = re.compile(re.escape(path.name) + r"\.([0-9]+)\.tmp")
    removed = []
    for candidate in sorted(path.parent.glob(glob.escape(path.name) + ".*.tmp")):
        match = pattern.fullmatch(candidate.name)
        if match is None or _alive(int(match[1])):
            continue
        try:
            candidate.unlink()
        except FileNotFoundError:  # another run removed it first
            continue
        removed.append(candidate)
    return removed


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a file `save_checkpoint` wrote (of any format version): a torch
    zip file whose pickle names `format_version`. Reads the small pickle record only,
    not the tensors."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            return len(pickles) == 1 and b"format_version" in archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        # not a zip (BadZipFile), unreadable (OSError), or a corrupt one (the others)
        return False


# ------------------------------------------------------------------------------ reading

def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> dict:
    """The checkpoint at `path` as saved, tensors mapped to `device`; its fields are not
    checked yet (`restore_checkpoint` does, against a trainer).

    Raises `CheckpointError` for a path that is missing, not a regular file (a folder,
    a pipe or a device would block or never end), unreadable, not a torch file (a text,
    a truncated or corrupt file: torch.load's first line is quoted) or not a checkpoint
    of this `FORMAT_VERSION`.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(path, None, "a checkpoint file", "no such file") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise CheckpointError(path, None, "a checkpoint file",
                              f"a path that cannot be read ({getattr(err, 'strerror', None) or err})"
                              ) from err
    if not stat.S_ISREG(mode):
        raise CheckpointError(path, None, "a checkpoint file", _kind(mode))
    try:
        # weights_only: a checkpoint holds tensors and plain containers, and loading one
        # must not run arbitrary pickled code
        state = torch.load(path, map_location=device, weights_only=True)
    except OSError as err:
        raise CheckpointError(path, None, "a readable checkpoint file",
                              f"a read error ({err.strerror or err})") from err
    except Exception as err:  # torch.load on a file that is not one: each kind of damage
        # raises its own type (UnpicklingError, RuntimeError from the zip reader, EOFError,
        # ValueError, ...); whichever it is, the file is the problem. Its first line only:
        # the rest advises weights_only=False, which would run whatever code the file holds
        first = next(iter(str(err).strip().splitlines()), "")
        if "weights_only" in first:
            first = "not a weights-only torch file"
        raise CheckpointError(path, None, "a checkpoint written by save_checkpoint",
                              f"a file torch.load cannot read ({type(err).__name__}: {first})"
                              ) from err
    if not isinstance(state, dict):
        raise CheckpointError(path, None, "a checkpoint written by save_checkpoint (a dict)",
                              f"a torch file holding {_describe(state)}")
    version = state.get("format_version")
    if not is_int(version) or version != FORMAT_VERSION:  # the type first: a tensor has no single !=
        got = "no format_version" if "format_version" not in state else repr(version)
        raise CheckpointError(path, "format_version", f"{FORMAT_VERSION} (a checkpoint of this "
                              "esper; older ones cannot be resumed)", got)
    return state


def _describe(value: object) -> str:
    """What `value` is, in a few words, for a message."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        return f"a dict of {len(keys)} keys ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _expected(template: object) -> str:
    if isinstance(template, torch.Tensor):
        return (f"a {str(template.dtype).removeprefix('torch.')} tensor of shape "
                f"{list(template.shape)}")
    if isinstance(template, dict):
        return "a dict"
    if isinstance(template, (list, tuple)):
        return f"{len(template)} items"
    if template is None:
        return "None"
    if isinstance(template, bool):
        return "a bool"
    if is_int(template):
        return "an int >= 0" if template >= 0 else "an int"
    if isinstance(template, Real):
        return "a finite number"
    return f"a {type(template).__name__}"


def _check_like(value: object, template: object, field: str, path) -> None:
    """`CheckpointError` naming the first place where `value` differs in structure from
    `template` (what this trainer saves): a tensor of another shape or dtype or with a
    value that is not finite, a missing or extra key, another length, another type."""
    def bad(got: str) -> CheckpointError:
        return CheckpointError(path, field, _expected(template), got)

    if isinstance(template, torch.Tensor):
        if (not isinstance(value, torch.Tensor) or value.shape != template.shape
                or value.dtype != template.dtype):
            raise bad(_describe(value))
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            count = int((~torch.isfinite(value)).sum())
            raise CheckpointError(path, field, "finite values", f"{count} of {value.numel()} "
                                  "values NaN or infinite")
    elif isinstance(template, dict):
        if not isinstance(value, dict):
            raise bad(_describe(value))
        missing = [k for k in template if k not in value]
        if missing:
            raise CheckpointError(path, f"{field}.{missing[0]}", "to be present",
                                  "nothing: the key is missing")
        extra = [k for k in value if k not in template]
        if extra:
            raise CheckpointError(path, field, f"only this trainer's {len(template)} keys",
                                  f"also {', '.join(map(repr, extra[:4]))}")
        for key, item in template.items():
            _check_like(value[key], item, f"{field}.{key}", path)
    elif isinstance(template, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(template):
            raise bad(_describe(value))
        for i, (item, expected) in enumerate(zip(value, template)):
            _check_like(item, expected, f"{field}[{i}]", path)
    elif template is None or isinstance(template, (bool, str)):
        if type(value) is not type(template):
            raise bad(_describe(value))
    elif is_int(template):
        if not is_int(value) or (template >= 0 and value < 0):
            raise bad(_describe(value))
    elif isinstance(template, Real):
        if not (isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)):
            raise bad(_describe(value))


def _check_optimizer(value: object, template: dict, policy: torch.nn.Module, path) -> None:
    """The Adam state: the param groups as this optimiser's (the same parameters), and
    per parameter a step and two moments shaped like it. A fresh optimiser has no
    per-parameter state, so that part is checked against the parameters themselves."""
    if not isinstance(value, dict) or set(value) != {"state", "param_groups"}:
        raise CheckpointError(path, "optimizer", "an optimizer state dict (state, "
                              "param_groups)", _describe(value))
    groups = value["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(template["param_groups"]):
        raise CheckpointError(path, "optimizer.param_groups",
                              f"{len(template['param_groups'])} param groups", _describe(groups))
    for i, (group, expected) in enumerate(zip(groups, template["param_groups"])):
        field = f"optimizer.param_groups[{i}]"
        params = group.get("params") if isinstance(group, dict) else group
        if not isinstance(params, list) or params != expected["params"]:
            count = len(expected["params"])
            raise CheckpointError(path, f"{field}.params", f"the {count} parameter indices "
                                  f"[0, ..., {count - 1}]", _describe(params))
        for key in ("lr", "eps", "weight_decay"):
            _check_like(group.get(key), expected[key], f"{field}.{key}", path)
    parameters = list(policy.parameters())
    state = value["state"]
    if not isinstance(state, dict):
        raise CheckpointError(path, "optimizer.state", "a dict", _describe(state))
    for index, entry in state.items():
        field = f"optimizer.state[{index!r}]"
        if not is_int(index) or not 0 <= index < len(parameters):
            raise CheckpointError(path, "optimizer.state", f"parameter indices in [0, "
                                  f"{len(parameters)})", repr(index))
        param = parameters[index].detach()
        like = {"step": torch.zeros((), dtype=torch.float32), "exp_avg": param,
                "exp_avg_sq": param}
        _check_like(entry, like, field, path)
        if bool((entry["exp_avg_sq"] < 0).any()) or float(entry["step"]) < 0:
            raise CheckpointError(path, field, "a step and exp_avg_sq >= 0",
                                  "negative values")


def _check_ranges(state: dict, path) -> None:
    """What the types leave open: variances and counts are never negative."""
    for field, value in (("normalizer.var", state["normalizer"].get("var")),
                         ("reward_normalizer.m2", (state["reward_normalizer"] or {}).get("m2"))):
        low = (float(value.min()) if isinstance(value, torch.Tensor) and value.numel()
               else value)
        if low is not None and low < 0:
            raise CheckpointError(path, field, "values >= 0", f"a minimum of {low!r}")


def _mismatches(saved: dict, current: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(current), key=str):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _mismatches(a, b, f"{prefix}{key}.")
        elif type(a) is not type(b) or a != b:  # the type first: a tensor has no single !=
            out.append(f"{prefix}{key}: checkpoint has {_short(a)}, this run has {_short(b)}")
    return out


def _short(value: object) -> str:
    return repr(value) if not isinstance(value, (torch.Tensor, dict, list, tuple)) else _describe(value)


def restore_checkpoint(trainer: VectorizedTrainer, state: dict, path: str | Path = "<memory>"
                       ) -> list[str]:
    """Restore `trainer` in place from `state` (`read_checkpoint`), mapped to its device.

    Every field is checked first (`CheckpointError` naming `path` and the field, or every
    field of the config that differs), so a refused checkpoint leaves `trainer` as it
    was. Returns notes on what could not be restored exactly: the action sampler's state
    from another device type (a CUDA generator's cannot seed a CPU one) is replaced by
    a generator seeded from (seed, iteration).
    """
    missing = [f for f in FIELDS if f not in state]
    if missing:
        raise CheckpointError(path, missing[0], "to be present", "nothing: the key is missing")
    extra = [k for k in state if k not in FIELDS]
    if extra:
        raise CheckpointError(path, None, f"the fields {', '.join(FIELDS)}",
                              f"also {', '.join(map(repr, extra[:4]))}")
    if not isinstance(state["identity"], dict):
        raise CheckpointError(path, "identity", "a dict", _describe(state["identity"]))
    problems = _mismatches(state["identity"], trainer.config.identity())
    if problems:
        raise CheckpointError.mismatch(path, problems)
    template = _state(trainer)
    for field in ("variants", "iteration", "policy", "normalizer", "reward_normalizer",
                  "sampler_device", "torch_rng", "hidden"):
        _check_like(state[field], template[field], field, path)
    _check_optimizer(state["optimizer"], template["optimizer"], trainer.policy, path)
    _check_ranges(state, path)
    try:
        torch.device(state["sampler_device"])
    except RuntimeError:
        raise CheckpointError(path, "sampler_device", "a torch device type such as cpu or cuda",
                              repr(state["sampler_device"])) from None
    notes = []
    same_sampler = state["sampler_device"] == template["sampler_device"]
    if same_sampler:
        _check_like(state["sampler"], template["sampler"], "sampler", path)
    elif not isinstance(state["sampler"], torch.Tensor):
        raise CheckpointError(path, "sampler", "a uint8 tensor", _describe(state["sampler"]))

    # checked: from here on nothing raises on the checkpoint's account
    trainer.policy.load_state_dict(state["policy"])
    trainer.agent.optimizer.load_state_dict(state["optimizer"])
    trainer.normalizer.load_state_dict(
        {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state["normalizer"].items()}
    )
    if trainer.reward_normalizer is not None:
        trainer.reward_normalizer.load_state_dict(state["reward_normalizer"])
    if same_sampler:
        trainer.sampler.set_state(state["sampler"].cpu())
    else:
        # a tuple of ints hashes the same in every process (only str and bytes are salted)
        trainer.sampler.manual_seed(hash((trainer.config.seed, state["iteration"])) % 2**63)
        notes.append(f"checkpoint {path}: the action sampler was saved on "
                     f"{state['sampler_device']} and cannot be restored on "
                     f"{template['sampler_device']}: reseeded from (seed, iteration), so the "
                     "actions drawn differ from a run that was not interrupted")
    torch.set_rng_state(state["torch_rng"].cpu())
    trainer.hidden = tuple(h.to(trainer.device) for h in state["hidden"])
    trainer.iteration_count = state["iteration"]
    return notes


def load_checkpoint(trainer: VectorizedTrainer, path: str | Path) -> list[str]:
    """`restore_checkpoint(trainer, read_checkpoint(path, trainer.device), path)`: restore
    `trainer` from the file, or raise `CheckpointError` leaving it unchanged."""
    return restore_checkpoint(trainer, read_checkpoint(path, trainer.device), path)
