"""The rollout-buffer findings (B4-PT-05, B4-DRL-03's `assign`, AUDIT-5.1, AUDIT-4.3) and
M6's graph-break count: what each timed call does, its counts against the original's
(re-typed in tests/esper), and each correctness check catching a planted mismatch."""

from __future__ import annotations


import pytest
import torch

from esper.gae import compute_gae
from harness.findings import Case
from harness.measure.counters import profile_call
from esper_review.findings.buffer_layout import Storage
from esper_review.findings.graph_breaks import (
    HostModel, SeedStage, auto_advance, graph_breaks, train_batch_inline,
)
from tests.esper.gae.test_loop_reads import episodes, original, terminals
from tests.esper_review.test_review_findings import CPU, check_cell, finding

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = Case.of(num_envs=2, max_steps=3)



def planted(f, variant: str, change):
    """`f.make_call` with `change(output)` applied to `variant`'s output."""
    def make_call(name, inputs):
        call = f.make_call(name, inputs)
        return (lambda: change(call())) if name == variant else call
    return make_call


# ----- B4-DRL-03: assign --------------------------------------------------------------

@pytest.mark.parametrize("make", [episodes, terminals])
def test_assign_keeps_the_originals_reads_and_drops_its_clones(make):
    """`assign` is clone without the allocations: the original's host reads (held to the
    re-typed original), no aten::clone, the same advantages and returns."""
    case = make(4, 25, 0)

    def ours(reset):
        return compute_gae(*case.args(), gamma=0.995, gae_lambda=0.95, method="loop", reset=reset)

    got, want, clone = (profile_call(f) for f in (lambda: ours("assign"), lambda: original(case),
                                                  lambda: ours("clone")))
    assert got.host_syncs == want.host_syncs == clone.host_syncs
    assert got.ops.get("aten::clone", 0) == 0 < want.ops["aten::clone"] == clone.ops["aten::clone"]
    for a, b in zip(ours("assign"), original(case)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_b4_drl_03_times_assign_as_ours_and_its_check_catches_a_wrong_row():
    f = finding("B4-DRL-03")
    assert f.variants == ("clone", "mask", "assign") and f.ours == ("assign",)
    assert f.proposed == "mask" and f.reviewed and f.fix and f.premise
    case = Case.of(num_envs=4, max_steps=25, dones="random0.05")
    rows = check_cell(f, case)
    assert rows["assign"]["status"] is None and rows["mask"]["status"] is None

    def shifted(advantages):
        return advantages + 1e-3

    rows = check_cell(f, case, make_call=planted(f, "assign", shifted))
    assert rows["assign"]["status"] == "mismatch"


# ----- B4-PT-05 -------------------------------------------------------------------------

def test_b4_pt_05_times_the_update_read_with_the_cache_stale_as_after_a_rollout():
    f = finding("B4-PT-05")
    inputs = f.build(SMALL, CPU, 0)
    cached = inputs["buffers"]["cached"]
    call = f.make_call("cached", inputs)
    first = call()["valid_mask"]
    counts = cached.step_counts_tensor()
    call()
    assert cached.step_counts_tensor() is not counts  # rebuilt by the second call too
    assert first.tolist() == [[True] * 3] * 2
    # the list row makes the original's conversion, the tensor row none
    ops = {v: profile_call(f.make_call(v, inputs)).ops for v in f.variants}
    assert ops["list"].get("aten::lift_fresh", 0) == ops["cached"].get("aten::lift_fresh", 0) == 1
    assert ops["tensor"].get("aten::lift_fresh", 0) == 0
    rows = check_cell(f, SMALL)
    assert all(rows[v]["status"] is None for v in ("tensor", "cached"))

    def wrong_mask(batch):
        return {**batch, "valid_mask": ~batch["valid_mask"]}

    assert check_cell(f, SMALL, make_call=planted(f, "cached", wrong_mask))["cached"]["status"] \
        == "mismatch"


# ----- AUDIT-5.1 ------------------------------------------------------------------------

def test_audit_5_1_rows_store_the_same_rollout_and_only_checked_checks():
    f = finding("AUDIT-5.1-add-checks")
    assert f.variants == ("none", "checked") and f.baseline == "none"
    inputs = f.build(SMALL, CPU, 0)
    buffers = {v: f.make_call(v, inputs)() for v in f.variants}
    assert [buffers["none"].variants.add_checks, buffers["checked"].variants.add_checks] == \
        ["none", "checked"]
    assert f.check(buffers["checked"], buffers["none"]) == 0.0
    assert check_cell(f, SMALL)["checked"]["status"] is None

    def one_state_off(buffer):
        buffer.states[1, 2, 0] += 1.0
        return buffer

    assert check_cell(f, SMALL, make_call=planted(f, "checked", one_state_off))["checked"][
        "status"] == "mismatch"


# ----- AUDIT-4.3 ------------------------------------------------------------------------

@pytest.mark.parametrize("part", ["read", "writes"])
def test_audit_4_3_layouts_hold_the_same_values_and_its_check_catches_a_swap(part):
    f = finding("AUDIT-4.3-buffer-layout")
    case = Case.of(num_envs=3, max_steps=4, part=part)
    assert check_cell(f, case)["time_major"]["status"] is None

    def swapped(output):
        if isinstance(output, Storage):
            output.tensors["states"][[0, 1]] = output.tensors["states"][[1, 0]]
            return output
        return {**output, "states": output["states"].flip(0)}

    assert check_cell(f, case, make_call=planted(f, "time_major", swapped))["time_major"][
        "status"] == "mismatch"


def test_audit_4_3_time_major_read_copies_every_field_and_env_major_none():
    """The read evaluate needs: env-major returns its fields as stored and copies only
    the step-0 hidden states into [L, n, H], as the original does; time-major copies
    every field, and its step-0 hidden states, a contiguous [n, 1, H] row, are already
    [1, n, H] in memory (one LSTM layer): no copy for them."""
    f = finding("AUDIT-4.3-buffer-layout")
    case = Case.of(num_envs=3, max_steps=4, part="read")
    inputs = f.build(case, CPU, 0)
    fields = len(inputs["storages"]["env_major"].tensors)
    copies = {v: profile_call(f.make_call(v, inputs)).ops.get("aten::copy_", 0) for v in f.variants}
    assert copies == {"env_major": 2, "time_major": fields}
    read = f.make_call("env_major", inputs)()
    assert read["states"] is inputs["storages"]["env_major"].tensors["states"]
    assert read["states"].shape == (3, 4, 218)


# ----- M6 -------------------------------------------------------------------------------

def test_graph_breaks_counts_a_break_and_none_where_there_is_none():
    x = torch.randn(4)

    def breaks_once():
        y = x * 2
        if y.sum().item() > 1e9:  # a host read: dynamo breaks the graph here
            y = y + 1
        return y - 1

    assert graph_breaks(lambda: torch.relu(x) * 3)["breaks"] == 0
    counted = graph_breaks(breaks_once)
    assert counted["breaks"] == 1 and "item()" in counted["reasons"]


def test_the_transcribed_setup_advances_the_germinated_seed_once():
    model = HostModel()
    auto_advance(model, ("r0c0", "r0c1", "r0c2"))
    assert [None if s.state is None else s.state.stage for s in model.seed_slots.values()] == \
        [SeedStage.TRAINING, None, SeedStage.TRAINING]
    loss = train_batch_inline(HostModel(), torch.randn(8, 16), torch.randint(0, 16, (8,)),
                              ("r0c0",))
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_m6_is_long_answers_with_graph_breaks_and_states_its_premise():
    f = finding("M6-graph-breaks")
    assert f.long and f.answer == ("graph_breaks",) and f.ours == ("env_step", "policy_act")
    assert "not hold" in f.premise and "ppo.py:300" in f.premise
    assert f.skip("setup_inline", f.cases(True)[0], CPU) is None
