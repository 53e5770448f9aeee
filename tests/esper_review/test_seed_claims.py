"""The tickets' side claims that no timing decides, each held to what esper (and the
re-typed original) does: docs/findings.md, "Side claims, answered", cites these tests."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.rollout.buffer import RolloutBuffer
from esper.variants import Variants
from harness.measure.counters import profile_call
from esper_review.findings.step_counts import HIDDEN, STATE_DIM, fill, rollout_steps
from tests.esper.rollout.test_add_checks import original_add_writes

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


def original_buffer() -> RolloutBuffer:
    """A buffer of the reviewed trainer's size (4 envs x 25 steps, 218 state features,
    LSTM 128, one layer) written as the original writes it."""
    return RolloutBuffer(4, 25, STATE_DIM, lstm_hidden_dim=HIDDEN, variants=Variants.original())


def stored_tensors(buffer: RolloutBuffer) -> list[torch.Tensor]:
    """Every pre-allocated tensor the buffer stores (599f3895 rollout_buffer.py:182-238:
    states, 8 x actions, log-probs and masks, values, rewards, dones, truncated, bootstrap
    values, hidden h and c, advantages, returns)."""
    return [buffer.states, buffer.values, buffer.rewards, buffer.dones, buffer.truncated,
            buffer.bootstrap_values, buffer.hidden_h, buffer.hidden_c, buffer.advantages,
            buffer.returns, *buffer.actions.values(), *buffer.log_probs.values(),
            *buffer.masks.values()]


def stored_bytes(buffer: RolloutBuffer) -> int:
    return sum(t.numel() * t.element_size() for t in stored_tensors(buffer))


def test_audit_4_1_the_buffer_holds_about_200_kb_not_100():
    """'Predictable memory footprint (~100KB for 4 envs x 25 steps)': 205,300 bytes, half
    of them the two hidden-state tensors (102,400), the states 87,200."""
    buffer = original_buffer()
    assert stored_bytes(buffer) == 205_300
    assert buffer.hidden_h.nbytes + buffer.hidden_c.nbytes == 102_400
    assert buffer.states.nbytes == 87_200


def test_audit_4_1_pre_allocation_leaves_allocations_per_add_and_no_gc_work():
    """'Avoids GC pressure from intermediate allocations': a rollout's adds into the
    pre-allocated buffer still allocate (a 0-d tensor for each Python number written:
    lift of the value), and Python's cycle collector has nothing of theirs to collect:
    tensors are freed by reference counting, not by the GC."""
    buffer = original_buffer()
    steps = rollout_steps(4, 25, CPU, 0)
    adds = 4 * 25
    counted = profile_call(lambda: fill(buffer, steps))
    assert counted.allocations >= adds  # at least one small allocation per add
    gc.collect()
    before = gc.get_count()[0]
    gc.disable()
    try:
        fill(buffer, steps)
        tracked = gc.get_count()[0] - before  # container objects created and still alive
    finally:
        gc.enable()
    assert tracked < adds  # no GC-tracked garbage per add to speak of


def test_audit_4_2_a_zeroing_reset_would_be_one_op_per_field_not_per_element():
    """'This saves N * M * tensor_size zero operations per reset': zeroing the buffer is
    one `zero_` per stored tensor (34 here: 10 fields and 8 x 3 per-head ones), writing
    its 205,300 bytes; the reviewed reset runs no op at all."""
    buffer = original_buffer()
    fill(buffer, rollout_steps(4, 25, CPU, 0))
    fields = stored_tensors(buffer)
    zeroing = profile_call(lambda: [t.zero_() for t in fields]).ops
    assert zeroing == {"aten::zero_": 34}
    assert profile_call(buffer.reset).op_calls == 0


def test_audit_5_2_a_batch_of_two_hidden_states_fails_loudly():
    """'squeeze(1) ... would fail silently if batch size > 1': the squeeze is a no-op on
    [L, 2, H], and the write of [L, 2, H] into a [L, H] cell raises RuntimeError."""
    buffer = original_buffer()
    host_masks, adds, _ = rollout_steps(4, 1, CPU, 0)[0]
    add = {**adds[0], "hidden_h": torch.zeros(1, 2, HIDDEN), "hidden_c": torch.zeros(1, 2, HIDDEN)}
    counts = [0] * 4
    masks = {h: m[0] for h, m in host_masks.items()}
    with pytest.raises(RuntimeError, match="must match the existing size"):
        original_add_writes(buffer, counts, masks=masks, **add)


def test_audit_1_3_each_to_is_a_node_of_dynamo_s_graph_and_none_of_aten_s():
    """'Each .to() is a separate op in the graph': under torch.compile the reviewed read is
    one graph (no break) with one `to` node per field (33); lowered to aten (what
    inductor compiles), a `.to()` to the tensor's own device is no op at all."""
    buffer = original_buffer()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(lambda: buffer.get_batched_sequences(CPU), backend=keep)()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    calls = [n for n in graphs[0].graph.nodes if n.op == "call_method"]
    assert sum(n.target == "to" for n in calls) == 33

    def read(states, hidden_h):
        return (states.to(CPU, non_blocking=False),
                hidden_h[:, 0, :, :].permute(1, 0, 2).contiguous().to(CPU, non_blocking=False))

    aten = make_fx(read)(buffer.states, buffer.hidden_h)
    targets = [str(n.target) for n in aten.graph.nodes if n.op == "call_function"]
    assert targets == ["aten.select.int", "aten.permute.default", "aten.clone.default"]


def test_p3_the_accumulators_are_reused_and_an_int64_count_allocates_per_batch():
    """'Pre-allocated accumulators reuse tensor memory': zeroing them is in place (no
    allocation), and each batch's add into them allocates once: the int64 correct count
    (vectorized.py:718-719 @2df957ed) is cast to float32 for the add."""
    train_loss_accum, train_correct_accum = torch.zeros(1), torch.zeros(1)
    loss, correct = torch.rand(()), torch.randint(0, 128, ())

    def zero_accumulators():  # parallel_env_state.py:96-99 @2df957ed, the two train ones
        train_loss_accum.zero_()
        train_correct_accum.zero_()

    def add_batch():  # vectorized.py:1199-1200
        train_loss_accum.add_(loss)
        train_correct_accum.add_(correct)

    assert profile_call(zero_accumulators).allocations == 0
    added = profile_call(add_batch)
    assert added.allocations == 1 and added.ops["aten::_to_copy"] == 1


def test_the_heads_of_the_buffer_are_the_reviewed_eight():
    """The byte count above assumes 599f3895's action space."""
    assert HEAD_NAMES == ("slot", "blueprint", "style", "tempo", "alpha_target", "alpha_speed",
                          "alpha_curve", "op")
    assert sum(HEAD_SIZES.values()) == 39
