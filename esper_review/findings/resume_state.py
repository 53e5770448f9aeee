"""C2 (vectorized-training review, "Lines 730-742"): the LSTM state and the device on
resume. A correctness check: does a run resumed from a checkpoint continue exactly as one
that was never interrupted, with or without the checkpoint's LSTM state, and does a
checkpoint mapped to the CPU hold the same state? Its answer fields, not a time ratio,
answer the claim."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from esper.agent.heads import HEAD_NAMES
from esper.training.checkpoint import (
    load_checkpoint,
    read_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from esper.training.trainer import TrainConfig, VectorizedTrainer
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from esper_review.findings.trainer_size import nearest_trainer_size

#: fresh_hidden: resumed with a fresh LSTM state, as the reviewed code (its checkpoint has
#: none); restored_hidden: the review's fix, the checkpoint's LSTM state restored (ours)
VARIANTS = ("fresh_hidden", "restored_hidden")


def _cases(quick: bool) -> list[Case]:
    """One small case, quick or not: the answer is exact equality, which size does not
    change, and a call trains twice and builds two trainers (at 4 x 25 a call took 9-16 s
    on the 2-core CPU beside other work, a default run 11 minutes)."""
    return [Case.of(num_envs=2, max_steps=4, before=1)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    config = TrainConfig(num_envs=case["num_envs"], max_steps=case["max_steps"], seed=seed)
    return {"config": config, "before": case["before"], "device": device, "answers": {}}


def _outcome(trainer: VectorizedTrainer) -> torch.Tensor:
    """The next iteration of `trainer`, as numbers: the actions taken on its stored steps,
    its mean return, its update's losses and the policy's weights after it (float64, CPU)."""
    stats = trainer.iteration()
    valid = trainer.buffer.valid_mask()
    actions = [trainer.buffer.actions[h][valid].double().cpu() for h in HEAD_NAMES]
    u = stats.update
    scalars = torch.tensor([stats.mean_return, u["policy_loss"], u["value_loss"],
                            u["entropy"], u["approx_kl"]], dtype=torch.float64)
    weights = [p.detach().double().cpu().flatten() for p in trainer.policy.parameters()]
    return torch.cat([*actions, scalars, *weights])


def _trained(inputs: dict) -> VectorizedTrainer:
    trainer = VectorizedTrainer(inputs["config"], inputs["device"])
    for _ in range(inputs["before"]):
        trainer.iteration()
    return trainer


def _resumed(inputs: dict, hidden: str) -> VectorizedTrainer:
    """Train `before` iterations, save a checkpoint, resume a new trainer from it.

    `hidden`: `fresh` (the state a new run starts with, as the reviewed code), `restored`
    (the checkpoint's), or `poisoned` (the checkpoint's replaced by large random values
    before loading: if the next iteration still equals the uninterrupted one, the saved
    state is never read).
    """
    with tempfile.TemporaryDirectory(prefix="c2-resume-") as folder:
        path = Path(folder) / "run.pt"
        save_checkpoint(_trained(inputs), path)
        if hidden == "poisoned":
            state = torch.load(path, weights_only=True)
            gen = torch.Generator().manual_seed(0)
            state["hidden"] = tuple(100.0 * torch.randn(h.shape, generator=gen)
                                    for h in state["hidden"])
            torch.save(state, path)
        resumed = VectorizedTrainer(inputs["config"], inputs["device"])
        load_checkpoint(resumed, path)
    if hidden == "fresh":
        resumed.hidden = resumed.policy.initial_hidden(resumed.config.num_envs, resumed.device)
    return resumed


def _make_call(variant: str, inputs: dict):
    hidden = "fresh" if variant == "fresh_hidden" else "restored"

    def resume_and_continue() -> torch.Tensor:
        return _outcome(_resumed(inputs, hidden))

    return resume_and_continue


def _uninterrupted(inputs: dict) -> torch.Tensor:
    """The reference: the iteration after `before` of a run that never stopped."""
    return _outcome(_trained(inputs))


def _cached(inputs: dict, name: str, compute):
    """`compute()`, once per cell: the rows of both variants read the same runs."""
    answers = inputs["answers"]
    if name not in answers:
        answers[name] = compute()
    return answers[name]


def _state_on_cpu_equals_saved(inputs: dict) -> float:
    """1 if a CPU trainer restored from the run device's checkpoint, read with
    map_location to the CPU, holds exactly the saved weights, Adam moments and LSTM
    state, every tensor on the CPU; else 0."""
    with tempfile.TemporaryDirectory(prefix="c2-resume-") as folder:
        path = Path(folder) / "run.pt"
        save_checkpoint(_trained(inputs), path)
        saved = read_checkpoint(path, "cpu")
        trainer = VectorizedTrainer(inputs["config"], "cpu")
        restore_checkpoint(trainer, read_checkpoint(path, "cpu"), path)
    pairs = [(p, saved["policy"][name]) for name, p in trainer.policy.state_dict().items()]
    moments = trainer.agent.optimizer.state_dict()["state"]
    pairs += [(entry[k], saved["optimizer"]["state"][i][k])
              for i, entry in moments.items() for k in ("exp_avg", "exp_avg_sq")]
    pairs += list(zip(trainer.hidden, saved["hidden"]))
    return float(all(a.device.type == "cpu" and torch.equal(a, b) for a, b in pairs))


def _fact(name: str, value: float) -> dict[str, float]:
    """A yes (1) or no (0) that was observed, not estimated: its interval is itself."""
    return {name: value, f"{name}_low": value, f"{name}_high": value}


def _answers(variant: str, inputs: dict) -> dict[str, float]:
    """continues_exactly: the variant's next iteration equals the uninterrupted run's, bit
    for bit; hidden_read: the checkpoint's LSTM state changes what follows (poisoning it
    changes the next iteration); cpu_state_exact: mapped to the CPU, the resumed state
    equals the saved one. Each 1 or 0."""
    reference = _cached(inputs, "uninterrupted", lambda: _uninterrupted(inputs))
    hidden = "fresh" if variant == "fresh_hidden" else "restored"
    outcome = _cached(inputs, hidden, lambda: _outcome(_resumed(inputs, hidden)))
    poisoned = _cached(inputs, "poisoned", lambda: _outcome(_resumed(inputs, "poisoned")))
    restored = _cached(inputs, "restored", lambda: _outcome(_resumed(inputs, "restored")))
    cpu = _cached(inputs, "cpu", lambda: _state_on_cpu_equals_saved(inputs))
    return {
        **_fact("continues_exactly", float(torch.equal(outcome, reference))),
        **_fact("hidden_read", float(not torch.equal(poisoned, restored))),
        **_fact("cpu_state_exact", cpu),
    }


register(Finding(
    id="C2-resume-state",
    title="Resume: a fresh LSTM state (as reviewed) vs the checkpoint's (the fix)",
    claim="The LSTM hidden states from the checkpoint are not restored. This means resumed "
          "training always starts with fresh hidden states, losing temporal context",
    variants=VARIANTS,
    baseline="fresh_hidden",
    proposed="restored_hidden",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    reference=_uninterrupted,
    tolerance=0.0,
    # long: a correctness check (its answer is exact equality, its time a file's write and
    # read) that trains twice per call: 7 s of a quick run, 10 s of a default one;
    # the full test run checks it through harness.run (tests/esper_review/test_resume_state.py)
    long=True,
    # not gated: a correctness check whose timed call writes and reads a file
    gated=False,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:729-745 @2df957ed (resume: torch.load "
                 "with map_location=device, PPOAgent.load(resume_path, device=device)), "
                 "src/esper/simic/agent/ppo.py:737-802 @2df957ed (PPOAgent.load)",
        fix="Store and restore LSTM hidden states in checkpoints; verify PPOAgent.load() "
            "respects the device parameter (the review's recommendation)",
        premise="At 2df957ed every batch of episodes starts from a zero LSTM state "
                "(vectorized.py:1113, `env_states[env_idx].lstm_hidden = None  # Fresh hidden "
                "for new episode`) and the only save is once after training "
                "(vectorized.py:2424-2439, agent.save): a resumed run starts a new batch, which "
                "starts from a zero state anyway, so no temporal context is lost. The device "
                "mapping is consistent: PPOAgent.load calls torch.load(path, map_location=device, "
                "weights_only=True) (ppo.py:752) and builds the agent with device=device "
                "(ppo.py:790-795). esper is the same: esper/training/checkpoint.py saves and "
                "restores `hidden`, and VectorizedTrainer.rollout replaces it with "
                "policy.initial_hidden at each rollout's start.",
        duration_s=(10.0, 10.0),
        notes=(
            "One timed call = train `before` iterations, save a checkpoint (a temporary "
            "folder, removed after), build a new trainer, resume it from the file and run one "
            "more iteration: fresh_hidden then sets the LSTM state a new run starts with (the "
            "reviewed code's resume), restored_hidden keeps the checkpoint's (the fix).",
            "The check compares that iteration, bit for bit (tolerance 0), with the same "
            "iteration of a run that was never interrupted: the actions taken on every stored "
            "step, the mean return, the update's losses and every weight after the update.",
            "continues_exactly (1/0): the resumed run equals the uninterrupted one. hidden_read "
            "(1/0): replacing the checkpoint's LSTM state by large random values changes the "
            "next iteration (0: it is never read, the rollout starts from a fresh state). "
            "cpu_state_exact (1/0): the checkpoint of the run's device, read with map_location "
            "to the CPU into a CPU trainer, gives exactly the saved weights, Adam moments and "
            "LSTM state, all on the CPU (on a CPU run, the CPU's own checkpoint). On CUDA "
            "the CPU trainer's action sampler cannot take a CUDA generator's state and is "
            "reseeded (esper.training.checkpoint), so only the state, not the continuation, "
            "is compared across devices.",
        ),
    ),
    recording=Recording(
        extra_metrics=_answers,
    ),
    reading=Reading(
        headline_case=nearest_trainer_size,
        answer=("continues_exactly", "hidden_read", "cpu_state_exact"),
    ),
))
