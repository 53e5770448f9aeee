"""Every finding's baseline is the reviewed code, op for op.

For each finding, its own baseline call, made exactly as the finding makes it (its
`build` and `make_call`, defaults included), is profiled beside a transcription of the
reviewed lines (re-typed here or in the test module named, from esper-lite at the commit
the finding names) on the same inputs: the same aten ops (each op's count), the same host
reads (`aten::_local_scalar_dense`) and the same allocations.

What these cannot prove: on CUDA, that the copies the CPU sees as no-op `.to()` calls
move what they move there (the findings' CUDA rows count `host_to_device_copies`), and,
for H1 and the long findings (C1, C3, TL-bootstrap, C2), anything: their baselines are
whole environments and episodes of a host network that is not esper-lite's, so there is
no transcription to hold them to (docs/findings.md says so per finding).
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from esper.agent.heads import HEAD_NAMES
from esper.training.trainer import TrainConfig, VectorizedTrainer
from esper.variants import Variants
from harness import findings as registry
from harness.findings import Case
from harness.measure.counters import profile_call
from esper_review.findings.buffer_layout import Storage, evaluate_batch
from esper_review.findings.gae_methods import GAMMA, LAMBDA
from tests.esper.env.test_bootstrap_states import original_bootstrap
from tests.esper.env.test_mask_batch import original_masks_batch
from tests.esper.gae.test_loop_reads import original_gae
from tests.esper.rollout.test_add_checks import original_add_writes

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


def finding(finding_id: str) -> registry.Finding:
    return registry.select([finding_id], include_long=True)[0]


def baseline_call(finding_id: str, case: Case, seed: int = 0):
    """The finding's baseline call on its own inputs, as the run makes it, and the inputs."""
    f = finding(finding_id)
    inputs = f.build(case, CPU, seed)
    return f.make_call(f.baseline, inputs), inputs


def assert_same_counts(ours, reviewed) -> None:
    """One profiled call of each: the same ops (by name and count), host reads and
    allocations."""
    got, want = profile_call(ours), profile_call(reviewed)
    assert got.ops == want.ops, {k: (got.ops.get(k), want.ops.get(k))
                                 for k in set(got.ops) | set(want.ops)
                                 if got.ops.get(k) != want.ops.get(k)}
    assert (got.host_syncs, got.allocations) == (want.host_syncs, want.allocations)


# ----- the rollout buffer (599f3895 src/esper/simic/agent/rollout_buffer.py) -------------

def original_get_batched_sequences(buffer, step_counts: list[int], device) -> dict:
    """esper-lite 599f3895 rollout_buffer.py:454-504 (`get_batched_sequences`), verbatim
    but for `self.` and the 8 heads' fields, read from dicts keyed by head name in the
    original's order (slot, blueprint, style, tempo, alpha_target, alpha_speed,
    alpha_curve, op). tamiyo_buffer.py:344-382 @181a4c41 is the same with 4 heads."""
    device = torch.device(device) if isinstance(device, str) else device

    # Build valid mask - vectorized (avoids Python loop)
    # step_idx < step_counts[env_id] using broadcasting
    step_counts_tensor = torch.tensor(step_counts, device=device).unsqueeze(1)
    step_indices = torch.arange(buffer.max_steps, device=device).unsqueeze(0)
    valid_mask = step_indices < step_counts_tensor  # [num_envs, max_steps]

    # Use non_blocking=True for async CPU->GPU transfer (overlaps with computation)
    # This only helps when transferring TO CUDA - CPU transfers ignore it
    nb = device.type == "cuda"

    return {
        "states": buffer.states.to(device, non_blocking=nb),
        **{f"{h}_actions": buffer.actions[h].to(device, non_blocking=nb) for h in HEAD_NAMES},
        **{f"{h}_log_probs": buffer.log_probs[h].to(device, non_blocking=nb) for h in HEAD_NAMES},
        "values": buffer.values.to(device, non_blocking=nb),
        "rewards": buffer.rewards.to(device, non_blocking=nb),
        "advantages": buffer.advantages.to(device, non_blocking=nb),
        "returns": buffer.returns.to(device, non_blocking=nb),
        **{f"{h}_masks": buffer.masks[h].to(device, non_blocking=nb) for h in HEAD_NAMES},
        "hidden_h": buffer.hidden_h.to(device, non_blocking=nb),
        "hidden_c": buffer.hidden_c.to(device, non_blocking=nb),
        "valid_mask": valid_mask,
        # Initial hidden states for each env (first timestep)
        "initial_hidden_h": buffer.hidden_h[:, 0, :, :].permute(1, 0, 2).contiguous().to(device, non_blocking=nb),
        "initial_hidden_c": buffer.hidden_c[:, 0, :, :].permute(1, 0, 2).contiguous().to(device, non_blocking=nb),
    }


def storage_of(buffer) -> types.SimpleNamespace:
    """Tensors shaped as a buffer's (the original's own would be separate per head), for
    the transcriptions to write into and read from: what they cost does not depend on
    where the tensors came from."""
    names = ("states", "values", "rewards", "advantages", "returns", "dones", "truncated",
             "bootstrap_values", "hidden_h", "hidden_c")
    return types.SimpleNamespace(
        **{name: getattr(buffer, name).clone() for name in names},
        **{kind: {h: t.clone() for h, t in getattr(buffer, kind).items()}
           for kind in ("actions", "log_probs", "masks")},
        max_steps=buffer.max_steps)


def reviewed_rollout(storage, steps: list, step_counts: list[int]) -> None:
    """`reset()` (506-511: the counts set to 0, no tensor zeroed), then every add() of a
    rollout (`original_add_writes`, 295-345), with each env's masks as the finding's
    `fill` hands them over on the CPU."""
    step_counts[:] = [0] * len(step_counts)
    for _, adds, cpu_rows in steps:
        for add, env_masks in zip(adds, cpu_rows):
            original_add_writes(storage, step_counts, masks=env_masks, **add)


def test_b4_pt_05_list_is_the_reviewed_adds_reset_and_read():
    """B4-PT-05's `list` call: reset, a rollout's adds, get_batched_sequences."""
    case = Case.of(num_envs=4, max_steps=25)
    call, inputs = baseline_call("B4-PT-05", case)
    storage, counts = storage_of(inputs["buffers"]["list"]), [0] * 4

    def reviewed():
        reviewed_rollout(storage, inputs["steps"], counts)
        return original_get_batched_sequences(storage, counts, CPU)

    assert_same_counts(call, reviewed)
    got, want = call(), reviewed()
    assert torch.equal(got["valid_mask"], want["valid_mask"])
    assert torch.equal(got["states"], want["states"])
    assert torch.equal(got["masks"]["op"], want["op_masks"])


def test_audit_5_1_none_is_the_reviewed_adds():
    case = Case.of(num_envs=4, max_steps=25)
    call, inputs = baseline_call("AUDIT-5.1-add-checks", case)
    storage, counts = storage_of(inputs["buffers"]["none"]), [0] * 4
    assert_same_counts(call, lambda: reviewed_rollout(storage, inputs["steps"], counts))


def test_audit_1_3_per_tensor_is_the_reviewed_read():
    """On the CPU the run skips the cell (`needs CUDA`), and every `.to()` here returns
    its tensor: the ops are the reviewed lines', the copies they make on CUDA are not
    seen."""
    case = Case.of(num_envs=4, max_steps=25)
    f = finding("AUDIT-1.3-batched-transfer")
    assert f.skip("per_tensor", case, CPU) == "needs CUDA"
    call, inputs = baseline_call(f.id, case)
    buffer = inputs["buffers"]["per_tensor"]
    storage = storage_of(buffer)
    counts = [buffer.step_count(e) for e in range(buffer.num_envs)]
    assert_same_counts(call, lambda: original_get_batched_sequences(storage, counts, CPU))


@pytest.mark.parametrize("part", ["read", "writes", "evaluate"])
def test_audit_4_3_env_major_is_the_reviewed_read_writes_and_the_policy(part):
    """read: get_batched_sequences' lines on the env-major fields; writes: the reviewed
    add's writes; evaluate: that read, then esper's policy forward (the network is
    esper's, not a transcription: its ops are counted on the read's batch)."""
    case = Case.of(num_envs=4, max_steps=25, part=part)
    call, inputs = baseline_call("AUDIT-4.3-buffer-layout", case)
    fields = inputs["storages"]["env_major"].tensors
    storage = types.SimpleNamespace(
        **{name: fields[name].clone() for name in ("states", "values", "rewards",
                                                   "advantages", "returns", "dones",
                                                   "truncated", "bootstrap_values",
                                                   "hidden_h", "hidden_c")},
        **{kind: {h: fields[f"{kind}/{h}"].clone() for h in HEAD_NAMES}
           for kind in ("actions", "log_probs", "masks")},
        max_steps=case["max_steps"])
    counts = [case["max_steps"]] * case["num_envs"]
    if part == "writes":
        written = [0] * case["num_envs"]
        adds = [(None, [dict(add, env_id=env) for env, add in enumerate(envs)], None)
                for envs in inputs["steps"]]

        def reviewed():
            for _, step_adds, _ in adds:
                for add in step_adds:
                    original_add_writes(storage, written, **add)
            written[:] = [0] * case["num_envs"]
    elif part == "read":
        def reviewed():
            return original_get_batched_sequences(storage, counts, CPU)
    else:
        policy = inputs["policies"]["env_major"]
        batch = Storage("env_major", 4, 25, CPU).read(CPU)
        network = profile_call(lambda: evaluate_batch(policy, batch))
        read = profile_call(lambda: original_get_batched_sequences(storage, counts, CPU))
        got = profile_call(call)
        assert got.ops == {k: read.ops.get(k, 0) + network.ops.get(k, 0)
                           for k in set(read.ops) | set(network.ops)}
        return
    assert_same_counts(call, reviewed)


# ----- GAE (599f3895 rollout_buffer.py:367-416) ---------------------------------------

@pytest.mark.parametrize("finding_id", ["B4-CR-03", "B4-DRL-03"])
@pytest.mark.parametrize("dones", ["episode", "random0.05"])
def test_the_gae_baselines_are_the_reviewed_loop(finding_id, dones):
    """The reviewed loop with the counts as a Python list: 3 host reads per step of an
    episode (4 at a true terminal), a clone per env and per true terminal. B4-CR-03's
    call passed no `reset` before, so it ran the restructured loop (204 reads, 717
    allocations at 4 x 25, against the original's 300 and 1,117)."""
    case = Case.of(num_envs=4, max_steps=25, dones=dones)
    call, inputs = baseline_call(finding_id, case)

    def reviewed():
        return original_gae(inputs["values"], inputs["rewards"], inputs["dones"],
                            inputs["truncated"], inputs["bootstrap_values"],
                            inputs["step_counts_list"], CPU, GAMMA, LAMBDA)[0]

    assert_same_counts(call, reviewed)
    torch.testing.assert_close(call(), reviewed(), rtol=0, atol=1e-6)
    if dones == "episode":
        counted = profile_call(call)
        assert (counted.host_syncs, counted.ops["aten::clone"]) == (300, 4)


def test_e2e_original_runs_the_reviewed_gae_and_read_on_its_own_rollout():
    """E2E-iteration's `original` trainer, after a rollout: its buffer's GAE and its
    update's read are the reviewed lines op for op on what it stored. (The rest of the
    iteration, envs and policy, is esper's own: docs/differences.md.)"""
    f = finding("E2E-iteration")
    assert f.baseline == "original" and f.variants == ("original", "reviews", "ours")
    config = TrainConfig(num_envs=2, max_steps=4, seed=3, variants=Variants.original(),
                         hidden_dim=32)
    trainer = VectorizedTrainer(config, CPU)
    trainer.rollout()
    buffer, ppo = trainer.buffer, config.ppo
    counts = [buffer.step_count(e) for e in range(buffer.num_envs)]
    storage = storage_of(buffer)

    def reviewed_gae():
        return original_gae(storage.values, storage.rewards, storage.dones, storage.truncated,
                            storage.bootstrap_values, counts, CPU, ppo.gamma, ppo.gae_lambda)

    assert_same_counts(lambda: buffer.compute_advantages_and_returns(ppo.gamma, ppo.gae_lambda),
                       reviewed_gae)
    assert_same_counts(lambda: buffer.get_batched_sequences(CPU),
                       lambda: original_get_batched_sequences(storage, counts, CPU))


# ----- the vectorized trainer (2df957ed src/esper/simic/training/vectorized.py) ----------

def test_l1_inference_mode_is_the_reviewed_validation_lines():
    """vectorized.py:1063-1076 with `loss_and_correct` (707-720), the classification
    branch, on the env's host, its slots and its validation data."""
    call, envs = baseline_call("L1-inference-mode", Case.of(val_size=64))
    env = envs["inference_mode"]
    _, _, val_x, val_y = env.task
    criterion = nn.CrossEntropyLoss()

    def reviewed():
        inputs = val_x.to(env.device, non_blocking=True)
        targets = val_y.to(env.device, non_blocking=True)
        if env.stream and inputs.is_cuda:
            inputs.record_stream(env.stream)
            targets.record_stream(env.stream)
        model = env.host_network
        model.eval()
        with torch.inference_mode():
            outputs = model(inputs, env.slots)  # `model(inputs)`: esper's host takes its slots
            loss = criterion(outputs, targets)
            _, predicted = outputs.max(1)
            correct = predicted.eq(targets).sum()
            total = targets.size(0)
        return loss, correct, total

    assert_same_counts(call, reviewed)
    assert [float(v) for v in call()] == [float(v) for v in reviewed()]


def test_h2_is_cuda_is_the_reviewed_guard():
    """939-941: `if env_state.stream and inputs.is_cuda:`; no aten op either way."""
    call, inputs = baseline_call("H2-redundant-is-cuda", Case.of(batch_size=128))
    stream, batch = inputs["stream"], inputs["inputs"]
    assert_same_counts(call, lambda: bool(stream and batch.is_cuda))
    assert call() is bool(stream and batch.is_cuda)


def test_h4_tensor_is_the_reviewed_bootstrap():
    """1954-1973 (`original_bootstrap`, tests/esper/env/test_bootstrap_states.py)."""
    call, inputs = baseline_call("H4-bootstrap-tensor", Case.of(num_envs=4))
    normalizer = types.SimpleNamespace(normalize=inputs["normalize"])

    def reviewed():
        return original_bootstrap(inputs["features"], normalizer, inputs["policy"],
                                  inputs["hidden"], inputs["masks"], CPU)

    assert_same_counts(call, reviewed)
    assert torch.equal(call(), reviewed())


def test_h5_stack_is_the_reviewed_masks():
    """1553-1571 with action_masks.py:122-172 (`original_masks_batch`,
    tests/esper/env/test_mask_batch.py), on the finding's envs."""
    call, inputs = baseline_call("H5-mask-stacking", Case.of(num_envs=4))
    assert_same_counts(call, lambda: original_masks_batch(inputs["envs"], CPU))


def test_l2_separate_is_the_reviewed_adds():
    """1197-1200 into [1] float32 accumulators (parallel_env_state.py:88-89), the count
    an int64 as loss_and_correct returns it."""
    call, inputs = baseline_call("L2-fused-accumulators", Case.of(values="0-d"))
    loss_tensor, correct_tensor = inputs["loss"], inputs["correct"]
    assert correct_tensor.dtype == torch.int64 and loss_tensor.dtype == torch.float32
    train_loss_accum = torch.zeros(1)
    train_correct_accum = torch.zeros(1)

    def reviewed():
        train_loss_accum.add_(loss_tensor)
        train_correct_accum.add_(correct_tensor)

    assert_same_counts(call, reviewed)


def test_h3_stream_makes_the_reviewed_syncs_and_reads_on_stand_in_streams(monkeypatch):
    """1162-1240 and 1272-1375: per env step, each env stream synchronized once after
    training and once after validation, two reads per env after each (the counts
    tests/esper/training/test_stream_races.py derives from those lines), on the finding's
    own `stream` trainer given stand-in streams. It cannot prove what the syncs cost on
    a GPU, which only a CUDA run measures."""
    from tests.esper.training.test_stream_races import HostReads, StreamRaceChecker

    call, trainers = baseline_call("H3-stream-sync", Case.of(num_envs=4))
    checker = StreamRaceChecker()
    checker.install(monkeypatch)
    trainer = trainers["stream"]
    trainer.streams = [checker.new_stream() for _ in range(4)]
    with HostReads(checker), checker:
        call()
    assert checker.summary() == []
    assert checker.calls["synchronize"] == 2 * 4 and checker.calls["host_read"] == 4 * 4


# ----- M6: the reviewed setup loop and advance_stage --------------------------------

def test_m6_setup_advances_a_slot_as_the_reviewed_advance_stage():
    """The finding's `setup_inline` is the transcription (graph_breaks.py): one call
    advances the germinated slot through the G1 gate to TRAINING, isolates its
    gradients and hands two telemetry events, with the env's context added, to the
    hub (kasmina/slot.py:975-1009, vectorized.py:792-798 @2df957ed); the empty and the
    training slots are left alone. Under dynamo the events' uuid4 ids and timestamps
    break the graph, which the stand-in of one assignment did not."""
    from esper_review.findings import graph_breaks as m6

    model = m6.HostModel()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(8, m6.WIDTH, generator=g)
    targets = torch.randint(0, m6.WIDTH, (8,), generator=g)
    m6.train_batch_inline(model, inputs, targets, m6.SLOTS)
    slots = model.seed_slots
    assert slots[m6.SLOTS[0]].state.stage == m6.SeedStage.TRAINING
    assert slots[m6.SLOTS[0]].isolate_gradients
    assert slots[m6.SLOTS[1]].state is None
    assert slots[m6.SLOTS[2]].state.stage == m6.SeedStage.TRAINING
    assert [e.event_type for e in model.telemetry] == ["SEED_GATE_EVALUATED",
                                                        "SEED_STAGE_CHANGED"]
    gate = model.telemetry[0].data
    assert (gate["gate"], gate["passed"], gate["env_id"], gate["device"]) == ("G1", True, 0, "cpu")
    if torch._dynamo.is_dynamo_supported():
        counted = m6.graph_breaks(m6._call("setup_inline", 4))
        assert counted["breaks"] >= 1, counted


def test_every_finding_with_a_review_fix_proposes_it():
    """The headline variant is the review's fix wherever the review wrote one; this
    project's designs are named extras."""
    proposed = {f.id: f.proposed for f in registry.select(None, include_long=True)}
    assert proposed["B4-CR-03"] == "batched" and proposed["B4-DRL-03"] == "mask"
    assert proposed["B4-PT-05"] == "tensor" and proposed["AUDIT-5.1-add-checks"] == "mask_shapes"
    assert proposed["AUDIT-4.3-buffer-layout"] == "time_major"
    assert proposed["AUDIT-1.3-batched-transfer"] == "flat"
    assert proposed["E2E-iteration"] == "reviews" and proposed["H1-env-pooling"] == "checkpoint"
    assert proposed["H4-bootstrap-tensor"] == "copy"
    assert proposed["H5-mask-stacking"] == "preallocated"
    assert proposed["L2-fused-accumulators"] == "stacked"
    assert proposed["H2-redundant-is-cuda"] == "stream"
    for f in registry.select(None, include_long=True):
        assert f.proposed not in f.ours, f.id
        assert (f.proposed is not None) == bool(f.about.fix), f.id


def test_the_b4_cr_03_fix_is_the_ticket_s_loop_and_ours_stay_extras():
    """`batched` runs the ticket's per-step expression: per step one select of the
    trace-ends, `1 - ends[:, t]`, two multiplies, an add and a write; `addcmul` (ours)
    one addcmul."""
    f = finding("B4-CR-03")
    assert "batched" not in f.ours and {"addcmul", "scan"} <= set(f.ours)
    inputs = f.build(Case.of(num_envs=4, max_steps=25, dones="episode"), CPU, 0)
    fix = profile_call(f.make_call("batched", inputs)).ops
    ours = profile_call(f.make_call("addcmul", inputs)).ops
    assert fix["aten::rsub"] >= 25 and fix["aten::mul"] >= 2 * 25
    assert ours["aten::addcmul"] == 25 and "aten::rsub" not in ours
