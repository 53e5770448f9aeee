"""esper's shared argument checks, and the one list of every axis's values."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from esper.checks import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    is_integral,
    parse_int,
)
from esper.env import accumulators, bootstrap_states, mask_batch, stream_guard
from esper.variants import AXES


@pytest.mark.parametrize("value, minimum, below, message", [
    (True, 1, None, "n: expected a positive int; got True"),
    (0, 1, None, "n: expected a positive int; got 0"),
    (1.0, 1, None, "n: expected a positive int; got 1.0"),
    (-1, 0, None, "n: expected an int >= 0; got -1"),
    (3, 0, 3, "n: expected an int in [0, 3); got 3"),
    (np.int64(2), 1, None, "n: expected a positive int; got np.int64(2)"),
])
def test_check_int_names_field_expected_and_received(value, minimum, below, message):
    with pytest.raises(ValueError) as err:
        check_int("n", value, minimum, below)
    assert str(err.value) == message


def test_check_int_returns_what_passes():
    assert check_int("n", 2) == 2 and check_int("n", 0, minimum=0, below=1) == 0


@pytest.mark.parametrize("value, bounds, expected", [
    (True, {}, "a finite number"),
    (float("nan"), {"minimum": 0.0}, "a finite number >= 0"),
    (float("inf"), {"positive": True}, "a finite number > 0"),
    (0, {"positive": True}, "a finite number > 0"),
    (1.5, {"minimum": 0.0, "maximum": 1.0}, "a finite number in [0, 1]"),
    ("0.5", {}, "a finite number"),
])
def test_check_number_rejects_bools_non_finite_and_out_of_bounds(value, bounds, expected):
    with pytest.raises(ValueError, match="^" + re.escape(f"x: expected {expected}; got ")):
        check_number("x", value, **bounds)
    assert check_number("x", np.float32(0.5), minimum=0.0) == 0.5


def test_check_bool_and_check_choice():
    with pytest.raises(ValueError, match="^flag: expected a bool; got 1$"):
        check_bool("flag", 1)
    with pytest.raises(ValueError, match="^mode: expected one of a, b; got 'c'$"):
        check_choice("mode", "c", ("a", "b"))
    assert check_choice("mode", "b", ("a", "b")) == "b"


def test_is_integral_takes_numpy_ints_but_no_bool():
    assert is_integral(3) and is_integral(np.int32(3))
    assert not is_integral(True) and not is_integral(np.bool_(True)) and not is_integral(3.0)


def test_the_modules_of_an_axis_read_its_values_from_axes():
    """Written once, in `esper.variants.AXES`: the original's value first."""
    assert accumulators.MODES is AXES["accumulators"]
    assert bootstrap_states.MODES is AXES["bootstrap"]
    assert mask_batch.MODES is AXES["masks"]
    assert tuple(stream_guard.GUARDS) == AXES["stream_guard"]


@pytest.mark.parametrize("text, value", [("3", 3), (" 7 ", 7), ("+2", 2), ("0012", 12)])
def test_parse_int_reads_decimal_ascii_digits(text, value):
    assert parse_int("--n", text) == value


@pytest.mark.parametrize("text, message", [
    ("0", "--n: expected a positive int; got 0"),
    ("-3", "--n: expected a positive int; got -3"),
    ("1.5", "--n: expected a positive int; got '1.5'"),
    ("1e3", "--n: expected a positive int; got '1e3'"),
    ("1_000", "--n: expected a positive int; got '1_000'"),  # int() would take it
    ("\u0661", "--n: expected a positive int; got '\u0661'"),  # Arabic-Indic one: int() too
    ("", "--n: expected a positive int; got ''"),
    ("nan", "--n: expected a positive int; got 'nan'"),
    ("9" * 5000, "--n: expected a positive int; got '" + "9" * 60 + "...'"),  # int() raises
])
def test_parse_int_names_the_field_and_what_it_got(text, message):
    with pytest.raises(ValueError) as info:
        parse_int("--n", text)
    assert str(info.value).startswith(message)


def test_parse_int_bounds_as_check_int():
    assert parse_int("--seed", "0", minimum=0, below=10) == 0
    with pytest.raises(ValueError, match=r"--seed: expected an int in \[0, 10\); got 10"):
        parse_int("--seed", "10", minimum=0, below=10)


# --- a device: every constructor that takes one checks it the same way (check_device) -----

def _constructors():
    """name -> a function building that esper object on `device` (the public ones that
    take a device; each must check it with `check_device` before using it)."""
    from esper.agent.observation_normalizer import EmaNormalizer
    from esper.agent.policy import FactoredRecurrentActorCritic
    from esper.agent.ppo import PPOAgent
    from esper.env.accumulators import EpochAccumulators
    from esper.env.bootstrap_states import BootstrapStates
    from esper.env.config import EnvConfig
    from esper.env.environment import MorphoEnv
    from esper.env.mask_batch import MaskBatcher
    from esper.env.optimizers import EnvOptimizers
    from esper.env.pool import EnvBatches
    from esper.env.vectorized import VectorizedMorphoEnv
    from esper.rollout.buffer import RolloutBuffer
    from esper.rollout.staging import StagedCopy
    from esper.rollout.transfer import FlatTransfer
    from esper.training.trainer import TrainConfig, VectorizedTrainer

    return {
        "RolloutBuffer": lambda device: RolloutBuffer(2, 3, 4, lstm_hidden_dim=8, device=device),
        "VectorizedTrainer": lambda device: VectorizedTrainer(TrainConfig(), device=device),
        "PPOAgent": lambda device: PPOAgent(FactoredRecurrentActorCritic(4), device=device),
        "MorphoEnv": lambda device: MorphoEnv(EnvConfig(), device=device),
        "VectorizedMorphoEnv": lambda device: VectorizedMorphoEnv(EnvConfig(), device=device),
        "EnvBatches": lambda device: EnvBatches(EnvConfig(), device),
        "EmaNormalizer": lambda device: EmaNormalizer(4, device=device),
        "EpochAccumulators": lambda device: EpochAccumulators(device),
        "BootstrapStates": lambda device: BootstrapStates(2, 4, device),
        "MaskBatcher": lambda device: MaskBatcher(2, device),
        "EnvOptimizers": lambda device: EnvOptimizers([torch.zeros(2, requires_grad=True)],
                                                      lr=0.1, device=device),
        "StagedCopy": lambda device: StagedCopy((2,), torch.float32, device),
        "FlatTransfer": lambda device: FlatTransfer(device),
    }


CONSTRUCTORS = list(_constructors())


@pytest.mark.parametrize("name", CONSTRUCTORS)
@pytest.mark.parametrize(("device", "message"), [
    ("tpu", "device: expected 'cpu', 'cuda' or 'cuda:N' (or a torch.device of one); got "
            "'tpu', which torch does not know as a device"),
    ("mps", "device: expected a cpu or cuda device; got 'mps': esper runs on the CPU and "
            "on CUDA"),
    (3, "device: expected a torch.device or its name ('cpu', 'cuda', 'cuda:0'); got 3 (int)"),
    pytest.param("cuda", "device: expected a device this machine has; got 'cuda', but this "
                         "torch has no CUDA (torch.cuda.is_available() is False): use 'cpu'",
                 marks=pytest.mark.skipif(torch.cuda.is_available(),
                                          reason="needs a torch without CUDA")),
], ids=["tpu", "mps", "int", "cuda-without-cuda"])
def test_a_device_esper_cannot_use_is_a_value_error_naming_device(name, device, message):
    """`RolloutBuffer(device='cuda')` on a CPU-only torch raised torch's AssertionError and
    `device='tpu'` its RuntimeError, neither naming `device`; every constructor that takes
    a device says the same, through one check."""
    with pytest.raises(ValueError) as err:
        _constructors()[name](device)
    assert str(err.value) == f"{name}: {message}"


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_every_constructor_takes_the_cpu_by_name_and_as_a_torch_device(name):
    for device in ("cpu", torch.device("cpu")):
        _constructors()[name](device)
