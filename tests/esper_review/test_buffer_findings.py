"""The rollout-buffer findings (B4-PT-05, B4-DRL-03's `assign`, AUDIT-5.1, AUDIT-4.3) and
M6's graph-break count: what each timed call does, its counts against the original's
(re-typed in tests/esper), and each correctness check catching a planted mismatch."""

from __future__ import annotations


import pytest
import torch

from esper.gae import compute_gae
from harness.findings import Case
from harness.measure.counters import profile_call
from esper_review.findings.buffer_layout import Laid, Storage
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
    assert f.variants == ("clone", "mask", "assign", "restructured")
    assert f.ours == ("assign", "restructured")
    assert f.proposed == "mask" and f.about.reviewed and f.about.fix and f.about.premise
    case = Case.of(num_envs=4, max_steps=25, dones="random0.05")
    rows = check_cell(f, case)
    assert all(rows[v]["status"] is None for v in ("mask", "assign", "restructured"))

    def shifted(advantages):
        return advantages + 1e-3

    rows = check_cell(f, case, make_call=planted(f, "assign", shifted))
    assert rows["assign"]["status"] == "mismatch"


# ----- B4-PT-05 -------------------------------------------------------------------------

def test_b4_pt_05_times_a_rollout_s_adds_and_the_update_read():
    """Each call adds a rollout (so the cached row's tensor goes stale and is rebuilt) and
    reads the batch; the ticket's tensor counts each add by tensor ops and reads its
    step back (a host read per add), ours through a NumPy view (none)."""
    f = finding("B4-PT-05")
    assert f.variants == ("list", "tensor", "cached", "numpy_view")
    assert f.proposed == "tensor" and f.ours == ("numpy_view",)
    inputs = f.build(SMALL, CPU, 0)
    cached = inputs["buffers"]["cached"]
    call = f.make_call("cached", inputs)
    first = call()["valid_mask"]
    counts = cached.step_counts_tensor()
    call()
    assert cached.step_counts_tensor() is not counts  # rebuilt by the second call too
    assert first.tolist() == [[True] * 3] * 2
    # the list rows make the original's conversion (a lift_fresh more), the tensor rows none
    counted = {v: profile_call(f.make_call(v, inputs)) for v in f.variants}
    ops = {v: c.ops for v, c in counted.items()}
    lifts = {v: ops[v]["aten::lift_fresh"] - ops["numpy_view"]["aten::lift_fresh"] for v in ops}
    assert lifts == {"list": 1, "tensor": 0, "cached": 1, "numpy_view": 0}
    adds = SMALL["num_envs"] * SMALL["max_steps"]
    assert counted["tensor"].host_syncs == adds and ops["tensor"]["aten::add_"] == adds
    assert counted["numpy_view"].host_syncs == counted["list"].host_syncs == 0
    assert "aten::add_" not in ops["numpy_view"] and "aten::add_" not in ops["list"]
    rows = check_cell(f, SMALL)
    assert all(rows[v]["status"] is None for v in ("tensor", "cached", "numpy_view"))

    def wrong_mask(batch):
        return {**batch, "valid_mask": ~batch["valid_mask"]}

    assert check_cell(f, SMALL, make_call=planted(f, "cached", wrong_mask))["cached"]["status"] \
        == "mismatch"


# ----- AUDIT-5.1 ------------------------------------------------------------------------

def test_audit_5_1_rows_store_the_same_rollout_and_only_checked_checks():
    f = finding("AUDIT-5.1-add-checks")
    assert f.variants == ("none", "mask_shapes", "checked") and f.baseline == "none"
    assert f.proposed == "mask_shapes" and f.ours == ("checked",)
    inputs = f.build(SMALL, CPU, 0)
    buffers = {v: f.make_call(v, inputs)() for v in f.variants}
    assert [buffers[v].variants.add_checks for v in f.variants] == list(f.variants)
    assert f.check(buffers["checked"], buffers["none"]) == 0.0
    assert f.check(buffers["mask_shapes"], buffers["none"]) == 0.0
    rows = check_cell(f, SMALL)
    assert rows["checked"]["status"] is None and rows["mask_shapes"]["status"] is None
    # the audit's checks read shapes only: no aten op more than the unchecked writes
    ops = {v: profile_call(f.make_call(v, inputs)).ops for v in ("none", "mask_shapes")}
    assert ops["mask_shapes"] == ops["none"]

    def one_state_off(buffer):
        buffer.states[1, 2, 0] += 1.0
        return buffer

    assert check_cell(f, SMALL, make_call=planted(f, "checked", one_state_off))["checked"][
        "status"] == "mismatch"


# ----- AUDIT-4.3 ------------------------------------------------------------------------

@pytest.mark.parametrize("part", ["evaluate", "read", "writes"])
def test_audit_4_3_layouts_hold_the_same_values_and_its_check_catches_a_swap(part):
    f = finding("AUDIT-4.3-buffer-layout")
    case = Case.of(num_envs=3, max_steps=4, part=part)
    assert check_cell(f, case)["time_major"]["status"] is None

    def swapped(output):
        if isinstance(output, Storage):
            output.tensors["states"][[0, 1]] = output.tensors["states"][[1, 0]]
            return output
        key = "values" if part == "evaluate" else "states"
        return Laid(output.layout, {**output.tensors, key: output.tensors[key].flip(1)})

    assert check_cell(f, case, make_call=planted(f, "time_major", swapped))["time_major"][
        "status"] == "mismatch"


def test_audit_4_3_reads_each_layout_as_stored_by_the_same_ops():
    """Like with like: each layout is read as get_batched_sequences reads it, every field
    returned as stored (no transpose to the other layout) and the step-0 hidden states
    made [L, n, H] and contiguous; the time-major network takes its batch as it is."""
    f = finding("AUDIT-4.3-buffer-layout")
    case = Case.of(num_envs=3, max_steps=4, part="read")
    inputs = f.build(case, CPU, 0)
    ops = {v: profile_call(f.make_call(v, inputs)).ops for v in f.variants}
    # the one difference: time-major step-0 states are one contiguous row (one layer),
    # so `contiguous()` copies nothing there; env-major copies both, as the original
    assert ops["env_major"]["aten::copy_"] == 2 and "aten::copy_" not in ops["time_major"]
    assert {k: n for k, n in ops["env_major"].items() if k not in ops["time_major"]} == \
        {"aten::contiguous": 2, "aten::clone": 2, "aten::copy_": 2, "aten::empty_like": 2}
    for variant, shape in (("env_major", (3, 4, 218)), ("time_major", (4, 3, 218))):
        read = f.make_call(variant, inputs)().tensors
        assert read["states"] is inputs["storages"][variant].tensors["states"]
        assert read["states"].shape == shape


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
    assert f.long and f.reading.answer == ("graph_breaks",) and f.ours == ("env_step", "policy_act")
    assert "not hold" in f.about.premise and "ppo.py:300" in f.about.premise
    assert f.skip("setup_inline", f.cases(True)[0], CPU) is None
