"""C2-resume-state: its check and answers hold on esper as it is, and tell apart a trainer
that does carry its LSTM state across rollouts (what the review assumed), planted here."""

from __future__ import annotations

import pytest
import torch

from esper.training.trainer import VectorizedTrainer
from harness.findings import Case
from harness.results import load_run
from harness.run import main
from esper_review.findings import resume_state
from tests.esper_review.test_review_findings import CPU, check_cell, finding

pytestmark = pytest.mark.usefixtures("one_thread")

CASE = Case.of(num_envs=2, max_steps=3, before=1)


class CarriesHidden(VectorizedTrainer):
    """A planted trainer whose rollout starts from the LSTM state the last one ended in
    (or the one a checkpoint restored), instead of a fresh one: the review's premise."""

    def rollout(self) -> float:
        carried = self.hidden
        self.policy.initial_hidden = lambda batch, device="cpu": carried
        try:
            return super().rollout()
        finally:
            del self.policy.initial_hidden  # the class's method again


def answers() -> dict[str, dict]:
    """Each variant's answer fields at CASE on the CPU."""
    f = finding("C2-resume-state")
    inputs = f.build(CASE, CPU, 0)
    return {v: f.recording.extra_metrics(v, inputs) for v in f.variants}


def test_esper_resumes_exactly_and_never_reads_the_saved_lstm_state():
    rows = check_cell(finding("C2-resume-state"), CASE)
    for variant in resume_state.VARIANTS:
        assert rows[variant]["max_error"] == 0.0 and rows[variant]["status"] is None
    for variant, got in answers().items():
        assert got["continues_exactly"] == 1.0, variant
        assert got["hidden_read"] == 0.0 and got["cpu_state_exact"] == 1.0
        for name in ("continues_exactly", "hidden_read", "cpu_state_exact"):
            assert got[f"{name}_low"] == got[name] == got[f"{name}_high"]


def test_a_trainer_that_carries_its_lstm_state_is_told_apart(monkeypatch):
    """With the state carried across rollouts, the saved state is read (poisoning it
    changes what follows), the fix continues exactly and a fresh state does not."""
    monkeypatch.setattr(resume_state, "VectorizedTrainer", CarriesHidden)
    got = answers()
    assert got["restored_hidden"]["continues_exactly"] == 1.0
    assert got["fresh_hidden"]["continues_exactly"] == 0.0
    assert got["restored_hidden"]["hidden_read"] == 1.0
    rows = check_cell(finding("C2-resume-state"), CASE)
    assert rows["restored_hidden"]["max_error"] == 0.0
    assert rows["fresh_hidden"]["status"] == "mismatch"


def test_the_check_catches_a_resume_that_loses_the_sampler(monkeypatch):
    """A planted resume that forgets the action sampler's state: other actions follow."""
    load = resume_state.load_checkpoint

    def forgetful(trainer, path):
        notes = load(trainer, path)
        trainer.sampler.manual_seed(12345)
        return notes

    monkeypatch.setattr(resume_state, "load_checkpoint", forgetful)
    rows = check_cell(finding("C2-resume-state"), CASE)
    assert rows["restored_hidden"]["status"] == "mismatch"


def test_fresh_hidden_is_the_state_the_original_starts_a_batch_from():
    """The baseline resumes as the reviewed code does:

        # src/esper/simic/training/vectorized.py:1110-1113 @2df957ed
        for env_idx in range(envs_this_batch):
            agent.buffer.start_episode(env_id=env_idx)
            env_states[env_idx].lstm_hidden = None  # Fresh hidden for new episode

    and an nn.LSTM given `None` starts from zeros: `initial_hidden` is that state."""
    trainer = VectorizedTrainer(resume_state.TrainConfig(num_envs=2, max_steps=2))
    x = torch.randn(2, 3, trainer.config.hidden_dim)
    lstm = trainer.policy.lstm
    fresh = trainer.policy.initial_hidden(2)
    original_out, (h0, c0) = lstm(x, None)
    ours_out, (h1, c1) = lstm(x, fresh)
    assert torch.equal(original_out, ours_out) and torch.equal(h0, h1) and torch.equal(c0, c1)


def test_the_finding_states_its_provenance():
    f = finding("C2-resume-state")
    assert "@2df957ed" in f.about.reviewed and "vectorized.py:1113" in f.about.premise
    assert f.reading.answer == ("continues_exactly", "hidden_read", "cpu_state_exact")
    assert not f.gated


@pytest.mark.integration
def test_quick_run_answers_through_harness_run(tmp_path):
    assert main(["--quick", "--findings", "C2-resume-state", "--budget", "1", "--every-cell",
                 "--precision", "0", "--no-report", "--out", str(tmp_path),
                 "--device", "cpu"]) == 0
    rows = load_run(None, tmp_path).summary.set_index("variant")
    for variant in resume_state.VARIANTS:
        assert rows.loc[variant, "continues_exactly"] == 1.0
        assert rows.loc[variant, "hidden_read"] == 0.0
        assert rows.loc[variant, "cpu_state_exact"] == 1.0
